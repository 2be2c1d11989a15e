"""Processes for tests of who holds a SQLite store's lease (``shard/store/holder.py``)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from shard.store.holder import Holder

_HOLDER = """
import time
from cronoq.shard.store.holder import this_process
print(this_process("child").text(), flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def running_holder() -> Iterator[tuple[subprocess.Popen[str], Holder]]:
    """A running process and the identity it gives itself; killed on the way out."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc, Holder.parse(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def exited_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    child = subprocess.Popen(["true"])
    child.wait(10)
    return child.pid
