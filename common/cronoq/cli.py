"""``cronoq``: the command-line client (submit, get, wait, cancel, list, watch, workers, snapshot).

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
    body = s.add_mutually_exclusive_group()
    body.add_argument("--json", dest="payload_json", metavar="JSON", help="payload as a JSON document")
    body.add_argument("--data", metavar="TEXT", help="payload as text")
    body.add_argument("--file", metavar="PATH", help="payload as the bytes of a file")
    s.add_argument("--pool", default="")
    s.add_argument("--priority", choices=PRIORITIES)
    s.add_argument("--key", default=None, help="unique key (a duplicate returns the existing task)")
    s.add_argument("--kind", default=None)
    s.add_argument("--timeout", type=float, default=None, help="per-attempt timeout, seconds")
    s.add_argument("--deadline-in", type=float, default=None, help="soft deadline, seconds from now")
    s.add_argument("--tag", action="append", default=[], metavar="K=V")
    s.add_argument("--label", action="append", default=[], metavar="K=V", help="required worker label")
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
    sub.add_parser("snapshot", help="scheduler snapshot: pools, counters, totals")
    return p


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise SystemExit(f"cronoq: {flag} expects K=V (got {item!r})")
        out[k] = v
    return out


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
            payload = args.payload
            opts: dict[str, Any] = {
                k: v
                for k, v in (
                    ("pool", args.pool or None),
                    ("priority", args.priority),
                    ("key", args.key),
                    ("kind", args.kind),
                    ("timeout", args.timeout),
                    ("deadline_in", args.deadline_in),
                    ("tags", _pairs(args.tag, "--tag") or None),
                    ("labels", _pairs(args.label, "--label") or None),
                )
                if v is not None
            }
            if args.wait_timeout is not None and not args.wait:
                raise ValueError("--wait-timeout needs --wait")
            _print(await client.submit(payload, wait=args.wait, wait_timeout=args.wait_timeout, **opts))
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
            async for event in client.watch(
                args.pool or None, ids=args.id or None, keys=args.key or None, all_transitions=args.all
            ):
                print(json.dumps(_jsonable(event)), flush=True)
        elif cmd == "workers":
            _print(await client.list_workers())
        elif cmd == "snapshot":
            _print(await client.snapshot())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "submit":
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
