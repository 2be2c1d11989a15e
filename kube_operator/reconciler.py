"""The operator's loop: the reads and writes around :func:`~.decision.decide`.

A round takes the scalers the watch keeps current (:class:`~.inventory.Inventory`), picks those that
are due (their ``intervalSeconds``, else the operator's ``interval_s``, has passed since they were last
reconciled, or their spec changed), reads the snapshot of each server they name once, then for each due
scaler reads its Deployment's scale, decides, sets the replicas when they differ and writes the status
when it changed, and records an Event on the scaler when it scaled or when it starts leaving the
Deployment alone. Every scaler is handled on its own: an error in one is logged and recorded, and the
others go on. The loop sleeps until the next scaler is due, until the watch brings a change, or until
it is told to stop. Only the leader (:class:`~.election.Elector`) runs rounds; a standby waits, and
reconciles every scaler at once when it takes over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from cronoq.client import Snapshot
from cronoq.logs import get_logger

from .config import OperatorConfig
from .decision import Decision, Observation, decide, status_changed, timestamp
from .election import micro_time
from .inventory import Inventory
from .kube import KubeApi, KubeError, Scale
from .metrics import Stats
from .readings import (
    DEPLOYMENT_NOT_FOUND,
    KUBERNETES_ERROR,
    SCALED,
    Unknown,
    pool_reading,
    unknown,
)
from .scaler import GROUP, KIND, VERSION, InvalidSpec, ScalerRef, ScalerSpec, parse_spec

log = get_logger("cronoq.operator")

EVENT_SOURCE = "cronoq-operator"
_EARLY = 0.001  # a wake-up this close to a due time counts as on time (timers fire a little early)


class SnapshotSource(Protocol):
    """Where a round's snapshots come from (:class:`~.servers.Servers`)."""

    async def snapshots(self, names: Iterable[str]) -> dict[str, Snapshot | Unknown]: ...


class Leadership(Protocol):
    """Whether this replica may act (:class:`~.election.Elector`), and how often that is tried."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def retry_s(self) -> float: ...

    @property
    def identity(self) -> str: ...


@dataclass(frozen=True, slots=True)
class _Seen:
    """When a scaler was last reconciled (monotonic seconds) and at which generation."""

    at: float
    generation: int


@dataclass(frozen=True, slots=True)
class _Scaler:
    """A listed scaler: where it is, the object as listed, and its spec as the operator reads it."""

    ref: ScalerRef
    obj: Mapping[str, Any]
    spec: ScalerSpec | InvalidSpec


class Reconciler:
    """Runs rounds until stopped. ``clock`` (monotonic) times the intervals, ``wall`` stamps statuses."""

    def __init__(
        self,
        config: OperatorConfig,
        kube: KubeApi,
        servers: SnapshotSource,
        inventory: Inventory,
        leadership: Leadership,
        stats: Stats,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._config = config
        self._kube = kube
        self._servers = servers
        self._inventory = inventory
        self._leadership = leadership
        self._stats = stats
        self._clock = clock
        self._wall = wall
        self._seen: dict[str, _Seen] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until ``stop`` is set; a round that fails as a whole (a bug, not a scaler's problem)
        is logged and tried again after ``interval_s``. A change the watch brings ends the pause."""
        changed = self._inventory.changed
        while not stop.is_set():
            changed.clear()
            try:
                pause = await self.round()
            except Exception:
                log.exception("round_failed")
                pause = self._config.interval_s
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(changed.wait())]
            try:
                await asyncio.wait(waits, timeout=pause, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()

    async def round(self) -> float:
        """Reconcile every due scaler; the seconds until the next one is due. A standby forgets when it
        last reconciled anything (it did not; the leader did), so that it reconciles every scaler as soon
        as it leads. Nothing is done before the scalers have been listed."""
        if not self._leadership.is_leader:
            self._seen.clear()
            return min(self._leadership.retry_s, self._config.interval_s)
        if not self._inventory.synced:  # not listed yet: the list wakes the loop
            return self._config.interval_s
        now = self._clock()
        scalers = [_Scaler(ScalerRef.of(obj), obj, parse_spec(obj)) for obj in self._inventory.scalers()]
        due = [item for item in scalers if self._is_due(item, now)]
        named = {item.spec.server for item in due if isinstance(item.spec, ScalerSpec)}
        snapshots = await self._servers.snapshots(named)
        self._stats.read_errors += sum(1 for answer in snapshots.values() if isinstance(answer, Unknown))
        for item in due:
            if not self._leadership.is_leader:  # lost the Lease during the round: the next leader acts
                break
            try:
                await self._reconcile(item, snapshots)
            except Exception:  # one scaler's failure must not stop the others
                log.exception("scaler_failed", scaler=str(item.ref))
            self._seen[item.ref.key] = _Seen(now, item.ref.generation)
        present = {item.ref.key for item in scalers}
        self._seen = {key: seen for key, seen in self._seen.items() if key in present}
        return self._pause(scalers, self._clock())

    def _interval(self, item: _Scaler) -> float:
        """The scaler's own ``intervalSeconds`` when its spec is valid, else the operator's ``interval_s``."""
        if isinstance(item.spec, ScalerSpec) and item.spec.interval_s is not None:
            return float(item.spec.interval_s)
        return self._config.interval_s

    def _is_due(self, item: _Scaler, now: float) -> bool:
        seen = self._seen.get(item.ref.key)
        return (
            seen is None
            or seen.generation != item.ref.generation
            or now + _EARLY >= seen.at + self._interval(item)
        )

    def _pause(self, scalers: Sequence[_Scaler], now: float) -> float:
        pause = self._config.interval_s
        for item in scalers:
            seen = self._seen.get(item.ref.key)
            if seen is not None:
                pause = min(pause, seen.at + self._interval(item) - now)
        return max(pause, 0.0)

    async def _reconcile(self, item: _Scaler, snapshots: Mapping[str, Snapshot | Unknown]) -> None:
        ref, spec = item.ref, item.spec
        status = item.obj.get("status")
        previous: Mapping[str, Any] = status if isinstance(status, Mapping) else {}
        if isinstance(spec, InvalidSpec):
            decision = self._decide(spec, ref, previous)
        else:
            reading = pool_reading(spec.server, spec.pool, snapshots.get(spec.server))
            scale = await self._scale(ref.namespace, spec.deployment)
            current = scale.replicas if isinstance(scale, Scale) else scale
            decision = self._decide(Observation(spec, reading, current), ref, previous)
            if decision.replicas is not None and isinstance(scale, Scale):
                try:
                    await self._kube.set_scale(
                        ref.namespace, spec.deployment, decision.replicas, scale.resource_version
                    )
                except KubeError as err:
                    why = unknown(KUBERNETES_ERROR, f"cannot scale deployment {spec.deployment!r}: {err}")
                    decision = self._decide(Observation(spec, reading, why), ref, previous)
                else:
                    self._stats.scaled += 1
                    log.info(
                        "deployment_scaled",
                        scaler=str(ref),
                        deployment=spec.deployment,
                        replicas=decision.replicas,
                        previous=scale.replicas,
                        desired_slots=decision.status["desiredSlots"],
                    )
                    await self._event(
                        item.obj,
                        "Normal",
                        SCALED,
                        f"deployment {spec.deployment!r} scaled from {scale.replicas} to {decision.replicas} "
                        f"replicas: {decision.status['message']}",
                    )
        reason = decision.status["reason"]
        self._stats.decided(reason)
        if status_changed(previous, decision.status):
            written = await self._kube.patch_status(ref.namespace, ref.name, decision.status)
            self._inventory.update(written)
            if previous.get("reason") != reason:
                self._log_status(ref, decision)
                if reason != SCALED:
                    await self._event(item.obj, "Warning", reason, decision.status["message"])

    async def _event(self, scaler: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """Records a ``core/v1`` Event on the scaler (``kubectl describe cws`` shows it). An Event the API
        server refuses is logged and does not change what was done."""
        ref = ScalerRef.of(scaler)
        meta = scaler.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        stamp = self._wall()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name}.", "namespace": ref.namespace},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "namespace": ref.namespace,
                "name": ref.name,
                "uid": ref.uid,
                "resourceVersion": version,
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "reportingInstance": self._leadership.identity,
            "firstTimestamp": timestamp(stamp),
            "lastTimestamp": timestamp(stamp),
            "eventTime": micro_time(stamp),
            "action": "Scale",
            "count": 1,
        }
        try:
            await self._kube.create_event(ref.namespace, event)
        except KubeError as err:
            log.warning("event_not_recorded", scaler=str(ref), reason=reason, error=str(err))

    def _decide(
        self, seen: Observation | InvalidSpec, ref: ScalerRef, previous: Mapping[str, Any]
    ) -> Decision:
        return decide(seen, generation=ref.generation, previous=previous, now=self._wall())

    async def _scale(self, namespace: str, deployment: str) -> Scale | Unknown:
        try:
            return await self._kube.get_scale(namespace, deployment)
        except KubeError as err:
            if err.status == 404:
                return unknown(
                    DEPLOYMENT_NOT_FOUND, f"no deployment {deployment!r} in namespace {namespace!r}"
                )
            return unknown(KUBERNETES_ERROR, f"cannot read the scale of deployment {deployment!r}: {err}")

    @staticmethod
    def _log_status(ref: ScalerRef, decision: Decision) -> None:
        """A line when a scaler's reason changes (not at every round: a server that stays down is
        logged once, when its scalers start saying so)."""
        reason = decision.status["reason"]
        emit = log.info if reason == SCALED else log.warning
        emit("scaler_status", scaler=str(ref), reason=reason, message=decision.status["message"])
