"""The history of a chaos run: what every party saw, one JSON object a line.

This module is the whole contract between the run (:mod:`chaos.harness` and the worker processes) and
the checker (:mod:`chaos.checker`): the checker reads nothing else, and imports nothing of cronoq, so a
defect in the server cannot hide itself by also being in the code that judges it. It uses the standard
library only.

Every record has ``type`` and ``t``, the time it happened in Unix seconds (``time.time()``: every
process of a run is on one machine, so their clocks are one clock). The checker's rules only ever
compare times one way round (a worker's report written *before* it is sent is no later than the server
received it; a lease started on a worker *after* the server dispatched it), so they never need the
clocks closer than that. The records, by ``type``:

``meta``
    once, first: ``seed``, ``seconds``, ``bounds`` (``takeover_s``: how long a standby may take to lead
    once a leader stops, the documented bound plus its look interval; ``grace_s``: the slack allowed for
    scheduling on a busy machine), ``pools`` (each pool's ``shard``, ``lease_ttl_s``, ``max_attempts``,
    ``cluster``: pools of one cluster share the key namespace), ``servers`` (each server's shard),
    ``shards`` (each shard's number, the top 8 bits of its task ids).
``fault`` / ``heal``
    a fault injected (``id``, ``kind``, ``target`` as the schedule names it, ``process`` it hit, the
    ``shards`` and ``pools`` it affects, ``duration_s``, ``seed``; ``skipped`` with the reason when its
    target was busy with another fault or missing), and its end (``fault``: the id).
``exit``
    a process that ended without the run ending it (``process``, ``code``); the run restarts it, as a
    supervisor would (``restart``).
``role``
    a server's role changed as its ``/readyz`` tells it: ``state`` is ``leading`` (200), ``standby``
    (503), ``down`` (nothing listens) or ``silent`` (no answer in time: paused, hung); ``since`` is the
    last poll that still showed the previous state.
``call``
    one client call and its answer: ``op`` (``submit``, ``cancel``, ``wait``, ``get``), ``t0`` (sent)
    and ``t`` (answered), ``request``, ``ok``, and ``answer`` or ``error`` (``code``, ``message``).
    A submit's ``request`` holds the task as asked (``pool``, ``key``, ``deps`` as ``[ref, cond]``,
    ``start_at``, ``on_miss``, ``timeout_s``, ``max_attempts``, ``fail`` (attempts its handler fails on
    purpose), ``permanent``, ``uid``); its ``answer`` ``id``, ``duplicate`` and, when it waited,
    ``result``.
``lease`` / ``report``
    written by the worker processes: a handler began a lease (``worker``, ``pid``, ``session``, ``lease``,
    ``task``, ``attempt``, ``pool``, ``uid``), and how it ended (``outcome``: ``complete``, ``retry``,
    ``permanent``, or ``aborted`` when it was cancelled and reported nothing; ``retry_after_s``),
    written before the worker sends it. A handler's output (or failure message) names its lease (see
    :func:`identity`), so an outcome a client sees tells which lease it came from.
``final``
    after the run, what the cluster says of each task: ``task``, ``found``, ``status``, ``attempt``,
    ``pool``, ``key``, ``message``, ``started_at``, ``output`` (the lease identity of a success).
``end``
    once, last: ``faults_ended`` (when the last fault was healed).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

Record = dict[str, Any]

# What a failure message that names its lease starts with (then the identity, as JSON).
FAILURE_PREFIX = "chaos lease "
IDENTITY_FIELDS = ("task", "attempt", "worker", "pid", "session", "lease")
TERMINAL = frozenset({"succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"})


class HistoryWriter:
    """Appends records to one file, each with a single ``write`` to a descriptor opened ``O_APPEND``: a
    line is whole even when the process is killed right after, and several processes may share a file.
    Nothing is buffered in the process, so a ``kill -9`` loses no record that was written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record_type: str, t: float | None = None, /, **fields: Any) -> Record:
        record: Record = {"type": record_type, "t": time.time() if t is None else t, **fields}
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        return record

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def identity(task: int, attempt: int, worker: str, pid: int, session: int, lease: int) -> dict[str, Any]:
    """What a handler's output says of the lease it ran under: enough to find that lease's records."""
    return {
        "task": task,
        "attempt": attempt,
        "worker": worker,
        "pid": pid,
        "session": session,
        "lease": lease,
    }


def identity_key(fields: Mapping[str, Any]) -> tuple[Any, ...]:
    """The lease an identity (or a lease or report record) names, comparable."""
    return tuple(fields.get(name) for name in IDENTITY_FIELDS)


def failure_message(ident: Mapping[str, Any], why: str) -> str:
    return f"{FAILURE_PREFIX}{json.dumps(dict(ident), separators=(',', ':'))}: {why}"


def identity_in_message(message: str) -> dict[str, Any] | None:
    """The lease identity a failure message written by :func:`failure_message` carries (None: another
    message, such as the server's ``attempt lost in failover``)."""
    if not message.startswith(FAILURE_PREFIX):
        return None
    text = message[len(FAILURE_PREFIX) :]
    try:
        found, _ = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def read(paths: Iterable[Path]) -> list[Record]:
    """Every record of these files, in time order (a torn last line of a killed writer is skipped)."""
    records: list[Record] = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "type" in record and "t" in record:
                records.append(record)
    records.sort(key=lambda r: float(r["t"]))
    return records


def write_all(path: Path, records: Iterable[Record]) -> None:
    with path.open("w") as out:
        for record in records:
            out.write(json.dumps(record, separators=(",", ":")) + "\n")


def iter_file(path: Path) -> Iterator[Record]:
    """The records of one merged history file, as written."""
    with path.open() as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)
