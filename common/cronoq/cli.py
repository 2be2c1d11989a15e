"""``cronoq``: the command-line client (submit, get, wait, cancel, list, watch, workers, recurring,
snapshot, top).

Every command but ``top`` prints JSON (one document, or one line per event for ``watch``) so its output
can be piped into ``jq``; ``top`` is for people, a table refreshed in place. Errors go to stderr as
``cronoq: <code>: <message>`` with exit status 1. Usage errors exit 2, including option values that
argparse cannot check (``--tag foo``, an unreadable ``--ca``): the whole command line is interpreted
before connecting, so a typo never costs a round trip or half-runs a command.

A server that answers UNAVAILABLE (a standby, a leader stepping down, a restart, a failover under way) is
asked again with backoff for ``--retry-for`` seconds, as the SDK's worker reconnects, when asking again
is safe: always for a call that provably never ran, and for any call that changes nothing or whose
repetition changes nothing more (reads, a keyed submit, ``recurring add``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cronoq import __version__
from cronoq.errors import ApiError, Unavailable
from cronoq.grpc_settings import CLI_VERBOSITY, load_grpc
from cronoq.process import choose_event_loop

if TYPE_CHECKING:
    from cronoq.client import Client, Snapshot

PRIORITIES = ("critical", "high", "normal", "low")
MISS_POLICIES = ("run_late", "skip", "fail")
OVERLAPS = ("skip", "allow", "queue", "queue_on_success")
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: redraws ``top`` in place without curses
# Fields of the printed objects that hold task or worker ids. Ids are 64-bit, and every id of a shard
# numbered 1 or more is above 2^53, where a JSON number loses digits in most readers (jq, JavaScript): they
# are printed as strings of digits, as the HTTP API does, and every command takes them back as given.
ID_FIELDS = frozenset({"id", "last_task_id", "next_after"})
# Retrying an unavailable server: the first pause, the longest, and how long by default. The default
# outlasts a failover (a standby takes over within the lock's 10 s TTL) without keeping a mistyped target
# waiting long; a pause doubles up to RETRY_MAX_S, as the worker's reconnect backoff does.
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 2.0
RETRY_FOR_S = "15"


class UsageError(Exception):
    """An option whose value argparse accepted but the command cannot use; exits 2 like argparse's own."""


def _env(name: str) -> str | None:
    """An environment default; set but empty counts as unset (templates often export blanks)."""
    return os.environ.get(name) or None


def _ref(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _field(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)}
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


def _field(name: str, value: Any) -> Any:
    """A dataclass field as printed: an id as a string (see :data:`ID_FIELDS`)."""
    if name in ID_FIELDS and isinstance(value, int):
        return str(value)
    return _jsonable(value)


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
    p.add_argument(
        "--retry-for",
        type=_seconds,
        metavar="S",
        # A string default goes through ``type`` too: a bad CRONOQ_RETRY_FOR is a usage error naming it.
        default=_env("CRONOQ_RETRY_FOR") or RETRY_FOR_S,
        help="how long to keep asking a server that answers UNAVAILABLE (a standby, a failover, a "
        f"restart), with backoff, when that is safe (env CRONOQ_RETRY_FOR; default {RETRY_FOR_S}; 0: never)",
    )
    p.add_argument(
        "--ca",
        metavar="PATH",
        dest="ca_path",
        default=_env("CRONOQ_CA"),
        help="PEM CA bundle the server's certificate must chain to, for a private CA (env CRONOQ_CA; "
        "implies TLS; default: the system trust store)",
    )
    p.add_argument(
        "--cert",
        metavar="PATH",
        dest="cert_path",
        default=_env("CRONOQ_CERT"),
        help="PEM client certificate for mTLS, with --cert-key (env CRONOQ_CERT; implies TLS)",
    )
    p.add_argument(
        "--cert-key",
        metavar="PATH",
        # Not "--key": that is the task key of submit and recurring add.
        dest="key_path",
        default=_env("CRONOQ_CERT_KEY"),
        help="PEM private key of --cert (env CRONOQ_CERT_KEY)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("submit", help="submit one task")
    _task_options(s, fixed_start=True)
    s.add_argument("--start-in", type=float, default=None, help="fixed start, seconds from now")
    s.add_argument(
        "--after", action="append", default=[], metavar="REF", help="run after this task succeeded"
    )
    s.add_argument("--wait", action="store_true", help="wait for the result")
    s.add_argument("--wait-timeout", type=float, default=None)

    for name, text in (
        ("get", "show a task"),
        ("cancel", "cancel a task"),
        ("wait", "wait for a task's result"),
    ):
        c = sub.add_parser(name, help=text)
        c.add_argument("ref", help="task id or key")
        c.add_argument(
            "--pool", default=None, help="the task's pool (settles a key that tasks on two shards hold)"
        )
        if name == "wait":
            c.add_argument("--timeout", type=float, default=None)

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
    top = sub.add_parser("top", help="live view of the pools, refreshed in place (metrics or admin token)")
    top.add_argument(
        "--interval", type=_positive, default=2.0, metavar="S", help="seconds between refreshes (default 2)"
    )
    top.add_argument("--once", action="store_true", help="print one view and exit (for scripts)")
    return p


def _seconds(text: str, *, zero: bool = True) -> float:
    """argparse type of ``--retry-for``: a finite number of seconds, 0 or more (above 0 unless
    ``zero``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (got {text!r})") from None
    if not (value >= 0 if zero else value > 0) or value == float("inf"):  # NaN fails both
        raise argparse.ArgumentTypeError(f"must be {'>=' if zero else '>'} 0 seconds (got {text!r})")
    return value


def _positive(text: str) -> float:
    """argparse type of ``--interval``: a finite number of seconds above 0."""
    return _seconds(text, zero=False)


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
            raise UsageError(f"{flag} expects K=V (got {item!r})")
        out[k] = v
    return out


def _amounts(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, amount in _pairs(items, "--resource").items():
        if not amount.isdigit():
            raise UsageError(f"--resource expects NAME=N with a whole number N (got {amount!r})")
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
        try:
            return json.loads(args.payload_json)
        except ValueError as err:
            raise UsageError(f"--json expects a JSON document ({err})") from None
    if args.data is not None:
        return args.data
    if args.file is not None:
        return _read(args.file, "--file")
    return None


def _read(path: str, option: str) -> bytes:
    """The bytes of a file named on the command line; unreadable is a usage error naming the option."""
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise UsageError(f"{option}: cannot read {path} ({err.strerror or err})") from None


def _credentials(args: argparse.Namespace) -> Any:
    """``grpc.ssl_channel_credentials`` from ``--ca``/``--cert``/``--cert-key``; None without them (then TLS,
    if asked for, trusts the system store). The files are checked here because gRPC would only fail
    the handshake, as an opaque UNAVAILABLE, on a certificate it cannot use."""
    ca_path, cert_path, key_path = args.ca_path, args.cert_path, args.key_path
    if (cert_path is None) != (key_path is None):
        raise UsageError("--cert and --cert-key go together (a client certificate needs its private key)")
    if ca_path is None and cert_path is None:
        return None
    ca = _read(ca_path, "--ca") if ca_path is not None else None
    context = ssl.create_default_context()
    if ca is not None:
        try:
            context.load_verify_locations(cadata=ca.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as err:
            raise UsageError(f"--ca: {ca_path} is not a PEM CA certificate ({err})") from None
    cert = key = None
    if cert_path is not None:
        cert, key = _read(cert_path, "--cert"), _read(key_path, "--cert-key")
        try:
            context.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as err:
            raise UsageError(f"--cert/--cert-key: not a usable PEM certificate and key ({err})") from None
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def _prepare(args: argparse.Namespace) -> None:
    """Interpret every option before connecting, adding ``payload``, ``options`` and ``credentials``
    to ``args``; raises :class:`UsageError`."""
    args.credentials = _credentials(args)
    if args.command == "submit" or getattr(args, "action", None) == "add":
        if getattr(args, "wait_timeout", None) is not None and not args.wait:
            raise UsageError("--wait-timeout needs --wait")
        args.payload = _payload(args)
        args.options = _options(args)


async def run(args: argparse.Namespace) -> None:
    from cronoq.client import Client

    async with Client(args.target, token=args.token, tls=args.tls, credentials=args.credentials) as client:
        if (
            args.command == "top" and not args.once
        ):  # a live view asks again by itself, for as long as it runs
            await _top(client, args.target, args.interval, once=False)
            return
        output = _Output()
        await _retrying(lambda: _command(client, args, output), args.retry_for, _resendable(args), output)


@dataclass(slots=True)
class _Output:
    """Whether a command printed anything yet: once it has (``watch``'s events), asking again would
    print it twice."""

    started: bool = False


def _resendable(args: argparse.Namespace) -> bool:
    """Whether the command may be sent again after an UNAVAILABLE that may have come after it ran: it
    changes nothing (reads), or sending it again changes nothing more (a submit with a key answers the
    same task as a duplicate; ``recurring add`` replaces the schedule with itself). A keyless submit,
    a cancel and a removal are sent again only when they provably never ran."""
    command: str = args.command
    if command == "submit":
        return "key" in args.options
    if command == "recurring":
        return bool(args.action != "remove")
    return command != "cancel"


async def _retrying(
    attempt: Callable[[], Awaitable[None]], budget: float, resendable: bool, output: _Output
) -> None:
    """Run ``attempt``, asking again after an UNAVAILABLE for up to ``budget`` seconds, with pauses
    from :data:`RETRY_FIRST_S` doubling up to :data:`RETRY_MAX_S`, each said on stderr. A standby
    answers UNAVAILABLE (marked as never run) and closes the connection about a second later, so the
    next attempt reaches the leader through a balancer, or the standby itself once it has taken over."""
    from cronoq.transport import NOT_RECEIVED_KEY

    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget
    pause = RETRY_FIRST_S
    while True:
        try:
            await attempt()
            return
        except Unavailable as err:
            never_ran = any(key == NOT_RECEIVED_KEY for key, _ in err.metadata)
            wait = min(pause, deadline - loop.time())
            if wait <= 0 or output.started or not (resendable or never_ran):
                raise
            print(
                f"cronoq: {err.code}: {err.message} (asking again in {wait:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
            await asyncio.sleep(wait)
            pause = min(pause * 2, RETRY_MAX_S)


async def _command(client: Client, args: argparse.Namespace, output: _Output) -> None:
    """One attempt at the command: its call, and the printing of its answer."""
    cmd = args.command
    if cmd == "submit":
        _print(
            await client.submit(args.payload, wait=args.wait, wait_timeout=args.wait_timeout, **args.options)
        )
    elif cmd == "get":
        _print(await client.get(_ref(args.ref), pool=args.pool))
    elif cmd == "cancel":
        _print({"cancelled": await client.cancel(_ref(args.ref), pool=args.pool)})
    elif cmd == "wait":
        _print(await client.wait(_ref(args.ref), timeout=args.timeout, pool=args.pool))
    elif cmd == "list":
        _print(
            await client.list_tasks(pools=args.pool, statuses=args.status, after=args.after, limit=args.limit)
        )
    elif cmd == "watch":
        events = client.watch(
            args.pool or None, ids=args.id or None, keys=args.key or None, all_transitions=args.all
        )
        missing = await events.unavailable_shards()
        if missing:
            output.started = True
            print(
                f"cronoq: not watching shards {', '.join(missing)}: they could not be reached",
                file=sys.stderr,
                flush=True,
            )
        async for event in events:
            output.started = True
            print(json.dumps(_jsonable(event)), flush=True)
    elif cmd == "workers":
        _print(await client.list_workers())
    elif cmd == "recurring":
        if args.action == "list":
            _print(await client.list_recurring())
        elif args.action == "add":
            await client.add_recurring(
                args.name, args.cron, args.payload, tz=args.tz, overlap=args.overlap, **args.options
            )
            _print({"name": args.name})
        else:
            _print({"removed": await client.remove_recurring(args.name)})
    elif cmd == "snapshot":
        _print(await client.snapshot())
    elif cmd == "top":
        await _top(client, args.target, args.interval, once=True)


# ------------------------------------------------------------------------------------------------ top


async def _top(client: Client, target: str, interval: float, *, once: bool) -> None:
    """Poll ``Admin.Snapshot`` and draw it: one frame with ``once``, else until interrupted, redrawn in
    place on a terminal and appended otherwise (a log keeps every frame). While live, an unreachable
    server (a failover, a restart) is shown and polled again rather than ending the view."""
    redraw = not once and sys.stdout.isatty()
    while True:
        stamp = time.strftime("%H:%M:%S")
        header = f"cronoq top  {target}  {stamp}" + (
            "" if once else f"  (every {interval:g} s, Ctrl-C quits)"
        )
        try:
            body = render_top(await client.snapshot())
        except Unavailable as err:
            if once:
                raise
            body = f"cronoq: {err.code}: {err.message}\n(trying again)"
        if redraw:
            sys.stdout.write(CLEAR)
        # Appended frames (not a terminal) are kept apart by a blank line.
        print(f"{header}\n\n{body}", end="\n" if once or redraw else "\n\n", flush=True)
        if once:
            return
        await asyncio.sleep(interval)


TOP_COLUMNS = (
    "POOL",
    "CAP",
    "BUSY",
    "HELD",
    "DESIRED",
    "PENDING",
    "CRIT/HIGH/NORM/LOW",
    "WAIT P50",
    "WAIT P99",
    "UTIL",
    "OK",
    "FAILED",
    "WORKERS",
)


def render_top(snapshot: Snapshot) -> str:
    """One ``top`` frame: a row per pool, a totals line, and the shards that could not be reached.

    Wait times, utilization and the ok/failed counts cover the server's metrics window; the totals
    line counts since the serving leader started.
    """
    rows = [
        (
            p.name,
            str(p.capacity),
            str(p.busy),
            str(p.held),
            str(p.desired),
            str(p.pending),
            "/".join(str(p.pending_by_class.get(c, 0)) for c in PRIORITIES),
            _duration(p.wait_p50),
            _duration(p.wait_p99),
            f"{p.utilization:.0%}",
            str(p.succeeded),
            str(p.failed),
            str(p.workers_connected),
        )
        for p in snapshot.pools
    ]
    widths = [max(len(row[i]) for row in (TOP_COLUMNS, *rows)) for i in range(len(TOP_COLUMNS))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in (TOP_COLUMNS, *rows)
    ]
    if not rows:
        lines.append("(no pools visible to this credential)")
    t = snapshot.totals
    lines += [
        "",
        f"total: {len(rows)} pool(s), capacity {sum(p.capacity for p in snapshot.pools)}, "
        f"running {snapshot.running}, pending {snapshot.pending}, workers {snapshot.workers_connected}, "
        f"live tasks {snapshot.live_tasks}",
        f"totals: submitted {t.submitted}, succeeded {t.succeeded}, failed {t.failed}, "
        f"dead-lettered {t.dead_lettered}, cancelled {t.cancelled}, retries {t.retries}",
    ]
    if snapshot.unavailable_shards:
        lines.append(
            f"unavailable shards: {', '.join(snapshot.unavailable_shards)} (their pools are not shown)"
        )
    return "\n".join(line.rstrip() for line in lines)


def _duration(seconds: float) -> str:
    """A wait as a person reads it: ``0``, ``12ms``, ``3.4s``, ``2.5m``."""
    if seconds <= 0:
        return "0"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.1f}m"


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    load_grpc(CLI_VERBOSITY)  # before anything imports grpc: its core's own lines stay off stderr
    try:
        _prepare(args)
    except UsageError as err:
        p.error(str(err))  # exits 2, after the usage line, as argparse's own errors do
    try:
        loop = choose_event_loop()
    except ValueError as err:
        p.error(str(err))
    try:
        loop.run(run(args))
    except ApiError as err:
        print(f"cronoq: {err.code}: {err.message}", file=sys.stderr)
        return 1
    except (TimeoutError, OSError, ValueError) as err:
        print(f"cronoq: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C is how one leaves top; any other command was cut short
        return 0 if args.command == "top" else 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
