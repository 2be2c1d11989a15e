"""Where the CPU of a task goes: ``python -m bench.profile [--tasks N]``.

The memory-store drain of ``make bench`` (SubmitBatch x1000, one worker with 64 slots) with py-spy
sampling the server while it runs (Python frames: C calls count for the Python line that made them). It
prints the share of samples by layer (grpc,
protobuf, the event loop, cronoq's engine, the rest of cronoq, other) and the functions with the most
samples of their own. Nothing is asserted; the numbers are for whoever works on the cost per task.
Sampling stops the server briefly each time, so its CPU per task reads somewhat higher than
``make bench``'s; the shares are what to read.

py-spy needs to trace other processes (root, or ``kernel.yama.ptrace_scope`` 0); without it, or without
py-spy installed (the dev extras bring it), the bench says so and stops.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from tests.integration.serverproc import running_server

from . import on_loop
from .__main__ import POOL_CONFIG, drain

# Layers, by the file of the frame that was running (py-spy writes ``function (file:line)``): the first
# pattern found in it names the layer. A sample in a thread's ``run`` is grpc's poller thread (C code under
# no Python frame of its own); one in ``Runner.run`` is the event loop in C: uvloop and the callbacks
# grpc's Cython layer runs there.
LAYERS = (
    ("grpc poller thread (C)", ("(threading.py:",)),
    ("event loop in C (uvloop, grpc callbacks)", ("(asyncio/runners.py:",)),
    ("grpc (Python)", ("(grpc/", "_cython")),
    ("protobuf", ("(google/protobuf/",)),
    ("event loop (Python)", ("(asyncio/",)),
    ("engine", ("(cronoq/engine/",)),
    ("cronoq", ("(cronoq/", "(shard/", "(router/")),
)


def layer(frame: str) -> str:
    for name, patterns in LAYERS:
        if any(p in frame for p in patterns):
            return name
    return "other"


def summarize(raw: Path, top: int = 12) -> str:
    """py-spy's raw (collapsed) stacks: ``frame;frame;... count`` per line, the innermost frame last."""
    layers: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        leaf = stack.rsplit(";", 1)[-1]
        total += count
        leaves[leaf] += count
        layers[layer(leaf)] += count
    if not total:
        return "  no samples"
    lines = ["  by layer (the frame that was running):"]
    lines += [f"  {count / total:6.1%}  {name}" for name, count in layers.most_common()]
    lines.append("  the frames with the most samples (a cronoq line that awaits a gRPC read or write counts")
    lines.append("  the C work it waits in, as py-spy sees it without --native):")
    lines += [f"  {count / total:6.1%}  {leaf}" for leaf, count in leaves.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=40_000, help="tasks in the drain (default: %(default)s)")
    args = p.parse_args()
    spy = shutil.which("py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if spy is None:
        print("bench.profile: py-spy is not installed (pip install py-spy; the dev extras bring it)")
        return
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp), POOL_CONFIG) as server:
        assert server.proc is not None
        out = Path(tmp) / "server.txt"
        spying = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(server.proc.pid),
                "--rate",
                "500",
                "--format",
                "raw",
                "--output",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            d = on_loop(drain(server, args.tasks, 64))
        finally:
            spying.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
            _, err = spying.communicate(timeout=30)
        print(
            f"drain of {d['tasks']:,.0f} tasks: {d['tasks_per_s']:,.0f} tasks/s; CPU per task: server "
            f"{d['server_us']:.0f} us, worker {d['worker_us']:.0f} us, producer {d['producer_us']:.0f} us"
        )
        if not out.exists():
            print(f"bench.profile: py-spy recorded nothing: {err.decode().strip()[-500:]}")
            return
        print(f"server (py-spy samples while draining):\n{summarize(out)}")


if __name__ == "__main__":
    main()
