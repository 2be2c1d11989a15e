"""The chaos checker on hand-made histories: a history that keeps every rule passes, and each rule
catches a history that breaks it (and only that rule fires). The histories are written as a run writes
them (:mod:`tests.unit.chaos.story`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from chaos.checker import Verdict, check, percentile
from chaos.history import TERMINAL

from .story import SHARD_A, Story

A1, A2, A3 = SHARD_A + 1, SHARD_A + 2, SHARD_A + 3
B1 = (2 << 56) + 1
ROOT = Path(__file__).resolve().parents[3]


def verdict(story: Story) -> Verdict:
    return check(story.sorted())


def rules(story: Story) -> list[str]:
    return sorted({v.rule for v in verdict(story).violations})


def test_a_history_that_keeps_every_rule_passes() -> None:
    story = Story()
    story.simple(1, A1, key="k1")
    story.submit(2, A1, key="k1", duplicate=True)  # the key again: the same task
    story.submit(3, A2, deps=[[A1, "success"]])
    story.lease(3.5, A2)
    story.final(
        100, A2, output={"task": A2, "attempt": 1, "worker": "w1", "pid": 100, "session": 1, "lease": 2}
    )
    story.submit(4, A3, start_at=6.0)
    ident = story.lease(6.2, A3, outcome="permanent")
    story.final(100, A3, "failed", output=ident)
    found = verdict(story)
    assert found.violations == [], found.violations
    assert found.stats["acknowledged"] == 3 and found.stats["lost"] == 0 and found.stats["stale"] == 0


def test_lost_an_acknowledged_task_the_cluster_no_longer_knows() -> None:
    story = Story()
    story.submit(1, A1)
    story.final(100, A1, found=False)
    found = verdict(story)
    assert rules(story) == ["lost"] and found.stats["lost"] == 1


def test_unverified_when_the_run_could_not_read_an_acknowledged_task() -> None:
    story = Story()
    story.submit(1, A1)
    story.final(100, A1, found=None)
    assert rules(story) == ["unverified"]


def test_live_a_task_still_queued_after_the_drain() -> None:
    story = Story()
    story.submit(1, A1)
    story.final(100, A1, "ready")
    assert rules(story) == ["live"]


def test_live_is_no_violation_while_a_dependency_is_still_live() -> None:
    story = Story()
    story.submit(1, A1)
    story.final(100, A1, "scheduled")  # a fixed start far ahead: live for that reason
    story.submit(2, A2, deps=[[A1, "success"]])
    story.final(100, A2, "blocked")
    assert rules(story) == ["live"]  # A1 is live without a reason; A2 waits for it
    assert [v.task for v in verdict(story).violations] == [A1]


def test_outcome_changed_an_answered_success_later_told_otherwise() -> None:
    story = Story()
    story.submit(1, A1)
    ident = story.lease(1.1, A1)
    story.call(2, "wait", A1, status="succeeded", output=ident, message="")
    story.final(100, A1, "dead_lettered")
    assert rules(story) == ["outcome-changed"]


def test_outcome_changed_an_answered_output_of_another_lease() -> None:
    story = Story()
    first = story.lease(1.1, A1)
    story.submit(2, A1, result={"status": "succeeded", "output": first, "message": ""}, wait=True)
    story.fault(2.5, 1, "kill-worker", "w1")  # explains the second run, not the changed answer
    second = story.lease(3, A1, 2)
    story.final(100, A1, output=second)
    assert "outcome-changed" in rules(story)


def test_cancel_lost_a_cancel_answered_true_whose_task_succeeded() -> None:
    story = Story()
    story.submit(1, A1)
    story.call(1.5, "cancel", A1, cancelled=True)
    ident = story.lease(2, A1)
    story.final(100, A1, output=ident)
    assert rules(story) == ["cancel-lost"]


@pytest.mark.parametrize("case", ["no-such-lease", "another-task", "reported-otherwise"])
def test_unknown_outcome(case: str) -> None:
    story = Story()
    story.submit(1, A1)
    ident = story.lease(1.1, A1, outcome="retry" if case == "reported-otherwise" else "complete")
    if case == "no-such-lease":
        ident = {**ident, "lease": 99}
    elif case == "another-task":
        story.simple(2, A2)
        ident = {**ident, "task": A2}
    story.final(100, A1, output=ident)
    assert rules(story) == ["unknown-outcome"]


def test_stale_attempt_an_outcome_reported_after_the_task_was_leased_again() -> None:
    story = Story()
    story.submit(1, A1)
    story.fault(1.5, 1, "pause-worker", "w1", heal=9)  # explains the second lease
    first = story.lease(2, A1, worker="w1", reported=10)  # paused, its report comes late
    story.lease(8, A1, 2, worker="w2")
    story.final(100, A1, output=first)
    found = verdict(story)
    assert rules(story) == ["stale-attempt"] and found.stats["stale"] == 1
    assert found.stats["run_twice"] == 1


def test_stale_leader_an_outcome_reported_after_the_shard_was_taken_over() -> None:
    story = Story()
    story.role(0, "a1", "leading", None)
    story.role(0, "a2", "standby", None)
    story.submit(1, A1)
    ident = story.lease(2, A1, reported=20)
    story.role(3, "a1", "silent", 2.8)  # paused: silent says nothing of its role
    story.role(14, "a2", "leading", 13.8)  # a2 was seen standing by at 13.8: it took over after
    story.fault(2.9, 1, "pause-leader", "a1", shards=("a",), heal=19)
    story.final(100, A1, output=ident)
    assert rules(story) == ["stale-leader"]


def test_a_leader_seen_silent_then_leading_again_did_not_take_over() -> None:
    story = Story()
    story.role(0, "a1", "leading", None)
    story.submit(1, A1)
    ident = story.lease(2, A1, reported=20)
    story.role(3, "a1", "silent", 2.8)
    story.role(14, "a1", "leading", 13.8)
    story.final(100, A1, output=ident)
    assert rules(story) == []


def test_rerun_a_task_leased_again_with_no_fault_to_explain_it() -> None:
    story = Story()
    story.submit(1, A1)
    story.lease(2, A1, outcome=None)  # no report, and nothing happened
    ident = story.lease(9, A1, 2, worker="w2")
    story.final(100, A1, output=ident)
    assert rules(story) == ["rerun"]


@pytest.mark.parametrize(
    ("kind", "process", "shards"),
    [
        ("kill-worker", "w1", ()),  # the attempt's own worker
        ("restart-postgres", "postgres", ("a", "b")),  # its shard's store
        ("cut-link", "link:a", ("a",)),
        ("exit", "w1", ()),  # its worker exited on its own (below)
        ("exit", "a1", ()),  # a server of its shard did
    ],
)
def test_a_rerun_a_fault_explains_is_counted_not_flagged(
    kind: str, process: str | None, shards: tuple[str, ...]
) -> None:
    story = Story()
    story.submit(1, A1)
    story.lease(2, A1, outcome=None)
    if kind == "exit":
        story.add("exit", 3, process=process, code=1)
        story.add("restart", 4, process=process)
    else:
        story.fault(3, 1, kind, process, shards=shards, heal=4)
    ident = story.lease(9, A1, 2, worker="w2")
    story.final(100, A1, output=ident)
    found = verdict(story)
    assert found.violations == [] and found.stats["run_twice"] == 1 and found.stats["reruns"] == 1


def test_a_fault_on_another_worker_or_the_router_explains_no_rerun() -> None:
    story = Story()
    story.submit(1, A1)
    story.lease(2, A1, worker="w1", outcome=None)
    story.fault(3, 1, "kill-worker", "w2", heal=4)
    story.fault(3, 2, "kill-router", "router", heal=4)
    ident = story.lease(9, A1, 2, worker="w2")
    story.final(100, A1, output=ident)
    assert rules(story) == ["rerun"]


def test_leases_are_judged_in_attempt_order_not_in_the_order_a_paused_worker_wrote_them() -> None:
    """A worker paused with a lease on it records the lease when it resumes, after the attempts that
    ran elsewhere meanwhile: the second attempt is still what follows the first."""
    story = Story()
    story.submit(1, A1)
    story.fault(1.5, 1, "pause-worker", "w2", heal=20)
    story.lease(20, A1, 1, worker="w2", outcome="aborted", reported=20.01)  # dispatched at 2, seen at 20
    ident = story.lease(7, A1, 2, worker="w1")
    story.final(100, A1, output=ident)
    found = verdict(story)
    assert found.violations == [] and found.stats["run_twice"] == 1
    # and an outcome of the paused attempt, had it been accepted, came after the second one began
    stale = Story()
    stale.submit(1, A1)
    stale.fault(1.5, 1, "pause-worker", "w2", heal=20)
    first = stale.lease(20, A1, 1, worker="w2", reported=20.5)
    stale.lease(7, A1, 2, worker="w1")
    stale.final(100, A1, output=first)
    assert rules(stale) == ["stale-attempt"]


def test_a_rerun_after_a_hung_handler_is_explained_by_the_hang() -> None:
    story = Story()
    story.submit(1, A1)
    story.lease(2, A1, outcome="aborted", reported=6, hung=True)
    ident = story.lease(6.5, A1, 2)
    story.final(100, A1, output=ident)
    found = verdict(story)
    assert found.violations == [] and found.stats["reruns_hung"] == 1


def test_retries_on_purpose_are_no_reruns_and_wait_for_retry_after() -> None:
    story = Story()
    story.submit(1, A1, fail=1, max_attempts=3)
    story.lease(2, A1, outcome="retry", reported=2.1, retry_after_s=0.3)
    ident = story.lease(2.5, A1, 2)
    story.final(100, A1, output=ident)
    assert verdict(story).violations == [] and verdict(story).stats["reruns"] == 0
    early = Story()
    early.submit(1, A1, fail=1, max_attempts=3)
    early.lease(2, A1, outcome="retry", reported=2.1, retry_after_s=0.3)
    ident = early.lease(2.2, A1, 2)
    early.final(100, A1, output=ident)
    assert rules(early) == ["retry-early"]


def test_attempts_beyond_max_attempts() -> None:
    story = Story()
    story.submit(1, A1, fail=2, max_attempts=2)
    story.lease(2, A1, outcome="retry", reported=2.1)
    story.lease(3, A1, 2, outcome="retry", reported=3.1)
    ident = story.lease(4, A1, 3)
    story.final(100, A1, output=ident)
    assert rules(story) == ["attempts"]


def test_stuck_a_task_listed_running_past_its_bound() -> None:
    story = Story()
    story.submit(1, A1)
    story.lease(2, A1, outcome=None)
    # timeout 4 + TTL 5 + takeover 12 + grace 3 = 24 s
    story.add("running", 20, tasks=[[A1, 1, 1002.0]])
    story.add("running", 30, tasks=[[A1, 1, 1002.0]])
    story.final(100, A1, "running", started_at=1002.0)
    found = verdict(story)
    assert rules(story) == ["stuck"] and found.stats["stuck"] == 1
    assert len(found.violations) == 1  # once per task


def test_stuck_allows_for_the_time_a_fault_held_the_shard() -> None:
    story = Story()
    story.submit(1, A1)
    story.fault(3, 1, "cut-link", "link:a", shards=("a",), pools=("pa",), heal=13)
    story.add("running", 30, tasks=[[A1, 1, 1002.0]])  # 28 s: 24 s plus the cut's 10 s (and a grace)
    ident = story.lease(2, A1, reported=31)
    story.final(100, A1, output=ident)
    assert rules(story) == []


def test_keys_one_task_per_key_and_shard() -> None:
    story = Story()
    story.simple(1, A1, key="k")
    story.simple(2, A2, key="k")
    assert rules(story) == ["key"]


def test_keys_a_duplicate_must_name_a_task_with_that_key() -> None:
    story = Story()
    story.simple(1, A1, key="k")
    story.simple(2, A2, key="j")
    story.submit(3, A2, key="k", duplicate=True)
    assert rules(story) == ["key"]


def test_keys_a_task_is_new_only_once() -> None:
    story = Story()
    story.simple(1, A1, key="k")
    story.submit(2, A1, key="k")  # answered as new again
    assert rules(story) == ["key"]


def test_keys_on_two_shards_only_where_the_other_could_not_be_asked() -> None:
    story = Story()
    story.simple(1, A1, key="k")
    story.simple(20, B1, key="k", pool="pb", worker="w3")
    assert rules(story) == ["key"]
    explained = Story()
    explained.simple(1, A1, key="k")
    explained.fault(18, 1, "pause-leader", "a1", shards=("a",), pools=("pa",), heal=30)
    explained.simple(20, B1, key="k", pool="pb", worker="w3")
    found = verdict(explained)
    assert found.violations == [] and found.stats["key_splits"] == 1


def test_keys_a_lost_task_is_on_the_shard_its_id_names() -> None:
    """A duplicate answer naming a task the cluster no longer knows: the key is then answered with a
    task of each shard, with nothing to explain it."""
    story = Story()
    story.simple(1, A1, key="k")
    story.submit(2, B1, pool="pa", key="k", duplicate=True)
    story.final(100, B1, found=False)
    assert rules(story) == ["key", "lost"]
    assert "held on shards ['a', 'b']" in next(str(v) for v in verdict(story).violations if v.rule == "key")


def test_dependency_leased_before_its_parent_was_decided() -> None:
    story = Story()
    story.submit(1, A1)
    parent = story.lease(2, A1, reported=5)
    story.final(100, A1, output=parent)
    story.submit(3, A2, deps=[[A1, "complete"]])
    child = story.lease(4, A2)
    story.final(100, A2, output=child)
    assert rules(story) == ["dependency"]


def test_dependency_on_a_cancelled_task_is_decided_by_the_cancel_not_by_a_late_lease_record() -> None:
    """Seed 5: the parent was leased to a worker that recorded the lease only when it resumed, after the
    parent had been cancelled and its dependent had run; the cancel is what decided it."""
    story = Story()
    story.submit(1, A1)
    story.call(1.5, "cancel", A1, cancelled=True)
    story.lease(9, A1, outcome="aborted", reported=9.01)  # dispatched at 1.01, seen at 9
    story.final(100, A1, "cancelled", started_at=1001.01)
    story.submit(2, A2, deps=[[A1, "complete"]])
    story.final(100, A2, output=story.lease(2.1, A2))
    assert rules(story) == []
    early = Story()  # a dependent that began before the cancel was even sent
    early.submit(1, A1)
    early.submit(1.2, A2, deps=[[A1, "complete"]])
    early.final(100, A2, output=early.lease(1.3, A2))
    early.call(1.5, "cancel", A1, cancelled=True)
    early.final(100, A1, "cancelled")
    assert rules(early) == ["dependency"]


def test_dependency_by_key_resolves_on_the_dependents_shard() -> None:
    story = Story()
    story.submit(1, A1, key="parent")
    parent = story.lease(2, A1, reported=5)
    story.final(100, A1, output=parent, key="parent")
    story.submit(3, A2, deps=[["parent", "success"]])
    child = story.lease(4, A2)
    story.final(100, A2, output=child)
    assert rules(story) == ["dependency"]


@pytest.mark.parametrize(("cond", "parent_status"), [("success", "failed"), ("failure", "succeeded")])
@pytest.mark.parametrize("child_ran", [False, True])
def test_dependency_that_can_never_be_met_skips_its_dependent(
    cond: str, parent_status: str, child_ran: bool
) -> None:
    story = Story()
    story.submit(1, A1)
    parent = story.lease(2, A1, outcome="complete" if parent_status == "succeeded" else "permanent")
    story.final(100, A1, parent_status, output=parent)
    story.submit(3, A2, deps=[[A1, cond]])
    if child_ran:
        story.final(100, A2, output=story.lease(4, A2))
    else:
        story.final(100, A2, "skipped")
    found = verdict(story)
    assert [v.rule for v in found.violations] == (["dependency"] * 2 if child_ran else [])  # ran; not skipped


def test_fixed_start_leased_before_its_start() -> None:
    story = Story()
    story.submit(1, A1, start_at=5.0)
    ident = story.lease(4.5, A1)
    story.final(100, A1, output=ident)
    assert rules(story) == ["fixed-start"]


def test_recovery_is_from_a_fault_to_the_first_task_of_its_pools_submitted_after_it() -> None:
    story = Story()
    story.simple(1, A1)
    story.fault(10, 1, "kill-leader", "a1", shards=("a",), pools=("pa",), heal=12)
    story.simple(11, A2)  # submitted at 10.99, began at 11.05
    story.submit(12, A3, start_at=13.0)  # a fixed start: not a plain task, not counted
    story.lease(13, A3)
    story.fault(50, 2, "kill-leader", "a1", shards=("a",), pools=("pa",), heal=51)  # nothing after it
    recovery = verdict(story).stats["recovery"]["kill-leader"]
    assert recovery[0] == pytest.approx(1.05) and recovery[1] is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and percentile([1.0, 9.0], 0.99) == 9.0
    assert percentile([], 0.5) is None


def test_crash_a_process_ended_by_a_signal_the_run_did_not_send() -> None:
    story = Story()
    story.simple(1, A1)
    story.add("exit", 5, process="a2", code=1)  # exited with a status (stepped down for good): reported
    story.add("restart", 6, process="a2")
    assert rules(story) == []
    story.add("exit", 9, process="a1", code=-6)
    story.add("restart", 10, process="a1")
    found = verdict(story)
    assert [str(v) for v in found.violations] == ["crash: a1 ended by SIGABRT at 1009.000"]


def test_the_checker_imports_nothing_of_cronoq() -> None:
    """It judges the server: it must not share its code (the history module is its only input)."""
    for name in ("checker.py", "history.py"):
        tree = ast.parse((ROOT / "chaos" / name).read_text())
        imported = {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        } | {
            node.module or ""
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 0
        }
        assert not {m for m in imported if m.split(".")[0] in ("cronoq", "shard", "router", "common")}, (
            imported
        )


def test_terminal_statuses_are_the_documented_seven() -> None:
    text = (ROOT / "docs" / "scheduling.md").read_text()
    table = text.split("## Task life cycle", 1)[1].split("## Dispatch order", 1)[0]
    documented = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    assert documented - {"blocked", "scheduled", "ready", "running", "retrying"} == TERMINAL
