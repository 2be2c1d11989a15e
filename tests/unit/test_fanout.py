"""Merging fan-out answers (pure functions): paging across shards, snapshots, schedules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronoq.cluster.fanout import (
    PAGE_HEADROOM,
    Answers,
    fit_page,
    merge_pages,
    merge_recurring,
    merge_removed,
    merge_snapshots,
    merge_workers,
    split_list,
)
from cronoq.cluster.shards import Shard, ShardMap
from cronoq.errors import DeadlineExceeded, PermissionDenied, Unauthenticated, Unavailable
from cronoq.v1 import cronoq_pb2 as pb

A = Shard("a", 1, "http://127.0.0.1:1", frozenset({"a1", "a2"}))
B = Shard("b", 2, "http://127.0.0.1:2", frozenset({"b1"}))
SHARDS = ShardMap([A, B])
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def page_of(ids: list[int], after: int, limit: int) -> pb.ListTasksResponse:
    """What one shard answers: its lowest ids after the cursor, and whether more remain."""
    rest = sorted(i for i in ids if i > after)
    page = rest[:limit]
    return pb.ListTasksResponse(
        tasks=[pb.TaskInfo(id=i) for i in page], next_after=page[-1] if len(rest) > limit else 0
    )


@given(
    st.lists(st.integers(1, 10_000), unique=True),
    st.lists(st.integers(1, 10_000), unique=True),
    st.integers(1, 7),
    st.integers(1, 7),
    st.integers(1, 7),
)
def test_paging_through_merged_pages_yields_every_task_once_in_order(
    a_ids: list[int], b_ids: list[int], limit: int, a_cap: int, b_cap: int
) -> None:
    """Each shard may cap its page below ``limit`` (its own ``limits.max_list``); no task is skipped."""
    a_ids = [(1 << 56) | i for i in a_ids]
    b_ids = [(2 << 56) | i for i in b_ids]
    seen: list[int] = []
    after = 0
    for _ in range(len(a_ids) + len(b_ids) + 1):
        a_page, b_page = page_of(a_ids, after, min(limit, a_cap)), page_of(b_ids, after, min(limit, b_cap))
        merged = merge_pages([(A, a_page), (B, b_page)], limit)
        assert len(merged.tasks) <= limit
        seen += [t.id for t in merged.tasks]
        after = merged.next_after
        if after == 0:
            break
    assert seen == sorted(a_ids + b_ids)


@given(st.lists(st.integers(0, 3_000), min_size=1, max_size=40), st.integers(4_096, 40_000))
def test_paging_by_size_yields_every_task_once_and_each_page_fits(sizes: list[int], max_bytes: int) -> None:
    """Tasks whose messages make ``limit`` of them larger than one answer may be (grpc refuses to send
    it): each merged page holds what fits, at least one task, and paging on misses none."""
    texts = {(1 + (i % 2)) << 56 | (i + 1): "m" * size for i, size in enumerate(sizes)}

    def page(shard: int, after: int) -> pb.ListTasksResponse:
        ids = [i for i in texts if i >> 56 == shard]
        answer = page_of(ids, after, 100)
        for info in answer.tasks:
            info.message = texts[info.id]
        return answer

    seen: list[int] = []
    after = 0
    for _ in range(len(texts) + 1):
        merged = fit_page(merge_pages([(A, page(1, after)), (B, page(2, after))], 100), max_bytes)
        assert merged.tasks and (len(merged.tasks) == 1 or merged.ByteSize() <= max_bytes - PAGE_HEADROOM)
        seen += [t.id for t in merged.tasks]
        after = merged.next_after
        if after == 0:
            break
    assert seen == sorted(texts)


def test_a_task_fits_if_it_is_alone_and_a_full_page_is_kept_whole() -> None:
    def fitted(tasks: list[pb.TaskInfo], next_after: int, max_bytes: int) -> tuple[list[int], int]:
        page = fit_page(pb.ListTasksResponse(tasks=tasks, next_after=next_after), max_bytes)
        return [t.id for t in page.tasks], page.next_after

    big = [pb.TaskInfo(id=1, message="m" * 9_000), pb.TaskInfo(id=2)]
    assert fitted(big, 0, 4_096) == ([1], 1)  # alone over the budget: sent, so paging moves on
    small = [pb.TaskInfo(id=i, message="m" * 100) for i in range(1, 11)]
    assert fitted(small, 0, MAX_MESSAGE_BYTES) == (list(range(1, 11)), 0)  # the last page stays last
    assert fitted(small, 10, PAGE_HEADROOM + 5 * (small[0].ByteSize() + 6)) == ([1, 2, 3, 4, 5], 5)


def test_a_failed_shard_is_named_and_the_rest_kept() -> None:
    merged = merge_pages([(A, page_of([(1 << 56) | 5], 0, 10)), (B, Unavailable("down"))], 10)
    assert [t.id for t in merged.tasks] == [(1 << 56) | 5] and list(merged.unavailable_shards) == ["b"]
    snap = pb.SnapshotResponse(
        pools=[pb.PoolSnapshot(name="a1")], live_tasks=3, totals=pb.Totals(submitted=4, retries=1)
    )
    total = merge_snapshots([(A, snap), (B, snap)])
    assert (total.live_tasks, total.totals.submitted, total.totals.retries) == (6, 8, 2)
    assert [p.name for p in total.pools] == ["a1", "a1"]


def test_a_listing_asks_only_the_shards_of_the_pools_named() -> None:
    parts = split_list(SHARDS, pb.ListTasksRequest(pools=["b1", "a2"], limit=3))
    assert [(shard.name, list(req.pools), req.limit) for shard, req in parts] == [
        ("a", ["a2"], 3),
        ("b", ["b1"], 3),
    ]
    assert [s.name for s, _ in split_list(SHARDS, pb.ListTasksRequest())] == ["a", "b"]


def test_recurring_listings_merge_and_name_the_shards_that_did_not_answer() -> None:
    answers: Answers[pb.ListRecurringResponse] = [
        (A, pb.ListRecurringResponse(schedules=[pb.RecurringInfo(name="x", pool="a1")])),
        (B, Unavailable("shard 'b' is unavailable")),
    ]
    merged = merge_recurring(answers)
    assert [s.name for s in merged.schedules] == ["x"] and list(merged.unavailable_shards) == ["b"]


def test_a_removal_is_removed_if_any_shard_removed_it_and_never_a_false_no() -> None:
    no, yes = pb.RemoveRecurringResponse(removed=False), pb.RemoveRecurringResponse(removed=True)
    down = Unavailable("shard 'b' is unavailable")
    assert merge_removed([(A, no), (B, yes)]).removed
    assert merge_removed([(A, yes), (B, down)]).removed
    assert not merge_removed([(A, no), (B, no)]).removed
    with pytest.raises(Unavailable, match=r"shard\(s\) 'b' did not answer"):
        merge_removed([(A, no), (B, down)])
    with pytest.raises(PermissionDenied):
        merge_removed([(A, no), (B, PermissionDenied("no"))])


@pytest.mark.parametrize(
    ("merge", "answer"),
    [
        (lambda answers: merge_pages(answers, 10), pb.ListTasksResponse()),
        (merge_snapshots, pb.SnapshotResponse()),
        (merge_workers, pb.ListWorkersResponse()),
        (merge_recurring, pb.ListRecurringResponse()),
    ],
)
def test_only_a_shard_that_could_not_answer_is_named_a_refusal_is_raised(merge: Any, answer: Any) -> None:
    for down in (Unavailable("shard 'b' is unavailable"), DeadlineExceeded("too slow")):
        assert list(merge([(A, answer), (B, down)]).unavailable_shards) == ["b"]
    # What a single server answers a pool-scoped token asking for a pool it may not use.
    with pytest.raises(PermissionDenied, match="pools: this credential may not use pool 'b1'"):
        merge([(A, answer), (B, PermissionDenied("pools: this credential may not use pool 'b1'"))])
    with pytest.raises(Unauthenticated):
        merge([(A, Unavailable("down")), (B, Unauthenticated("unknown token"))])
