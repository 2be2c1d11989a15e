"""The report of a run: faults injected, time to recovery by kind, tasks acknowledged, lost, stale,
run twice and stuck, the seed, and every violation the checker found (the first ``SHOWN`` in text).

``python -m chaos.report HISTORY`` checks a run's ``history.jsonl`` again and prints its report (exit 1
on a violation): to judge an old run with a changed checker, or to read one run's figures again."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

from .checker import Verdict, check, percentile
from .history import Record, read

SHOWN = 40


def summary(records: list[Record], verdict: Verdict) -> dict[str, Any]:
    """The report as data (``report.json``)."""
    meta = next((r for r in records if r["type"] == "meta"), {})
    skipped = Counter(r["kind"] for r in records if r["type"] == "fault" and r.get("skipped"))
    exits = Counter(r["process"] for r in records if r["type"] == "exit")
    kind_of = {r["id"]: r["kind"] for r in records if r["type"] == "fault"}
    commit_failures: Counter[str] = Counter()
    for heal in (r for r in records if r["type"] == "heal" and "commit_failures" in r):
        commit_failures[kind_of[heal["fault"]]] += int(heal["commit_failures"])
    stats = dict(verdict.stats)
    recovery = {}
    for kind, values in stats.pop("recovery").items():
        measured = [v for v in values if v is not None]
        recovery[kind] = {
            "p50_s": percentile(measured, 0.5),
            "p99_s": percentile(measured, 0.99),
            "measured": len(measured),
            "unmeasured": len(values) - len(measured),
        }
        if kind in commit_failures:  # a store fault: every heal of it counted them (0 included)
            recovery[kind]["commit_failures"] = commit_failures[kind]
    return {
        **stats,
        "seconds": meta.get("seconds"),
        "source": meta.get("source"),
        "sqlite": meta.get("sqlite"),
        "faults_skipped": dict(sorted(skipped.items())),
        "exits": dict(sorted(exits.items())),
        "recovery": recovery,
        "verdict": "fail" if verdict.violations else "pass",
        "violation_list": [str(v) for v in verdict.violations],
    }


def render(records: list[Record], verdict: Verdict) -> str:
    data = summary(records, verdict)
    lines = [
        "",
        f"cronoq chaos report: seed {data['seed']}, {data['seconds']:g} s, servers from {data['source']}",
        f"SQLite store on a nearly full file system: {data['sqlite']}",
        "",
        f"faults injected: {sum(data['faults'].values()) - data['faults'].get('exit', 0)}"
        + (
            f" (and {sum(data['faults_skipped'].values())} skipped: target busy or missing)"
            if data["faults_skipped"]
            else ""
        ),
        f"  {'kind':<18} {'count':>5}  {'recovery p50':>12}  {'p99':>7}  {'unmeasured':>10}  store commits failed meanwhile",
    ]
    for kind, count in data["faults"].items():
        if kind == "exit":
            continue
        figures = data["recovery"].get(kind, {})
        lines.append(
            f"  {kind:<18} {count:>5}  {_seconds(figures.get('p50_s')):>12}  {_seconds(figures.get('p99_s')):>7}"
            f"  {figures.get('unmeasured', 0):>10}  {figures.get('commit_failures', '')}"
        )
    if data["exits"]:
        lines.append(
            "processes that exited on their own (restarted): "
            + ", ".join(f"{p} {n}x" for p, n in data["exits"].items())
        )
    errors = ", ".join(f"{code} {n}" for code, n in data["submit_errors"].items()) or "none"
    lines += [
        "",
        f"submissions: {data['submits']} (errors: {errors})",
        f"tasks acknowledged: {data['acknowledged']}",
        f"lost: {data['lost']}" + (f" (and {data['unverified']} unverified)" if data["unverified"] else ""),
        f"stale outcomes: {data['stale']}",
        f"run twice: {data['run_twice']} tasks ({data['reruns']} extra runs, {data['reruns_hung']} after a hung handler;"
        " each explained by a fault, else a violation below)",
        f"stuck: {data['stuck']}",
        f"keys held on two shards, explained by a fault: {data['key_splits']}",
        "",
    ]
    if verdict.violations:
        counts = ", ".join(f"{rule} {n}" for rule, n in data["violations"].items())
        lines.append(f"VIOLATIONS: {len(verdict.violations)} ({counts})")
        lines += [f"  {v}" for v in verdict.violations[:SHOWN]]
        if len(verdict.violations) > SHOWN:
            lines.append(f"  ... and {len(verdict.violations) - SHOWN} more (report.json has them all)")
    else:
        lines.append("no violations")
    lines.append(f"seed {data['seed']} (CHAOS_SEED={data['seed']} replays this schedule)")
    return "\n".join(lines) + "\n"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m chaos.report HISTORY (a run's history.jsonl)", file=sys.stderr)
        return 2
    records = read([Path(args[0])])
    verdict = check(records)
    print(render(records, verdict), end="")
    return 1 if verdict.violations else 0


if __name__ == "__main__":
    sys.exit(main())
