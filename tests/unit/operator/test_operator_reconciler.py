"""The loop around the decision, against the fake Kubernetes API (in this process) with scripted
snapshots and a clock the test moves: one snapshot per server per round, only due scalers, one failing
scaler never stops the others, and a stop request ends the loop at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from cronoq.client import Snapshot
from cronoq.v1 import cronoq_pb2 as pb
from kube_operator.config import OperatorConfig, ServerEntry
from kube_operator.kube import KubeApi, KubeError, KubeTarget
from kube_operator.readings import Unknown
from kube_operator.reconciler import Reconciler
from tests.kube_fake import FakeKube, make_app

TOKEN = "kube-token-0123456789"
CONFIG = OperatorConfig(
    servers=(
        ServerEntry("main", "http://a:7070", token_env="T"),
        ServerEntry("other", "http://b:7070", token_env="T"),
    ),
    interval_s=15.0,
)


def snapshot(**desired: int) -> Snapshot:
    return Snapshot.from_proto(
        pb.SnapshotResponse(pools=[pb.PoolSnapshot(name=n, desired=d) for n, d in desired.items()])
    )


@dataclass
class ScriptedServers:
    """Snapshots by server name; records the names each round asked for."""

    answers: dict[str, Snapshot | Unknown]
    rounds: list[list[str]] = field(default_factory=list)
    asked: asyncio.Event = field(default_factory=asyncio.Event)

    async def snapshots(self, names: Iterable[str]) -> dict[str, Snapshot | Unknown]:
        wanted = sorted({name for name in names if name in self.answers})
        self.rounds.append(wanted)
        self.asked.set()
        return {name: self.answers[name] for name in wanted}


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Setup:
    kube: FakeKube
    api: KubeApi
    servers: ScriptedServers
    clock: Clock

    def reconciler(self, config: OperatorConfig = CONFIG, api: KubeApi | None = None) -> Reconciler:
        return Reconciler(config, api or self.api, self.servers, clock=self.clock)


def spec(server: str, pool: str, deployment: str, interval: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "server": server,
        "pool": pool,
        "deployment": deployment,
        "slotsPerReplica": 2,
        "maxReplicas": 10,
    }
    return body | ({"intervalSeconds": interval} if interval else {})


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    kube = FakeKube(tmp_path, TOKEN)
    server = TestServer(make_app(TOKEN), host="127.0.0.1", port=kube.port)
    await server.start_server()
    kube.token_file.write_text(TOKEN)
    servers = ScriptedServers({"main": snapshot(cpu=6, gpu=3), "other": snapshot(io=1)})
    try:
        async with KubeApi(KubeTarget(kube.url, kube.token_file, None)) as api:
            yield Setup(kube, api, servers, Clock())
    finally:
        await kube.stop()
        await server.close()


async def add(kube: FakeKube, namespace: str, name: str, body: dict[str, Any], replicas: int = 1) -> None:
    await kube.create_deployment(namespace, body["deployment"], replicas)
    await kube.create_scaler(namespace, name, body)


async def test_each_server_is_read_once_per_round(setup: Setup) -> None:
    kube = setup.kube
    await add(kube, "a", "cpu", spec("main", "cpu", "cpu-workers"))
    await add(kube, "a", "gpu", spec("main", "gpu", "gpu-workers"))
    await add(kube, "b", "io", spec("other", "io", "io-workers"))
    await add(kube, "b", "lost", spec("nowhere", "x", "lost-workers"))
    await setup.reconciler().round()
    assert setup.servers.rounds == [["main", "other"]]
    assert [await kube.replicas("a", "cpu-workers"), await kube.replicas("a", "gpu-workers")] == [3, 2]
    assert await kube.replicas("b", "io-workers") == 1
    assert (await kube.scaler_status("b", "lost"))["reason"] == "UnknownServer"


async def test_only_due_scalers_are_reconciled(setup: Setup) -> None:
    kube, clock = setup.kube, setup.clock
    await add(kube, "a", "fast", spec("main", "cpu", "fast-workers", interval=1))
    await add(kube, "a", "slow", spec("other", "io", "slow-workers"))  # the operator's 15 s
    reconciler = setup.reconciler()
    assert await reconciler.round() == pytest.approx(1.0)
    assert setup.servers.rounds == [["main", "other"]]

    clock.now += 0.5
    assert await reconciler.round() == pytest.approx(0.5)
    assert setup.servers.rounds[1:] == [[]]  # nothing due, nothing read

    clock.now += 0.5
    await reconciler.round()
    assert setup.servers.rounds[2:] == [["main"]]

    # A changed spec (a new generation) is due at once, whatever its interval.
    await kube.patch_scaler("a", "slow", {"spec": {"maxReplicas": 5}})
    clock.now += 0.1
    await reconciler.round()
    assert setup.servers.rounds[3:] == [["other"]]
    assert (await kube.scaler_status("a", "slow"))["observedGeneration"] == 2


async def test_a_failing_scaler_does_not_stop_the_others(setup: Setup) -> None:
    class Flaky(KubeApi):
        async def patch_status(self, namespace: str, name: str, status: Any) -> None:
            if name == "first":
                raise RuntimeError("boom")
            await super().patch_status(namespace, name, status)

    await add(setup.kube, "a", "first", spec("main", "cpu", "first-workers"))
    await add(setup.kube, "a", "second", spec("main", "cpu", "second-workers"))
    async with Flaky(KubeTarget(setup.kube.url, setup.kube.token_file, None)) as flaky:
        await setup.reconciler(api=flaky).round()
    assert (await setup.kube.scaler_status("a", "second"))["reason"] == "Scaled"
    assert await setup.kube.replicas("a", "second-workers") == 3
    assert await setup.kube.scaler_status("a", "first") == {}


async def test_a_refused_scale_change_is_reported(setup: Setup) -> None:
    class Conflicting(KubeApi):
        async def set_scale(
            self, namespace: str, deployment: str, replicas: int, resource_version: str
        ) -> None:
            raise KubeError(409, "the object has been modified")

    await add(setup.kube, "a", "cpu", spec("main", "cpu", "cpu-workers"))
    async with Conflicting(KubeTarget(setup.kube.url, setup.kube.token_file, None)) as conflicting:
        await setup.reconciler(api=conflicting).round()
    status = await setup.kube.scaler_status("a", "cpu")
    assert status["reason"] == "KubernetesError"
    assert status["message"] == "cannot scale deployment 'cpu-workers': 409: the object has been modified"
    assert status["desiredSlots"] == 6 and "lastScaleTime" not in status
    assert await setup.kube.replicas("a", "cpu-workers") == 1


async def test_namespaces_restrict_the_scalers(setup: Setup) -> None:
    await add(setup.kube, "a", "cpu", spec("main", "cpu", "cpu-workers"))
    await add(setup.kube, "b", "io", spec("other", "io", "io-workers"), replicas=4)
    await setup.reconciler(OperatorConfig(servers=CONFIG.servers, namespaces=("a",))).round()
    assert (await setup.kube.scaler_status("a", "cpu"))["reason"] == "Scaled"
    assert await setup.kube.scaler_status("b", "io") == {}
    assert await setup.kube.replicas("b", "io-workers") == 4


async def test_an_unreachable_api_server_means_trying_again_after_the_interval(setup: Setup) -> None:
    async with KubeApi(KubeTarget("http://127.0.0.1:9", None, None)) as unreachable:
        assert await setup.reconciler(api=unreachable).round() == CONFIG.interval_s
    assert setup.servers.rounds == []


async def test_stopping_interrupts_the_pause(setup: Setup) -> None:
    await add(setup.kube, "a", "cpu", spec("main", "cpu", "cpu-workers"))
    stop = asyncio.Event()
    running = asyncio.create_task(setup.reconciler().run(stop))
    await asyncio.wait_for(setup.servers.asked.wait(), 5)
    stop.set()
    await asyncio.wait_for(running, 2)  # the pause was 15 s
    assert len(setup.servers.rounds) == 1
