"""The loop around the decision, against the fake Kubernetes API (in this process) with scripted
snapshots and a clock the test moves: one snapshot per server per round, only due scalers, one failing
scaler never stops the others, a standby does nothing, Events say what was done, a change the watch
brings starts a round at once, and a stop request ends the loop at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cronoq.client import Snapshot
from cronoq.v1 import cronoq_pb2 as pb
from kube_operator.config import OperatorConfig, ServerEntry
from kube_operator.inventory import Inventory
from kube_operator.kube import KubeApi, KubeError, KubeTarget
from kube_operator.metrics import Stats
from kube_operator.readings import Unknown
from kube_operator.reconciler import Reconciler
from tests.kube_fake import FakeKube
from tests.unit.operator.fakekit import Clock, in_process_fake

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
class Leader:
    """Leadership as the test sets it."""

    is_leader: bool = True
    retry_s: float = 0.5
    identity: str = "test-operator"


@dataclass
class Rounds:
    """A reconciler and the inventory it reads, listed afresh before each round (as the watch would
    have brought it up to date)."""

    reconciler: Reconciler
    inventory: Inventory
    stats: Stats

    async def round(self) -> float:
        await self.inventory.resync()
        return await self.reconciler.round()


@dataclass
class Setup:
    kube: FakeKube
    api: KubeApi
    servers: ScriptedServers
    clock: Clock
    leader: Leader = field(default_factory=Leader)

    def reconciler(self, config: OperatorConfig = CONFIG, api: KubeApi | None = None) -> Rounds:
        inventory, stats = Inventory(self.api, config.namespaces), Stats()
        reconciler = Reconciler(
            config, api or self.api, self.servers, inventory, self.leader, stats, clock=self.clock
        )
        return Rounds(reconciler, inventory, stats)


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
    servers = ScriptedServers({"main": snapshot(cpu=6, gpu=3), "other": snapshot(io=1)})
    async with in_process_fake(tmp_path) as (kube, api):
        yield Setup(kube, api, servers, Clock())


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
        async def patch_status(self, namespace: str, name: str, status: Any) -> dict[str, Any]:
            if name == "first":
                raise RuntimeError("boom")
            return await super().patch_status(namespace, name, status)

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


async def test_a_standby_acts_on_nothing_and_reconciles_everything_when_it_leads(setup: Setup) -> None:
    await add(setup.kube, "a", "cpu", spec("main", "cpu", "cpu-workers"))
    rounds = setup.reconciler()
    await rounds.round()
    assert await setup.kube.replicas("a", "cpu-workers") == 3
    await setup.kube.patch_scaler("a", "cpu", {"spec": {"slotsPerReplica": 1}})  # 6 slots: 6 replicas
    setup.leader.is_leader = False
    assert await rounds.round() == setup.leader.retry_s
    assert setup.servers.rounds == [["main"]] and await setup.kube.replicas("a", "cpu-workers") == 3
    setup.leader.is_leader = True
    setup.clock.now += 0.1  # long before the scaler's interval: due because it was never reconciled here
    await setup.kube.patch_scaler("a", "cpu", {"spec": {"slotsPerReplica": 1}})
    await rounds.round()
    assert await setup.kube.replicas("a", "cpu-workers") == 6


async def test_events_say_what_was_scaled_and_why_a_deployment_was_left_alone(setup: Setup) -> None:
    await add(setup.kube, "a", "cpu", spec("main", "cpu", "cpu-workers"))
    await add(setup.kube, "a", "lost", spec("nowhere", "x", "lost-workers"))
    rounds = setup.reconciler()
    await rounds.round()
    setup.clock.now += 20
    await rounds.round()  # nothing changed: no new Event
    events = {event["involvedObject"]["name"]: event for event in await setup.kube.events("a")}
    assert len(await setup.kube.events("a")) == 2
    scaled, lost = events["cpu"], events["lost"]
    assert (scaled["type"], scaled["reason"]) == ("Normal", "Scaled")
    assert scaled["message"] == (
        "deployment 'cpu-workers' scaled from 1 to 3 replicas: 6 desired slots / 2 per replica = 3 replicas"
    )
    assert scaled["involvedObject"]["kind"] == "CronoqWorkerScaler" and scaled["involvedObject"]["uid"]
    assert (lost["type"], lost["reason"]) == ("Warning", "UnknownServer")
    assert lost["message"].startswith("spec.server: no server named 'nowhere'")
    assert rounds.stats.scaled == 1
    assert rounds.stats.decisions == {("Scaled",): 2, ("UnknownServer",): 2}


async def test_a_watched_change_starts_a_round_at_once(setup: Setup) -> None:
    await add(setup.kube, "a", "cpu", spec("main", "cpu", "cpu-workers"))
    rounds = setup.reconciler()
    stop = asyncio.Event()
    running = [asyncio.create_task(rounds.inventory.run()), asyncio.create_task(rounds.reconciler.run(stop))]
    try:
        await asyncio.wait_for(setup.servers.asked.wait(), 5)
        setup.servers.asked.clear()
        # The next round is 15 s away; the new scaler is reconciled long before.
        await add(setup.kube, "a", "io", spec("other", "io", "io-workers"))
        await asyncio.wait_for(setup.servers.asked.wait(), 5)
        assert setup.servers.rounds[-1] == ["other"]
    finally:
        stop.set()
        running[0].cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def test_stopping_interrupts_the_pause(setup: Setup) -> None:
    await add(setup.kube, "a", "cpu", spec("main", "cpu", "cpu-workers"))
    rounds = setup.reconciler()
    await rounds.inventory.resync()
    stop = asyncio.Event()
    running = asyncio.create_task(rounds.reconciler.run(stop))
    await asyncio.wait_for(setup.servers.asked.wait(), 5)
    stop.set()
    await asyncio.wait_for(running, 2)  # the pause was 15 s
    assert len(setup.servers.rounds) == 1
