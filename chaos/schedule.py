"""The fault schedule: which fault, on what, when and for how long, drawn from one seed.

The schedule is made before the run starts, from the seed, the run's length and the topology alone
(never from anything the run observes), so ``CHAOS_SEED=N`` gives the same faults at the same offsets
again. Targets are named by role where the role is what matters (``leader:cpu``: whichever server
leads shard ``cpu`` when the fault comes), and resolved to a process only then; the fault's record in
the history names both.

Kinds come in rounds: each round is every allowed kind once, in an order drawn from the seed, so a
short run meets every kind (a 90 s run with the default gap of 4 s has about 20 faults, more than one
round), and a long run meets each about equally often. Gaps between faults are exponential (a mean of
``mean_gap`` seconds, from 0.5 to 12 s), so faults overlap now and then: a leader killed while its
link to Postgres is slow, a worker paused during a failover.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

# Kind -> (what it targets, its duration range in seconds). The duration is how long a process stays
# down (kill: it is restarted after it) or stopped (pause), a link stays cut, slow or lossy, the disk
# full. A hang lasts until the attempts it hangs time out: its duration is 0.
KINDS: dict[str, tuple[str, tuple[float, float]]] = {
    "kill-leader": ("shard", (0.5, 4.0)),
    "pause-leader": ("shard", (2.0, 15.0)),
    "kill-standby": ("shard", (0.5, 4.0)),
    "pause-standby": ("shard", (2.0, 12.0)),
    "kill-router": ("router", (0.5, 3.0)),
    "pause-router": ("router", (1.0, 6.0)),
    "kill-worker": ("worker", (0.5, 4.0)),
    "pause-worker": ("worker", (2.0, 12.0)),
    "hang-worker": ("worker", (0.0, 0.0)),
    "restart-postgres": ("postgres", (0.5, 3.0)),
    "cut-link": ("shard", (2.0, 12.0)),
    "slow-link": ("shard", (3.0, 12.0)),
    "lossy-link": ("shard", (3.0, 12.0)),
    "fill-disk": ("sqlite", (2.0, 12.0)),
    "kill-sqlite": ("sqlite", (0.5, 3.0)),
    "pause-sqlite": ("sqlite", (1.0, 8.0)),
}
SQLITE_KINDS = frozenset(kind for kind, (target, _) in KINDS.items() if target == "sqlite")
MIN_GAP_S, MAX_GAP_S = 0.5, 12.0


@dataclass(frozen=True, slots=True)
class Topology:
    """What the schedule can aim at: the shards (of leaders, standbys and links), the worker processes,
    and whether the SQLite server runs (its kinds are left out otherwise)."""

    shards: tuple[str, ...]
    workers: tuple[str, ...]
    sqlite: bool


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: ``at`` seconds after the faults begin; ``target`` a shard, a worker, ``router``,
    ``postgres`` or ``sqlite``; ``detail`` what the kind needs beyond a duration."""

    number: int
    at: float
    kind: str
    target: str
    duration: float
    detail: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        extra = "".join(f" {key}={value}" for key, value in sorted(self.detail.items()))
        return f"#{self.number} {self.kind} {self.target} for {self.duration:.1f} s{extra}"


def plan(
    seed: int,
    seconds: float,
    topology: Topology,
    kinds: frozenset[str] | None = None,
    *,
    warmup: float = 5.0,
    tail: float = 10.0,
    mean_gap: float = 4.0,
) -> list[Fault]:
    """Faults injected from ``warmup`` to ``seconds - tail`` after the start (the tail lets the last
    faults recover while producers still submit, so their recovery is measured)."""
    allowed = sorted(
        kind for kind in (KINDS if kinds is None else kinds) if topology.sqlite or kind not in SQLITE_KINDS
    )
    unknown = sorted(set(kinds or ()) - set(KINDS))
    if unknown:
        raise ValueError(f"faults: unknown kind {', '.join(unknown)} (known: {', '.join(KINDS)})")
    if not allowed:
        return []
    rng = random.Random(seed)
    faults: list[Fault] = []
    at = warmup
    round_: list[str] = []
    while True:
        at += min(max(rng.expovariate(1 / mean_gap), MIN_GAP_S), MAX_GAP_S)
        if at > seconds - tail:
            return faults
        if not round_:
            round_ = rng.sample(allowed, len(allowed))
        kind = round_.pop()
        aim, (shortest, longest) = KINDS[kind]
        duration = round(rng.uniform(shortest, longest), 2)
        faults.append(
            Fault(
                len(faults) + 1, round(at, 2), kind, _target(rng, aim, topology), duration, _detail(rng, kind)
            )
        )


def _target(rng: random.Random, aim: str, topology: Topology) -> str:
    if aim == "shard":
        return rng.choice(topology.shards)
    if aim == "worker":
        return rng.choice(topology.workers)
    return aim


def _detail(rng: random.Random, kind: str) -> dict[str, Any]:
    if kind == "slow-link":
        return {"delay_ms": rng.choice((50, 100, 200, 400))}
    if kind == "lossy-link":
        return {"stall": round(rng.uniform(0.05, 0.2), 3), "reset": round(rng.uniform(0.002, 0.02), 4)}
    if kind == "restart-postgres":
        return {"mode": rng.choice(("fast", "immediate"))}
    if kind == "hang-worker":
        return {"handlers": rng.choice((1, 2))}
    return {}
