"""``Pool``: a named queue with an executor and a capacity (how many attempts run at once)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from cronoq.engine import Overflow, PoolConfig, RetryRule, UnknownDependency

from . import validate
from .options import AutoscaleConfig, RetryPolicy, parse_retry


def _is_async(executor: Callable[..., Any]) -> bool:
    """Whether calling ``executor`` returns a coroutine to run on the loop (a coroutine function, a
    partial of one, or an object with an ``async def __call__``) rather than doing its work in place."""
    return inspect.iscoroutinefunction(executor) or inspect.iscoroutinefunction(type(executor).__call__)


class Pool:
    """A pool of in-process capacity running ``executor(ctx, payload)`` for each attempt.

    ``executor`` may be a coroutine function (run on the scheduler's loop, cancelled when the attempt is
    aborted) or a plain function (run in a thread of the pool's own, started whenever all are busy, so an
    attempt starts when it is dispatched; it cannot be interrupted). The
    capacity starts at ``initial`` (default ``min``); with autoscaling on (``autoscale=None``, the
    default, or an :class:`AutoscaleConfig`) it then follows queue pressure within [min, max] from there
    (so it is at least ``min`` once started), and with ``autoscale=False`` it changes only through
    ``Scheduler.set_capacity``/``set_group_capacity``.
    """

    __slots__ = ("config", "executor", "initial", "is_async", "name")

    def __init__(
        self,
        name: str,
        executor: Callable[..., Any],
        *,
        min: int = 1,
        max: int = 10,
        initial: int | None = None,
        autoscale: AutoscaleConfig | bool | None = None,
        lease_ttl: float | None = None,
        max_pending: int | None = None,
        overflow: str = "wait",
        retry: RetryPolicy | None = None,
        unknown_dependency: str = "reject",
        await_timeout: float | None = None,
        default_duration: float = 1.0,
        reservable_fraction: float = 0.5,
        tenant_weights: Mapping[str, float] | None = None,
        fair_share: bool = False,
    ) -> None:
        self.name = validate.name("name", name)
        if not callable(executor):
            raise TypeError(f"executor must be callable (got {type(executor).__name__})")
        self.executor = executor
        self.is_async = _is_async(executor)
        low = validate.count("min", min, 1)
        high = validate.count("max", max, 1)
        if low > high:
            raise ValueError(f"min ({low}) must not exceed max ({high})")
        self.initial = low if initial is None else validate.count("initial", initial, 0)
        if self.initial > high:
            raise ValueError(f"initial ({self.initial}) must not exceed max ({high})")
        if autoscale is None or autoscale is True:
            scaling: AutoscaleConfig | None = AutoscaleConfig()
        elif autoscale is False:
            scaling = None
        elif isinstance(autoscale, AutoscaleConfig):
            scaling = autoscale
        else:
            raise TypeError(f"autoscale must be an AutoscaleConfig, None or False (got {autoscale!r})")
        weights: dict[str, float] = {}
        if tenant_weights is not None:
            if not isinstance(tenant_weights, Mapping):
                raise TypeError(f"tenant_weights must be a mapping (got {type(tenant_weights).__name__})")
            for tenant, weight in tenant_weights.items():
                weights[validate.text("tenant_weights key", tenant)] = validate.positive(
                    f"tenant_weights[{tenant!r}]", weight
                )
        if not isinstance(fair_share, bool):
            raise TypeError(f"fair_share must be a bool (got {type(fair_share).__name__})")
        self.config = PoolConfig(
            name=self.name,
            max=high,
            min=low,
            lease_ttl=None if lease_ttl is None else validate.positive("lease_ttl", lease_ttl),
            # At least 1: the engine admits a task only while the pool has room for it to wait, so with
            # 0 every submission would wait or be refused forever, even with idle capacity.
            max_pending=None if max_pending is None else validate.count("max_pending", max_pending, 1),
            overflow=validate.choice("overflow", overflow, Overflow),
            retry=RetryRule() if retry is None else parse_retry(retry),
            default_duration=validate.positive("default_duration", default_duration),
            cost_per_worker_second=0.0 if scaling is None else scaling.cost_per_worker_second,
            autoscale=None if scaling is None else scaling.to_engine(),
            initial=self.initial,
            unknown_dependency=validate.choice("unknown_dependency", unknown_dependency, UnknownDependency),
            await_timeout=None if await_timeout is None else validate.seconds("await_timeout", await_timeout),
            reservable_fraction=validate.fraction("reservable_fraction", reservable_fraction),
            fair_share=fair_share,
            tenant_weights=weights,
        )

    def __repr__(self) -> str:
        return f"Pool({self.name!r}, min={self.config.min}, max={self.config.max})"
