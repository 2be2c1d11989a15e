"""One cluster, three languages (issue #26): a Go worker, a TypeScript worker and a Python worker, each
pointed at the router of a 2-shard cluster, are sent on to the shard of their pool and serve their three
pools at the same time, each over the BatchedWorkers extension. Skipped, saying why, where go or node is
missing (``make test`` installs both where it can)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cronoq.client import Client, Lease
from tests.typescript import sdk_dist

from .gosdk import GoWorker, built_testworker
from .helpers import token, worker
from .shardproc import ShardSpec, routed_cluster
from .tsworker import registered

pytestmark = pytest.mark.asyncio

WORKER_TOKEN = "worker-token-0123456789abcdef"
CLIENT_TOKEN = "client-token-0123456789abcdef"
TOKENS = token(WORKER_TOKEN, "worker") + token(CLIENT_TOKEN, "client")
SHARDS = (ShardSpec("a", 1, ("go", "py")), ShardSpec("b", 2, ("ts",)))
TASKS = 20  # per pool, submitted together


def payload(pool: str, n: int) -> dict[str, object]:
    """What each language's worker turns into the text "<language> <n>"."""
    if pool == "go":
        return {"do": "complete", "output": f"go {n}"}  # sdk/go/internal/testworker
    if pool == "ts":
        return {"do": "complete", "value": f"typescript {n}"}  # sdk/typescript/test/fixtures/worker.ts
    return {"n": n}  # python() below


async def python(lease: Lease) -> str:
    return f"python {lease.json()['n']}"


async def test_go_typescript_and_python_workers_serve_one_cluster_at_once(tmp_path: Path) -> None:
    dist = sdk_dist()
    built_testworker()  # both skip here, before any process starts, when their toolchain is missing
    with (
        routed_cluster(tmp_path, SHARDS, TOKENS) as (router, shards),
        GoWorker(router.target, pool="go", slots=4, token=WORKER_TOKEN) as go,
        registered(dist, target=router.target, pool="ts", slots=4, token=WORKER_TOKEN) as ts,
    ):
        (ts_registration,) = ts.seen("registered")
        assert (go.registration["address"], go.registration["batched"]) == (shards["a"].target, True)
        assert (ts_registration["endpoint"], ts_registration["batched"]) == (
            f"http://{shards['b'].target}",
            True,
        )
        async with (
            worker(router.target, python, pool="py", slots=4, token=WORKER_TOKEN) as py,
            Client(router.target, token=CLIENT_TOKEN) as client,
        ):
            assert py.batched
            submitted = {
                (pool, n): await client.submit(json.dumps(payload(pool, n)).encode(), pool=pool)
                for pool in ("go", "ts", "py")
                for n in range(TASKS)
            }
            results = await asyncio.gather(*(client.wait(s.id, timeout=20) for s in submitted.values()))
            outputs = {key: (r.status, r.text()) for key, r in zip(submitted, results, strict=True)}
            language = {"go": "go", "ts": "typescript", "py": "python"}
            assert outputs == {(pool, n): ("succeeded", f"{language[pool]} {n}") for pool, n in submitted}
            # Each pool's tasks ran where its worker is: on its shard, reached through the router.
            for pool, shard in (("go", "a"), ("py", "a"), ("ts", "b")):
                assert {s.id >> 56 for (p, _), s in submitted.items() if p == pool} == {
                    next(spec.number for spec in SHARDS if spec.name == shard)
                }
