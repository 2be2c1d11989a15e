"""A Postgres store leading in a process of its own, on the event loop the server runs on (uvloop where
installed), for the tests whose failure would end the process: libuv aborts the whole process when it is
asked to watch a file descriptor that was closed under it, which the default asyncio loop of the test
process shrugs off.

``python -m tests.integration.lock_session_proc URL SCHEMA SESSION_TIMEOUT`` prints one line per step,
each a word and a value (the log goes to stderr): ``loop NAME``, ``leading EPOCH``, ``holder PID`` (the
backend of its lock session). Then it reads a line from stdin: the test has stopped that backend. It
waits until a lock check is in flight, blocks its event loop for longer than the session timeout (what a
SIGSTOP of the whole process does, with every timer due at once when it resumes), prints ``paused
SECONDS`` and ``lost REASON`` once leadership is given up, then ``leading EPOCH`` and ``holder PID`` after
taking the lock again (the test resumes the backend, whose end frees the lock), and exits 0."""

from __future__ import annotations

import asyncio
import sys
import time

from psycopg.pq import TransactionStatus

from cronoq import logs
from cronoq.process import choose_event_loop, running_loop_name
from shard.store.base import Leadership
from shard.store.postgres import PostgresStore


def say(word: str, value: object) -> None:
    print(word, value, flush=True)


async def lead(store: PostgresStore) -> Leadership:
    leadership = await store.acquire()
    say("leading", leadership.epoch)
    session = store._session
    assert session is not None
    say("holder", session.info.backend_pid)
    return leadership


async def pause_during_a_check(store: PostgresStore, seconds: float) -> None:
    """Block the loop for ``seconds`` once the lock session has a query in flight."""
    session = store._session
    assert session is not None
    while session.pgconn.transaction_status != TransactionStatus.ACTIVE:  # noqa: ASYNC110 - set by psycopg
        await asyncio.sleep(0.005)
    time.sleep(seconds)  # noqa: ASYNC251 - the point: nothing on the loop runs meanwhile
    say("paused", seconds)


async def main(url: str, schema: str, session_timeout: float) -> None:
    say("loop", running_loop_name())
    store = PostgresStore(
        url, schema=schema, check_interval=0.05, retry_interval=0.05, session_timeout=session_timeout
    )
    await store.open()
    try:
        first = await lead(store)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await pause_during_a_check(store, session_timeout + 0.3)
        await first.lost.wait()
        say("lost", first.reason)
        await store.release()
        await lead(store)
    finally:
        await store.close()


if __name__ == "__main__":
    url, schema, timeout = sys.argv[1:4]
    logs.configure(stream=sys.stderr)  # stdout carries the steps
    choose_event_loop().run(main(url, schema, float(timeout)))
