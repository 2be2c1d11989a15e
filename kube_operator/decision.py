"""The operator's decision, without I/O: what one scaler's Deployment should have, and the status that
says what was done and why.

Given a scaler's spec (or its problems), the pool's desired slots (or why they are unknown) and the
Deployment's current replicas (or why they are unknown), :func:`decide` returns the replicas to set
(None: leave the Deployment alone) and the scaler's new status. The loop in :mod:`.reconciler` does
the reading and writing around it; everything that can be decided is decided here and tested case by
case.

The rule: ``replicas = clamp(ceil(desired / slotsPerReplica), minReplicas, maxReplicas)``, written only
when it differs from the current value, and only when both are known: a server that cannot be read, a
pool it does not report, a Deployment that cannot be found leave the replicas as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .readings import INVALID_SPEC, SCALED, Desired, Unknown
from .scaler import InvalidSpec, ScalerSpec

READY = "Ready"
# The status fields the operator owns; a write sets each (None removes one, as merge patches do).
STATUS_FIELDS = (
    "observedGeneration",
    "desiredSlots",
    "replicas",
    "reason",
    "message",
    "lastScaleTime",
    "conditions",
)


@dataclass(frozen=True, slots=True)
class Observation:
    """What one round saw for a valid scaler: the pool's desired slots and the Deployment's replicas
    (``spec.replicas`` of its scale subresource), each possibly unknown."""

    spec: ScalerSpec
    reading: Desired | Unknown
    current: int | Unknown


@dataclass(frozen=True, slots=True)
class Decision:
    """``replicas`` to set on the Deployment (None: leave it alone) and the scaler's status."""

    replicas: int | None
    status: dict[str, Any]


def target_replicas(spec: ScalerSpec, desired: int) -> tuple[int, str]:
    """The replicas for ``desired`` slots, and how they were reached (for the status message)."""
    needed = math.ceil(max(desired, 0) / spec.slots_per_replica)
    how = f"{desired} desired slots / {spec.slots_per_replica} per replica = {needed} replicas"
    if needed < spec.min_replicas:
        return spec.min_replicas, f"{how}, raised to minReplicas {spec.min_replicas}"
    if needed > spec.max_replicas:
        return spec.max_replicas, f"{how}, capped at maxReplicas {spec.max_replicas}"
    return needed, how


def decide(
    seen: Observation | InvalidSpec, *, generation: int, previous: Mapping[str, Any], now: datetime
) -> Decision:
    """The decision for one scaler; ``previous`` is its current status (``{}`` for a new one), from
    which the times of the last scale and of the last Ready transition carry over; ``generation`` is its
    ``metadata.generation``; ``now`` stamps what changes now."""
    status = _StatusBuilder(generation, previous, now)
    if isinstance(seen, InvalidSpec):
        return Decision(None, status.not_scaled(INVALID_SPEC, seen.message, desired=None, replicas=None))
    current = seen.current if isinstance(seen.current, int) else None
    if isinstance(seen.reading, Unknown):
        message = seen.reading.message
        if current is not None:
            message += f"; deployment {seen.spec.deployment!r} left at {current} replicas"
        return Decision(None, status.not_scaled(seen.reading.reason, message, desired=None, replicas=current))
    desired = seen.reading.slots
    if isinstance(seen.current, Unknown):
        return Decision(
            None, status.not_scaled(seen.current.reason, seen.current.message, desired=desired, replicas=None)
        )
    replicas, how = target_replicas(seen.spec, desired)
    changed = replicas != seen.current
    return Decision(
        replicas if changed else None,
        status.scaled(how, desired=desired, replicas=replicas, now_scaled=changed),
    )


def status_changed(previous: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether writing ``status`` would change the scaler's ``previous`` status (the fields the operator
    owns; a None field is one the write removes). Unchanged statuses are not written, so a steady scaler
    costs the API server reads only."""
    wanted = {key: value for key, value in status.items() if value is not None}
    held = {key: previous[key] for key in STATUS_FIELDS if key in previous and previous[key] is not None}
    return wanted != held


def timestamp(moment: datetime) -> str:
    """RFC 3339 in UTC to the second, as Kubernetes writes times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _StatusBuilder:
    """Builds a status that carries over the times of ``previous`` where nothing changed."""

    def __init__(self, generation: int, previous: Mapping[str, Any], now: datetime) -> None:
        self._generation = generation
        self._previous = previous
        self._now = timestamp(now)

    def scaled(self, message: str, *, desired: int, replicas: int, now_scaled: bool) -> dict[str, Any]:
        last_scale = self._now if now_scaled else self._previous.get("lastScaleTime")
        return self._status(SCALED, message, desired, replicas, ready=True, last_scale=last_scale)

    def not_scaled(
        self, reason: str, message: str, *, desired: int | None, replicas: int | None
    ) -> dict[str, Any]:
        last_scale = self._previous.get("lastScaleTime")
        return self._status(reason, message, desired, replicas, ready=False, last_scale=last_scale)

    def _status(
        self,
        reason: str,
        message: str,
        desired: int | None,
        replicas: int | None,
        *,
        ready: bool,
        last_scale: object,
    ) -> dict[str, Any]:
        return {
            "observedGeneration": self._generation,
            "desiredSlots": desired,
            "replicas": replicas,
            "reason": reason,
            "message": message,
            "lastScaleTime": last_scale if isinstance(last_scale, str) else None,
            "conditions": [self._ready(ready, reason, message)],
        }

    def _ready(self, ready: bool, reason: str, message: str) -> dict[str, Any]:
        """The Ready condition; its ``lastTransitionTime`` moves only when its status flips."""
        state = "True" if ready else "False"
        before = _condition(self._previous, READY)
        since = before.get("lastTransitionTime") if before.get("status") == state else None
        return {
            "type": READY,
            "status": state,
            "reason": reason,
            "message": message,
            "observedGeneration": self._generation,
            "lastTransitionTime": since if isinstance(since, str) else self._now,
        }


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition
    return {}
