"""The scenarios every compiled SDK's worker is tested in against real server processes (the Go SDK's
``cronoq.RunWorker`` in test_go_worker.py, the Rust SDK's ``run_worker`` in test_rust_worker.py): every
outcome a handler can report, aborts reaching the handler (its context, its cancellation token), lease
expiry of a frozen worker, the drain when the worker is told to stop, TLS and mTLS, a refused token, the
fallback to ``Workers.Work``, and shard redirects in a 2-shard cluster. Each SDK has a test worker taking
the same flags and payloads and printing the same JSON lines (see :mod:`.gosdk`), whose process is a
:class:`~.gosdk.GoWorker`; a test module imports these tests and gives the ``sdk`` fixture (an
:class:`Sdk`)."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from cronoq.client import Client, Lease
from tests.pki import issue, new_ca

from .conftest import DEFAULT_CONFIG
from .gosdk import GoWorker
from .helpers import token, worker
from .serverproc import ServerProcess, running_server
from .shardproc import ShardSpec, routed_cluster


@dataclass(frozen=True, slots=True)
class Sdk:
    """An SDK's test worker, and what differs in what it prints or needs."""

    worker: type[GoWorker]
    build: Callable[[], Path]
    # The "err" of a ctx_done event: how the handler saw its attempt end.
    cancelled: str
    # Flags for TLS to a server addressed by its IP address (whose certificate also names localhost).
    ip_tls: tuple[str, ...] = ()


def do(what: str, **fields: object) -> bytes:
    """A payload telling the test worker what to do."""
    return json.dumps({"do": what, **fields}).encode()


@pytest.fixture(scope="module", autouse=True)
def sdk_worker_built(sdk: Sdk) -> None:
    """The worker is built before any server starts: without its toolchain, the tests are skipped at once."""
    sdk.build()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the tests that leave nothing behind but finished tasks."""
    with running_server(tmp_path_factory.mktemp("sdk-shared"), DEFAULT_CONFIG) as proc:
        yield proc


@pytest.fixture(scope="module")
def sdk_worker(sdk: Sdk, shared: ServerProcess) -> Iterator[GoWorker]:
    """A worker with 4 slots on the shared server's pool "default" (lease TTL 1 s, 3 attempts)."""
    with sdk.worker(shared.target, "-name", "worker-1", slots=4) as w:
        yield w


@pytest_asyncio.fixture
async def client(shared: ServerProcess) -> AsyncIterator[Client]:
    async with Client(shared.target) as c:
        yield c


async def test_registration_and_a_completed_task(sdk_worker: GoWorker, client: Client) -> None:
    assert sdk_worker.registration["slots"] == 4
    assert sdk_worker.registration["batched"] is True  # BatchedWorkers.Work, where the server has it
    assert sdk_worker.registration["lease_ttl"] == pytest.approx(1.0)
    done = await client.submit(
        do("complete", output="hello from an sdk"), kind="greet", key="sdk-complete", priority="high",
        tags={"team": "sdk"}, timeout=20, wait=True, wait_timeout=10,
    )  # fmt: skip
    assert done.result is not None and done.result.status == "succeeded"
    assert done.result.text() == "hello from an sdk"
    start = sdk_worker.expect("start", task=done.id)
    assert (start["attempt"], start["kind"], start["key"], start["priority"]) == (
        1,
        "greet",
        "sdk-complete",
        "high",
    )
    assert start["tags"]["team"] == "sdk" and start["pool"] == "default"
    assert start["timeout"] == pytest.approx(20) and start["lease_ttl"] == pytest.approx(1.0)


async def test_retryable_with_after_is_retried_no_sooner(sdk_worker: GoWorker, client: Client) -> None:
    done = await client.submit(do("retry", after=0.4), wait=True, wait_timeout=15)
    assert done.result is not None and done.result.status == "dead_lettered"
    assert done.result.message == "flaky 3"
    starts = [sdk_worker.expect("start", task=done.id, attempt=n) for n in (1, 2, 3)]
    # The pool's backoff is 0.05 s: the gaps are the handler's retry_after.
    assert all(b["t"] - a["t"] >= 0.35 for a, b in itertools.pairwise(starts))


async def test_permanent_fails_without_retry(sdk_worker: GoWorker, client: Client) -> None:
    done = await client.submit(do("permanent"), wait=True, wait_timeout=10)
    assert done.result is not None and (done.result.status, done.result.message) == ("failed", "bad input")
    assert (await client.get(done.id)).attempt == 1


@pytest.mark.parametrize(("what", "message"), [("error", "boom 3"), ("panic", "panic: kaboom 3")])
async def test_any_other_error_and_a_panic_are_retryable(
    sdk_worker: GoWorker, client: Client, what: str, message: str
) -> None:
    done = await client.submit(do(what), wait=True, wait_timeout=10)
    assert done.result is not None and (done.result.status, done.result.message) == ("dead_lettered", message)
    assert (await client.get(done.id)).attempt == 3
    assert (
        sdk_worker.proc.poll() is None and sdk_worker.kinds().count("registered") == 1
    )  # one stream throughout


async def test_cancel_task_cancels(sdk_worker: GoWorker, client: Client) -> None:
    done = await client.submit(do("cancel"), wait=True, wait_timeout=10)
    assert done.result is not None and done.result.status == "cancelled"


async def test_reject_hands_the_lease_to_another_worker(
    sdk: Sdk, shared: ServerProcess, client: Client
) -> None:
    with (
        sdk.worker(shared.target, "-reject", "-name", "picky", pool="other", slots=4) as picky,
        sdk.worker(shared.target, "-name", "willing", pool="other", slots=4),
    ):
        subs = [await client.submit(do("complete"), pool="other") for _ in range(8)]
        results = [await client.wait(s.id, timeout=10) for s in subs]
        assert "reject" in picky.kinds()
    assert [r.status for r in results] == ["succeeded"] * 8
    assert [r.text() for r in results] == ["attempt 1"] * 8  # handed over within the same attempt


async def test_labels_route_tasks_to_the_workers_that_have_them(
    sdk: Sdk, shared: ServerProcess, client: Client
) -> None:
    with (
        sdk.worker(shared.target, "-labels", "gpu=a100", "-name", "gpu", pool="other", slots=2) as gpu,
        sdk.worker(shared.target, "-name", "plain", pool="other", slots=2) as plain,
    ):
        subs = [await client.submit(do("complete"), pool="other", labels={"gpu": "a100"}) for _ in range(4)]
        for sub in subs:
            assert (await client.wait(sub.id, timeout=10)).status == "succeeded"
        ids = {sub.id for sub in subs}
        assert {e["task"] for e in gpu.all_events() if e["event"] == "start"} == ids
        assert not ids & {e.get("task") for e in plain.all_events()}


async def test_abort_on_timeout_ends_the_handlers_context(
    sdk: Sdk, sdk_worker: GoWorker, client: Client
) -> None:
    done = await client.submit(do("sleep", seconds=30), timeout=0.2, wait=True, wait_timeout=15)
    assert done.result is not None and done.result.status == "dead_lettered"
    assert done.result.message == "attempt timed out"
    for attempt in (1, 2, 3):
        ended = sdk_worker.expect("ctx_done", task=done.id, attempt=attempt)
        assert ended["err"] == sdk.cancelled and "timed out" in ended["reason"]


async def test_cancel_reaches_the_handlers_context(sdk: Sdk, sdk_worker: GoWorker, client: Client) -> None:
    sub = await client.submit(do("sleep", seconds=30))
    sdk_worker.expect("start", task=sub.id)
    assert await client.cancel(sub.id) is True
    assert (await client.wait(sub.id, timeout=10)).status == "cancelled"
    ended = sdk_worker.expect("ctx_done", task=sub.id)
    assert ended["err"] == sdk.cancelled and ended["reason"]


async def test_heartbeats_keep_an_attempt_past_the_lease_ttl(sdk_worker: GoWorker, client: Client) -> None:
    expiries = (await client.snapshot()).totals.lease_expiries
    done = await client.submit(do("sleep", seconds=2.5), wait=True, wait_timeout=15)  # 2.5 x the TTL
    assert done.result is not None and done.result.text() == "slept on attempt 1"
    assert (await client.snapshot()).totals.lease_expiries == expiries


async def test_slots_are_enforced(sdk_worker: GoWorker, client: Client) -> None:
    subs = [await client.submit(do("sleep", seconds=0.3), pool="default") for _ in range(8)]
    for sub in subs:
        assert (await client.wait(sub.id, timeout=15)).status == "succeeded"
    running, most = 0, 0
    for event in sdk_worker.all_events():
        if event.get("task") in {s.id for s in subs}:
            running += {"start": 1, "slept": -1}.get(event["event"], 0)
            most = max(most, running)
    assert most == 4


async def test_a_frozen_worker_loses_its_lease(sdk: Sdk, tmp_path: Path) -> None:
    with running_server(tmp_path, DEFAULT_CONFIG) as server, sdk.worker(server.target) as frozen:
        async with Client(server.target) as client:
            sub = await client.submit(do("sleep", seconds=30, first=1))
            frozen.expect("start", task=sub.id, attempt=1)
            frozen.proc.send_signal(signal.SIGSTOP)
            with sdk.worker(server.target) as rescuer:
                result = await client.wait(sub.id, timeout=15)
                rescuer.expect("start", task=sub.id, attempt=2)
            assert (result.status, result.text()) == ("succeeded", "attempt 2")
            assert (await client.snapshot()).totals.lease_expiries == 1


async def test_drain_when_the_context_ends(sdk: Sdk, tmp_path: Path) -> None:
    """SIGTERM ends the worker's context: it sends SetSlots(0), so the server sends it no new lease while
    its running handlers finish, which they do; then it exits 0."""
    with (
        running_server(tmp_path, DEFAULT_CONFIG) as server,
        sdk.worker(server.target, pool="other", slots=3) as w,
    ):
        async with Client(server.target) as client:
            running = [await client.submit(do("sleep", seconds=3), pool="other") for _ in range(2)]
            for sub in running:
                w.expect("start", task=sub.id)
            w.proc.send_signal(signal.SIGTERM)
            # SetSlots(0) reached the server while the worker, still connected, runs its two handlers.
            await until(lambda: slots_of(client, "other"), [0])
            late = await client.submit(do("complete"), pool="other")  # the worker has a free slot, but drains
            assert w.stop() == 0
            assert w.kinds()[-1] == "exit"
            for sub in running:
                assert (await client.wait(sub.id, timeout=5)).text() == "slept on attempt 1"
            assert (await client.get(late.id)).status == "ready"
            assert late.id not in {e.get("task") for e in w.all_events()}


async def test_drain_timeout_ends_the_rest(sdk: Sdk, tmp_path: Path) -> None:
    with (
        running_server(tmp_path, DEFAULT_CONFIG) as server,
        sdk.worker(server.target, "-drain", "300ms", pool="other") as w,
    ):
        async with Client(server.target) as client:
            sub = await client.submit(do("sleep", seconds=30), pool="other")
            w.expect("start", task=sub.id)
            assert w.stop() == 0
            assert w.expect("ctx_done", task=sub.id)["reason"] == "the worker stopped"
            info = await client.get(sub.id)
            assert info.status in {"retrying", "ready"}
            assert info.message == "the worker stopped; the handler did not finish within 300ms"


async def slots_of(client: Client, pool: str) -> list[int]:
    """The slots of each worker connected for ``pool``."""
    return [w.slots for w in await client.list_workers() if w.pool == pool]


async def until(probe: Callable[[], Awaitable[object]], expected: object, timeout: float = 10) -> None:
    """Wait until ``await probe()`` equals ``expected``."""
    deadline = time.monotonic() + timeout
    while (got := await probe()) != expected:
        assert time.monotonic() < deadline, f"still {got!r}, not {expected!r}, after {timeout} s"
        await asyncio.sleep(0.05)


async def test_without_the_batched_extension_it_uses_workers_work(sdk: Sdk, tmp_path: Path) -> None:
    config = DEFAULT_CONFIG.replace("[server]\n", "[server]\nworker_batches = false\n")
    with running_server(tmp_path, config) as server, sdk.worker(server.target) as w:
        assert w.registration["batched"] is False
        async with Client(server.target) as client:
            done = await client.submit(do("complete"), wait=True, wait_timeout=10)
        assert done.result is not None and done.result.text() == "attempt 1"
        assert w.kinds().count("registered") == 1  # one refused call, then Workers.Work at once


WORKER_TOKEN = "worker-token-0123456789abcdef"
CLIENT_TOKEN = "client-token-0123456789abcdef"
TOKENS = token(WORKER_TOKEN, "worker") + token(CLIENT_TOKEN, "client")


async def test_a_refused_token_or_an_unknown_pool_ends_run_worker_with_the_error(
    sdk: Sdk, tmp_path: Path
) -> None:
    with running_server(tmp_path, TOKENS + DEFAULT_CONFIG) as server:
        with sdk.worker(server.target, token="not-" + WORKER_TOKEN, registered=False) as refused:
            exit_event = refused.expect("exit", timeout=20)
            assert refused.proc.wait(10) == 1
        assert exit_event["code"] == "Unauthenticated"
        with sdk.worker(server.target, token=CLIENT_TOKEN, registered=False) as wrong_role:
            assert wrong_role.expect("exit", timeout=20)["code"] == "PermissionDenied"
        with sdk.worker(server.target, token=WORKER_TOKEN) as accepted:
            assert accepted.registration["slots"] == 1
        with sdk.worker(server.target, pool="nope", token=WORKER_TOKEN, registered=False) as unknown_pool:
            exit_event = unknown_pool.expect("exit", timeout=20)
        assert exit_event["code"] == "NotFound" and "unknown pool 'nope'" in exit_event["error"]


async def test_tls_and_mtls(sdk: Sdk, tmp_path: Path) -> None:
    """TLS with a private CA (to localhost: rustls 0.20 checks DNS names only), and TLS settings with an
    http:// target refused rather than used in plaintext; then mTLS to the server's IP address (with the
    flags the SDK needs for that), where the worker's certificate is its identity (no token)."""
    ca, ca_key = new_ca(tmp_path / "ca.pem", tmp_path / "ca.key", "cronoq test CA")
    cert, key = issue(tmp_path, "server", "/CN=127.0.0.1", "IP:127.0.0.1,DNS:localhost", ca, ca_key)
    worker_cert, worker_key = issue(tmp_path, "worker", "/CN=worker-1", "DNS:worker-1.internal", ca, ca_key)
    tls = f'[server.tls]\ncert_path = "{cert}"\nkey_path = "{key}"\n'
    https = ssl.create_default_context(cafile=str(ca))
    trusted = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    with running_server(tmp_path / "tls", tls + DEFAULT_CONFIG, ssl_context=https) as server:
        port = server.target.rsplit(":", 1)[1]
        with sdk.worker(f"https://localhost:{port}", "-ca", str(ca)):
            async with Client(f"https://{server.target}", credentials=trusted) as client:
                done = await client.submit(do("complete", output="over tls"), wait=True, wait_timeout=10)
            assert done.result is not None and done.result.text() == "over tls"
        with sdk.worker(f"http://localhost:{port}", "-ca", str(ca), registered=False) as plain:
            refused = plain.expect("exit", timeout=20)
        assert "use https://" in refused["error"]  # TLS settings never mean plaintext
    mtls = (
        tls.replace("[server.tls]\n", f'[server.tls]\nclient_ca_path = "{ca}"\n')
        + '[[auth.certs]]\ndns_name = "worker-1.internal"\nrole = "worker"\npools = ["default"]\n'
        + token(CLIENT_TOKEN, "client")
    )
    https.load_cert_chain(str(worker_cert), str(worker_key))
    with_cert = grpc.ssl_channel_credentials(
        ca.read_bytes(), worker_key.read_bytes(), worker_cert.read_bytes()
    )
    with (
        running_server(tmp_path / "mtls", mtls + DEFAULT_CONFIG, ssl_context=https) as server,
        sdk.worker(
            server.target, "-ca", str(ca), "-cert", str(worker_cert), "-key", str(worker_key), *sdk.ip_tls
        ),
    ):
        async with Client(f"https://{server.target}", credentials=with_cert, token=CLIENT_TOKEN) as client:
            done = await client.submit(do("complete", output="mutual"), wait=True, wait_timeout=10)
        assert done.result is not None and done.result.text() == "mutual"


SHARDS = (ShardSpec("a", 1, ("a1", "py")), ShardSpec("b", 2, ("b1",)))


async def test_shard_redirects_from_the_router_and_from_the_wrong_shard(sdk: Sdk, tmp_path: Path) -> None:
    """Workers pointed at the router, and one at the wrong shard, each end up on its pool's shard,
    and serve the cluster beside a Python worker."""

    async def python_handler(lease: Lease) -> str:
        return f"python: {lease.text()}"

    with routed_cluster(tmp_path, SHARDS, TOKENS) as (router, shards):
        a, b = shards["a"].target, shards["b"].target
        with (
            sdk.worker(router.target, pool="a1", token=WORKER_TOKEN) as on_a,
            sdk.worker(router.target, pool="b1", token=WORKER_TOKEN) as on_b,
            sdk.worker(a, "-name", "misdirected", pool="b1", token=WORKER_TOKEN) as misdirected,
        ):
            assert (on_a.registration["address"], on_b.registration["address"]) == (a, b)
            assert misdirected.registration["address"] == b
            async with (
                worker(router.target, python_handler, pool="py", token=WORKER_TOKEN),
                Client(router.target, token=CLIENT_TOKEN) as client,
            ):
                expected = {"a1": "a1", "b1": "b1", "py": 'python: {"do": "complete", "output": "py"}'}
                subs = {
                    pool: await client.submit(do("complete", output=pool), pool=pool) for pool in expected
                }
                for pool, sub in subs.items():
                    result = await client.wait(sub.id, timeout=10)
                    assert (result.status, result.text()) == ("succeeded", expected[pool])


async def test_reconnects_when_the_server_comes_back(sdk: Sdk, tmp_path: Path) -> None:
    with running_server(tmp_path, DEFAULT_CONFIG) as server, sdk.worker(server.target) as w:
        server.stop()
        server.start()  # the same ports
        w.expect("registered", timeout=20)
        async with Client(server.target) as client:
            done = await client.submit(do("complete"), wait=True, wait_timeout=10)
        assert done.result is not None and done.result.text() == "attempt 1"
        assert w.proc.poll() is None
