"""The chart's ``helm test``: one task submitted through the main Service (the routers, with shards)
runs on a worker this test brings, and its output comes back.

It runs in the cronoq image (``/opt/cronoq/bin/python3``), configured by the environment the test pod
sets (templates/tests/helm-test.yaml). The worker goes through the same door as real workers: with
shards the router redirects it to its pool's shard leader. While it is registered it may be offered
the pool's other tasks: it hands each back unrun (``Reject``, which does not count an attempt) rather
than run it, so only the test's own task is answered. Exit status 0 when the task succeeded with the
expected output, 1 otherwise, with what went wrong on stderr.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

import grpc

from cronoq import CronoqError
from cronoq.client import Client, Lease, Reject, Worker

KIND = "cronoq-helm-test"


def _credentials() -> grpc.ChannelCredentials | None:
    """TLS with the chart's CA (``ca.crt`` of tls.secretName), and its certificate as a client one under
    mTLS; None without TLS."""
    ca = os.environ.get("CRONOQ_TEST_CA_FILE")
    if not ca:
        return None
    cert = os.environ.get("CRONOQ_TEST_CERT_FILE")
    key = os.environ.get("CRONOQ_TEST_KEY_FILE")
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes(),
        private_key=Path(key).read_bytes() if key else None,
        certificate_chain=Path(cert).read_bytes() if cert else None,
    )


async def run_test() -> str | None:
    """None when a task went through and came back; else what failed."""
    target = os.environ["CRONOQ_TEST_TARGET"]
    pool = os.environ["CRONOQ_TEST_POOL"]
    timeout = float(os.environ["CRONOQ_TEST_TIMEOUT_S"])
    credentials = _credentials()
    run = uuid.uuid4().hex
    key = f"{KIND}-{run}"

    async def handle(lease: Lease) -> dict[str, str]:
        if lease.key != key:
            raise Reject("the helm test's worker runs only the test's task")
        return {"echo": run}

    worker = Worker(
        target,
        pool,
        handle,
        token=os.environ["CRONOQ_WORKER_TOKEN"],
        name=f"helm-test-{run[:8]}",
        credentials=credentials,
        insecure_redirect_http=os.environ.get("CRONOQ_TEST_INSECURE_REDIRECT_HTTP") == "1",
    )
    working = asyncio.create_task(worker.run())
    try:
        await worker.wait_registered(timeout)
        async with Client(target, token=os.environ["CRONOQ_CLIENT_TOKEN"], credentials=credentials) as client:
            submitted = await client.submit(
                {"run": run}, pool=pool, kind=KIND, key=key, wait=True, wait_timeout=timeout
            )
    except (TimeoutError, RuntimeError, CronoqError, OSError) as err:
        return f"{type(err).__name__}: {err}"
    finally:
        await worker.stop()
        await working
    result = submitted.result
    if result is None or not result.ok:
        return f"task {submitted.id} did not succeed: {result}"
    if result.json() != {"echo": run}:
        return f"task {submitted.id} answered {result.json()!r}, not the test worker's output"
    print(f"task {submitted.id} ran on the test's worker in pool {pool} through {target}")
    return None


def main() -> int:
    failed = asyncio.run(run_test())
    if failed is not None:
        print(f"cronoq helm test failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
