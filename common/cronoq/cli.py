"""``cronoq``: the command-line client (submit, get, wait, cancel, list, watch, workers, recurring,
snapshot).

Every command prints JSON (one document, or one line per event for ``watch``) so its output can be piped
into ``jq``; errors go to stderr as ``cronoq: <code>: <message>`` with exit status 1 (2 for usage).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from cronoq import __version__
from cronoq.errors import ApiError

PRIORITIES = ("critical", "high", "normal", "low")
MISS_POLICIES = ("run_late", "skip", "fail")
OVERLAPS = ("skip", "allow", "queue", "queue_on_success")


def _ref(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        try:
            return json.loads(value)
        except ValueError:
            return value.decode("utf-8", "replace")
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def _print(value: Any) -> None:
    print(
        json.dumps(_jsonable(value), indent=None if isinstance(value, list) else 2, default=str), flush=True
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cronoq", description="Command-line client for a cronoq server.")
    p.add_argument("--version", action="version", version=f"cronoq {__version__}")
    p.add_argument(
        "-t",
        "--target",
        default=os.environ.get("CRONOQ_TARGET", "127.0.0.1:7070"),
        help="server gRPC address (env CRONOQ_TARGET; default 127.0.0.1:7070)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("CRONOQ_TOKEN"),
        help="bearer token (env CRONOQ_TOKEN; prefer the env var: flags show up in ps)",
    )
    p.add_argument("--tls", action="store_true", help="use TLS (implied by an https:// target)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("submit", help="submit one task")
    _task_options(s, fixed_start=True)
    s.add_argument("--start-in", type=float, default=None, help="fixed start, seconds from now")
    s.add_argument(
        "--after", action="append", default=[], metavar="REF", help="run after this task succeeded"
    )
    s.add_argument("--wait", action="store_true", help="wait for the result")
    s.add_argument("--wait-timeout", type=float, default=None)

    for name, text in (("get", "show a task"), ("cancel", "cancel a task")):
        c = sub.add_parser(name, help=text)
        c.add_argument("ref", help="task id or key")
    w = sub.add_parser("wait", help="wait for a task's result")
    w.add_argument("ref", help="task id or key")
    w.add_argument("--timeout", type=float, default=None)

    ls = sub.add_parser("list", help="list tasks (id order)")
    ls.add_argument("--pool", action="append", default=[])
    ls.add_argument("--status", action="append", default=[])
    ls.add_argument("--after", type=int, default=0)
    ls.add_argument("--limit", type=int, default=0)

    wa = sub.add_parser("watch", help="print status events as JSON lines until interrupted")
    wa.add_argument("--pool", action="append", default=[])
    wa.add_argument("--id", action="append", type=int, default=[])
    wa.add_argument("--key", action="append", default=[])
    wa.add_argument("--all", action="store_true", help="every transition, not only terminal ones")

    sub.add_parser("workers", help="list connected workers")
    r = sub.add_parser("recurring", help="recurring (cron) schedules: list, add, remove")
    rsub = r.add_subparsers(dest="action", required=True, metavar="ACTION")
    rsub.add_parser("list", help="list schedules (metrics or admin token)")
    ra = rsub.add_parser("add", help="add or replace a schedule (admin token)")
    ra.add_argument("name")
    ra.add_argument("cron", help="5 fields, or 6 with a leading seconds field (quote it)")
    ra.add_argument("--tz", default=None, help="IANA time zone (default UTC)")
    ra.add_argument("--overlap", choices=OVERLAPS, default="skip")
    _task_options(ra, fixed_start=True)
    rr = rsub.add_parser("remove", help="remove a schedule (admin token)")
    rr.add_argument("name")
    sub.add_parser("snapshot", help="scheduler snapshot: pools, counters, totals")
    return p


def _task_options(p: argparse.ArgumentParser, *, fixed_start: bool) -> None:
    """The options of a task (``submit``) or of a recurring schedule's template (``recurring add``)."""
    body = p.add_mutually_exclusive_group()
    body.add_argument("--json", dest="payload_json", metavar="JSON", help="payload as a JSON document")
    body.add_argument("--data", metavar="TEXT", help="payload as text")
    body.add_argument("--file", metavar="PATH", help="payload as the bytes of a file")
    p.add_argument("--pool", default="")
    p.add_argument("--priority", choices=PRIORITIES)
    p.add_argument("--key", default=None, help="unique key (a duplicate returns the existing task)")
    p.add_argument("--kind", default=None)
    p.add_argument("--timeout", type=float, default=None, help="per-attempt timeout, seconds")
    p.add_argument("--deadline-in", type=float, default=None, help="soft deadline, seconds from now")
    if fixed_start:
        p.add_argument("--tolerance", type=float, default=None, help="allowed lateness of the fixed start")
        p.add_argument("--on-miss", choices=MISS_POLICIES, default=None)
    p.add_argument("--tag", action="append", default=[], metavar="K=V")
    p.add_argument("--label", action="append", default=[], metavar="K=V", help="required worker label")
    p.add_argument("--resource", action="append", default=[], metavar="NAME=N", help="resource units to hold")


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise SystemExit(f"cronoq: {flag} expects K=V (got {item!r})")
        out[k] = v
    return out


def _amounts(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, amount in _pairs(items, "--resource").items():
        if not amount.isdigit():
            raise SystemExit(f"cronoq: --resource expects NAME=N with a whole number N (got {amount!r})")
        out[name] = int(amount)
    return out


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The task options given on the command line (unset ones left out)."""
    return {
        k: v
        for k, v in (
            ("pool", args.pool or None),
            ("priority", args.priority),
            ("key", args.key),
            ("kind", args.kind),
            ("timeout", args.timeout),
            ("deadline_in", args.deadline_in),
            ("start_in", getattr(args, "start_in", None)),
            ("tolerance", args.tolerance),
            ("on_miss", args.on_miss),
            ("after", [_ref(a) for a in getattr(args, "after", [])] or None),
            ("tags", _pairs(args.tag, "--tag") or None),
            ("labels", _pairs(args.label, "--label") or None),
            ("resources", _amounts(args.resource) or None),
        )
        if v is not None
    }


def _payload(args: argparse.Namespace) -> Any:
    if args.payload_json is not None:
        return json.loads(args.payload_json)
    if args.data is not None:
        return args.data
    if args.file is not None:
        return Path(args.file).read_bytes()
    return None


async def run(args: argparse.Namespace) -> None:
    from cronoq.client import Client

    async with Client(args.target, token=args.token, tls=args.tls) as client:
        cmd = args.command
        if cmd == "submit":
            opts = _options(args)
            if args.wait_timeout is not None and not args.wait:
                raise ValueError("--wait-timeout needs --wait")
            _print(await client.submit(args.payload, wait=args.wait, wait_timeout=args.wait_timeout, **opts))
        elif cmd == "get":
            _print(await client.get(_ref(args.ref)))
        elif cmd == "cancel":
            _print({"cancelled": await client.cancel(_ref(args.ref))})
        elif cmd == "wait":
            _print(await client.wait(_ref(args.ref), timeout=args.timeout))
        elif cmd == "list":
            _print(
                await client.list_tasks(
                    pools=args.pool, statuses=args.status, after=args.after, limit=args.limit
                )
            )
        elif cmd == "watch":
            events = client.watch(
                args.pool or None, ids=args.id or None, keys=args.key or None, all_transitions=args.all
            )
            missing = await events.unavailable_shards()
            if missing:
                print(
                    f"cronoq: not watching shards {', '.join(missing)}: they could not be reached",
                    file=sys.stderr,
                    flush=True,
                )
            async for event in events:
                print(json.dumps(_jsonable(event)), flush=True)
        elif cmd == "workers":
            _print(await client.list_workers())
        elif cmd == "recurring":
            if args.action == "list":
                _print(await client.list_recurring())
            elif args.action == "add":
                await client.add_recurring(
                    args.name, args.cron, args.payload, tz=args.tz, overlap=args.overlap, **_options(args)
                )
                _print({"name": args.name})
            else:
                _print({"removed": await client.remove_recurring(args.name)})
        elif cmd == "snapshot":
            _print(await client.snapshot())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "submit" or getattr(args, "action", None) == "add":
            args.payload = _payload(args)
        asyncio.run(run(args))
    except ApiError as err:
        print(f"cronoq: {err.code}: {err.message}", file=sys.stderr)
        return 1
    except (TimeoutError, json.JSONDecodeError, OSError, ValueError) as err:
        print(f"cronoq: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
