"""Leader election on a ``coordination.k8s.io/v1`` Lease, as Kubernetes' own controllers do it, so that
of several operator replicas exactly one acts and another takes over when it goes.

Every replica tries every :attr:`Elector.retry_s` to claim or renew the Lease. A claim is a replace of
the Lease at the ``resourceVersion`` read, so of two replicas claiming at once the API server lets one
through (the other gets 409). A replica takes the Lease only when it is free (no holder: released by a
leader that stopped) or when its holder has not renewed it for ``leaseDurationSeconds`` **as this
replica observed it** (measured on its own monotonic clock from when it saw the Lease last change, so
clocks that differ between nodes do not matter). A leader that has not renewed within :attr:`renew_s`
(two thirds of the duration) stops acting before anyone else may take over; a leader that stops
releases the Lease, so the standby takes over at its next try.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from cronoq.logs import get_logger

from .kube import KubeApi, KubeError

log = get_logger("cronoq.operator")


def micro_time(moment: datetime) -> str:
    """A Kubernetes ``MicroTime``: RFC 3339 in UTC with microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    """Holds (or waits for) the Lease ``namespace/name`` as ``identity``."""

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        duration_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self.duration_s = duration_s
        self.renew_s = duration_s * 2 / 3
        self.retry_s = duration_s / 5
        self._clock = clock
        self._wall = wall
        self._observed_version = ""
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # when the last successful claim or renewal started

    @property
    def is_leader(self) -> bool:
        """Whether this replica may act now: it holds the Lease, renewed within :attr:`renew_s`."""
        return self._renewed_at is not None and self._clock() - self._renewed_at < self.renew_s

    async def run(self) -> None:
        """Claim or renew every :attr:`retry_s` until cancelled."""
        while True:
            await self.try_once()
            await asyncio.sleep(self.retry_s)

    async def try_once(self) -> bool:
        """One claim or renewal; whether this replica leads after it."""
        was_leader = self.is_leader
        started = self._clock()
        try:
            claimed = await self._claim(started)
        except KubeError as err:
            log.warning("lease_unavailable", lease=f"{self._namespace}/{self._name}", error=str(err))
            claimed = False
        if claimed:
            self._renewed_at = started
        leads = self.is_leader
        if leads != was_leader:
            emit = log.info if leads else log.warning
            emit(
                "leadership_changed",
                leader=leads,
                identity=self.identity,
                lease=f"{self._namespace}/{self._name}",
            )
        return leads

    async def release(self) -> None:
        """Give the Lease up (when stopping), so that a standby need not wait for it to expire."""
        if not self.is_leader:
            return
        self._renewed_at = None
        try:
            lease = await self._kube.get_lease(self._namespace, self._name)
            spec = _table(lease, "spec")
            if spec.get("holderIdentity") == self.identity:
                lease["spec"] = {**spec, "holderIdentity": None, "leaseDurationSeconds": 1}
                await self._kube.replace_lease(self._namespace, self._name, lease)
        except KubeError as err:
            log.warning("lease_not_released", lease=f"{self._namespace}/{self._name}", error=str(err))
        else:
            log.info("lease_released", identity=self.identity)

    async def _claim(self, now: float) -> bool:
        try:
            lease = await self._kube.get_lease(self._namespace, self._name)
        except KubeError as err:
            if err.status != 404:
                raise
            return await self._create()
        meta, spec = _table(lease, "metadata"), _table(lease, "spec")
        version = str(meta.get("resourceVersion", ""))
        if version != self._observed_version:
            self._observed_version, self._observed_at = version, now
        holder = spec.get("holderIdentity") or ""
        duration = spec.get("leaseDurationSeconds")
        duration = duration if isinstance(duration, int) and duration > 0 else self.duration_s
        if holder and holder != self.identity and now - self._observed_at < duration:
            return False  # another replica holds it and renews it
        stamp = micro_time(self._wall())
        transitions = spec.get("leaseTransitions")
        transitions = transitions if isinstance(transitions, int) else 0
        renewed = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.duration_s),
            "renewTime": stamp,
        }
        if holder != self.identity:
            renewed |= {"acquireTime": stamp, "leaseTransitions": transitions + 1}
        lease["spec"] = renewed
        try:
            await self._kube.replace_lease(self._namespace, self._name, lease)
        except KubeError as err:
            if err.status == 409:  # another replica wrote it first
                return False
            raise
        return True

    async def _create(self) -> bool:
        stamp = micro_time(self._wall())
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._name, "namespace": self._namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": round(self.duration_s),
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            },
        }
        try:
            await self._kube.create_lease(self._namespace, lease)
        except KubeError as err:
            if err.status == 409:  # another replica created it first
                return False
            raise
        return True


def _table(obj: dict[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}
