"""A ``CronoqWorkerScaler``'s spec, checked: what the CRD's schema enforces, checked again here.

The API server validates scalers against the CRD's schema, but the operator cannot count on it (a CRD
installed from an older chart, a schema edited by hand, an API server that skipped the check), and a
scaler it cannot trust must never move a Deployment. So every field is checked once more and each
problem names its field (``spec.minReplicas (5) must not exceed spec.maxReplicas (2)``), which the
scaler's status then shows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cronoq.config.rules import check_name

GROUP = "cronoq.io"
VERSION = "v1alpha1"
PLURAL = "cronoqworkerscalers"
KIND = "CronoqWorkerScaler"

MAX_INTERVAL_SECONDS = 3600
# A Deployment's name: an RFC 1123 subdomain.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_SUBDOMAIN = 253


@dataclass(frozen=True, slots=True)
class ScalerSpec:
    """A valid spec. ``interval_s`` is None when the scaler leaves it to the operator's ``interval_s``."""

    server: str
    pool: str
    deployment: str
    slots_per_replica: int
    min_replicas: int
    max_replicas: int
    interval_s: int | None = None


@dataclass(frozen=True, slots=True)
class InvalidSpec:
    """A spec the operator will not act on, and every reason why (each naming its field)."""

    problems: tuple[str, ...]

    @property
    def message(self) -> str:
        return "; ".join(self.problems)


@dataclass(frozen=True, slots=True)
class ScalerRef:
    """Where a scaler lives, and the parts of its metadata the operator tracks."""

    namespace: str
    name: str
    uid: str
    generation: int

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ScalerRef:
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        generation = meta.get("generation")
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            generation=generation if isinstance(generation, int) else 0,
        )

    @property
    def key(self) -> str:
        """What tells this scaler from others across rounds: its uid (a scaler deleted and created again
        under the same name is a new one), or its namespace and name if it has none."""
        return self.uid or str(self)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_spec(obj: Mapping[str, Any]) -> ScalerSpec | InvalidSpec:
    """The scaler's spec, or every problem with it."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return InvalidSpec(("spec: required",))
    problems: list[str] = []
    server = _name(spec, "server", check_name, problems)
    pool = _name(spec, "pool", check_name, problems)
    deployment = _name(spec, "deployment", _check_deployment_name, problems)
    slots = _integer(spec, "slotsPerReplica", problems, low=1)
    low = _integer(spec, "minReplicas", problems, low=0, default=0)
    high = _integer(spec, "maxReplicas", problems, low=1)
    interval = _integer(spec, "intervalSeconds", problems, low=1, high=MAX_INTERVAL_SECONDS, optional=True)
    if low is not None and high is not None and low > high:
        problems.append(f"spec.minReplicas ({low}) must not exceed spec.maxReplicas ({high})")
    if (
        problems
        or server is None
        or pool is None
        or deployment is None
        or slots is None
        or low is None
        or high is None
    ):
        return InvalidSpec(tuple(problems))
    return ScalerSpec(server, pool, deployment, slots, low, high, interval)


def _name(
    spec: Mapping[str, Any], field: str, check: Callable[[str], str | None], problems: list[str]
) -> str | None:
    value = spec.get(field)
    if value is None:
        problems.append(f"spec.{field}: required")
        return None
    if not isinstance(value, str):
        problems.append(f"spec.{field}: expected a string")
        return None
    wrong = check(value)
    if wrong:
        problems.append(f"spec.{field}: {wrong} (got {value[:80]!r})")
        return None
    return value


def _integer(
    spec: Mapping[str, Any],
    field: str,
    problems: list[str],
    *,
    low: int,
    high: int | None = None,
    default: int | None = None,
    optional: bool = False,
) -> int | None:
    """The field's integer within bounds; absent, ``default`` if there is one, None if ``optional``,
    else a problem. None after reporting a problem too: the caller only builds a spec without any."""
    value = spec.get(field)
    if value is None:
        if default is None and not optional:
            problems.append(f"spec.{field}: required")
        return default
    if not _is_int(value):
        problems.append(f"spec.{field}: expected an integer (got {value!r:.40})")
        return None
    if value < low or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        problems.append(f"spec.{field} must be {bounds} (got {value})")
        return None
    return int(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_deployment_name(value: str) -> str | None:
    if len(value) <= MAX_SUBDOMAIN and _SUBDOMAIN.fullmatch(value):
        return None
    return "must be a Deployment name (lower-case letters, digits, - and .)"
