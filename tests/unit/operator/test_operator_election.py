"""Leader election on a Lease, against the fake Kubernetes API (in this process) with a clock the test
moves: one holder at a time, a standby takes over only after the Lease went unrenewed for its duration
as the standby saw it, at once after a release, and a leader that cannot renew stops leading before
anyone may take over."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kube_operator.election import Elector
from kube_operator.kube import KubeApi, KubeError, KubeTarget
from tests.kube_fake import FakeKube
from tests.unit.operator.fakekit import Clock, in_process_fake

DURATION = 15.0


@dataclass
class Setup:
    kube: FakeKube
    api: KubeApi
    clock: Clock

    def elector(self, identity: str, api: KubeApi | None = None) -> Elector:
        return Elector(api or self.api, "ops", "cronoq-operator", identity, DURATION, clock=self.clock)


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    async with in_process_fake(tmp_path) as (kube, api):
        yield Setup(kube, api, Clock())


async def test_one_holder_and_a_takeover_after_the_lease_went_unrenewed(setup: Setup) -> None:
    first, second = setup.elector("first"), setup.elector("second")
    assert await first.try_once() and not await second.try_once()
    lease = await setup.kube.lease("ops", "cronoq-operator")
    assert lease["spec"]["holderIdentity"] == "first" and lease["spec"]["leaseDurationSeconds"] == 15
    # The leader renews; the standby sees the Lease change and keeps waiting.
    setup.clock.now += 10
    assert await first.try_once() and not await second.try_once()
    # The leader stops renewing: just short of the duration since the standby saw the last renewal,
    # it still waits; then it takes over (and the old leader, past its renew deadline, no longer leads).
    setup.clock.now += DURATION - 0.1
    assert not await second.try_once()
    setup.clock.now += 0.2
    assert not first.is_leader
    assert await second.try_once()
    lease = await setup.kube.lease("ops", "cronoq-operator")
    assert lease["spec"]["holderIdentity"] == "second" and lease["spec"]["leaseTransitions"] == 1
    assert not await first.try_once()  # it sees the new holder renewing


async def test_a_released_lease_is_taken_at_once(setup: Setup) -> None:
    first, second = setup.elector("first"), setup.elector("second")
    assert await first.try_once() and not await second.try_once()
    await first.release()
    assert not first.is_leader
    assert await second.try_once()  # no waiting for the duration


async def test_a_leader_that_cannot_renew_stops_before_anyone_may_take_over(setup: Setup) -> None:
    class Unreachable(KubeApi):
        async def get_lease(self, namespace: str, name: str) -> dict[str, object]:
            raise KubeError(0, "cannot reach the Kubernetes API")

    leader = setup.elector("leader")
    assert await leader.try_once()
    async with Unreachable(KubeTarget(setup.kube.url, setup.kube.token_file, None)) as unreachable:
        cut_off = setup.elector("leader", api=unreachable)
        cut_off._renewed_at = leader._renewed_at  # the same replica, now cut off from the API server
        setup.clock.now += leader.renew_s - 0.1
        assert await cut_off.try_once()  # within its renew deadline
        setup.clock.now += 0.2
        assert not await cut_off.try_once()
    assert leader.renew_s < DURATION  # so it stopped before a standby could take over
