"""Value types of the library API: priorities, retry and autoscaling policies, resources, dependencies.

They validate their arguments when built (and, for the policies, whenever an attribute is set), and
convert to the engine's frozen equivalents when a pool or task is built from them, so a policy changed
later affects what is built later, never a task already submitted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar

from cronoq.engine import (
    AutoscaleRule,
    DepEdge,
    DepOn,
    Priority,
    ResourceConfig,
    RetryRule,
    Semaphore,
    TokenBucket,
)

from . import validate

_ENGINE_PRIORITIES = tuple(Priority)
_PRIORITY_NAMES = {p.name.lower(): p for p in Priority}


def parse_priority(value: object) -> Priority:
    """A class given as a Priority, an int 0..3 or a case-insensitive name."""
    if isinstance(value, bool):
        raise TypeError("priority must be a Priority, an int 0..=3 or a class name, not a bool")
    if isinstance(value, int):  # Priority and the engine's Priority are ints too
        if 0 <= value <= 3:
            return _ENGINE_PRIORITIES[value]
        raise ValueError(f"priority must be 0..=3 (got {value})")
    if isinstance(value, str):
        found = _PRIORITY_NAMES.get(value.lower())
        if found is None:
            raise ValueError(f"priority must be critical, high, normal or low (got {value!r})")
        return found
    raise TypeError(f"priority must be a Priority, an int 0..=3 or a class name (got {type(value).__name__})")


Check = Callable[[str, object], object]


class _Validated:
    """Attributes that are checked (and normalised) on every assignment, so a policy can be changed
    after it is built and still never hold a value the engine would refuse."""

    __slots__ = ()
    _CHECKS: ClassVar[Mapping[str, Check]]

    def __setattr__(self, name: str, value: object) -> None:
        check = self._CHECKS.get(name)
        if check is None:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        object.__setattr__(self, name, check(name, value))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._CHECKS)
        return f"{type(self).__name__}({fields})"


def _flag(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{field} must be a bool (got {type(value).__name__})")
    return value


class RetryPolicy(_Validated):
    """How many attempts a task gets and how long it waits between them.

    The delay after failed attempt k is min(max_backoff, initial_backoff * multiplier**(k-1)); with
    ``jitter`` it is drawn uniformly from [0, that] ("full jitter"), which spreads a burst of failures.
    """

    __slots__ = ("initial_backoff", "jitter", "max_attempts", "max_backoff", "multiplier")
    _CHECKS = {
        "max_attempts": lambda f, v: validate.count(f, v, 1),
        "initial_backoff": validate.seconds,
        "multiplier": lambda f, v: validate.at_least(f, v, 1.0),
        "max_backoff": validate.seconds,
        "jitter": _flag,
    }
    max_attempts: int
    initial_backoff: float
    multiplier: float
    max_backoff: float
    jitter: bool

    def __init__(
        self,
        max_attempts: int = 3,
        initial_backoff: float = 1.0,
        multiplier: float = 2.0,
        max_backoff: float = 60.0,
        jitter: bool = True,
    ) -> None:
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff
        self.multiplier = multiplier
        self.max_backoff = max_backoff
        self.jitter = jitter

    @classmethod
    def none(cls) -> RetryPolicy:
        """A single attempt: any failure is final (FAILED or DEAD_LETTERED)."""
        return cls(max_attempts=1)

    def to_engine(self) -> RetryRule:
        return RetryRule(
            self.max_attempts, self.initial_backoff, self.multiplier, self.max_backoff, self.jitter
        )


def parse_retry(value: object) -> RetryRule:
    if not isinstance(value, RetryPolicy):
        raise TypeError(f"retry must be a RetryPolicy (got {type(value).__name__})")
    return value.to_engine()


def _slo(field: str, value: object) -> dict[str, float]:
    """Per-class drain targets keyed by Priority, int or name; kept by lower-case class name."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{field} must be a mapping of priority class to seconds (got {type(value).__name__})"
        )
    return {
        parse_priority(cls).name.lower(): validate.positive(f"{field}[{cls!r}]", seconds)
        for cls, seconds in value.items()
    }


class AutoscaleConfig(_Validated):
    """How a pool's capacity follows queue pressure: arrivals and backlog over ``interval``-spaced
    evaluations, scaled up at once (in steps of at most ``max(capacity, max_step_up_abs)``) and down
    slowly (the highest target within ``stabilization_window``, ``max_step_down`` per ``cooldown``),
    so a short lull does not shed workers a burst needs a second later. ``slo`` maps a class to the
    seconds within which its backlog should drain."""

    __slots__ = (
        "cooldown",
        "cost_per_worker_second",
        "drain_time",
        "interval",
        "max_step_down",
        "max_step_up_abs",
        "reservation_horizon",
        "slo",
        "stabilization_window",
        "target_utilization",
    )
    _CHECKS = {
        "interval": validate.positive,
        "target_utilization": lambda f, v: validate.positive(f, validate.fraction(f, v)),
        "drain_time": validate.positive,
        "slo": _slo,
        "reservation_horizon": validate.seconds,
        "stabilization_window": validate.seconds,
        "cooldown": validate.seconds,
        "max_step_up_abs": lambda f, v: validate.count(f, v, 1),
        "max_step_down": lambda f, v: validate.count(f, v, 1),
        "cost_per_worker_second": lambda f, v: validate.at_least(f, v, 0.0),
    }
    interval: float
    target_utilization: float
    drain_time: float
    slo: dict[str, float]
    reservation_horizon: float
    stabilization_window: float
    cooldown: float
    max_step_up_abs: int
    max_step_down: int
    cost_per_worker_second: float

    def __init__(
        self,
        interval: float = 1.0,
        target_utilization: float = 0.75,
        drain_time: float = 30.0,
        slo: Mapping[Priority | int | str, float] | None = None,
        reservation_horizon: float = 60.0,
        stabilization_window: float = 60.0,
        cooldown: float = 30.0,
        max_step_up_abs: int = 4,
        max_step_down: int = 1,
        cost_per_worker_second: float = 0.0,
    ) -> None:
        self.interval = interval
        self.target_utilization = target_utilization
        self.drain_time = drain_time
        self.slo = _slo("slo", slo)
        self.reservation_horizon = reservation_horizon
        self.stabilization_window = stabilization_window
        self.cooldown = cooldown
        self.max_step_up_abs = max_step_up_abs
        self.max_step_down = max_step_down
        self.cost_per_worker_second = cost_per_worker_second

    def to_engine(self) -> AutoscaleRule:
        return AutoscaleRule(
            interval=self.interval,
            target_utilization=self.target_utilization,
            drain_time=self.drain_time,
            slo={_PRIORITY_NAMES[name]: seconds for name, seconds in self.slo.items()},
            reservation_horizon=self.reservation_horizon,
            stabilization_window=self.stabilization_window,
            cooldown=self.cooldown,
            max_step_up_abs=self.max_step_up_abs,
            max_step_down=self.max_step_down,
        )


class Resource:
    """A limit shared by every pool of a scheduler; build one with :meth:`semaphore` or
    :meth:`token_bucket` and ask for units with ``resources={name: amount}`` on a task."""

    __slots__ = ("config",)

    def __init__(self, config: ResourceConfig) -> None:
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    @classmethod
    def semaphore(cls, name: str, permits: int) -> Resource:
        """At most ``permits`` units held at once by running attempts; taken at dispatch, given back
        when the attempt ends."""
        return cls(Semaphore(validate.name("name", name), validate.count("permits", permits, 1)))

    @classmethod
    def token_bucket(cls, name: str, rate: float, burst: float) -> Resource:
        """Refilled at ``rate`` units per second up to ``burst`` (it starts full); each dispatch takes
        its amount. This is the rate limit: there is no other."""
        return cls(
            TokenBucket(
                validate.name("name", name),
                validate.positive("rate", rate),
                validate.at_least("burst", burst, 1.0),
            )
        )

    def __repr__(self) -> str:
        config = self.config
        if isinstance(config, Semaphore):
            return f"Resource.semaphore({config.name!r}, {config.permits})"
        return f"Resource.token_bucket({config.name!r}, {config.rate}, {config.burst})"


def task_ref(field: str, value: object) -> int | str:
    """A task named by its id (int) or its key (non-empty str)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{field} must be a task id (int) or key (str), not {value!r}")
    if isinstance(value, str) and not validate.text(field, value):
        raise ValueError(f"{field} must not be an empty key")
    return value


_DEP_ON = {on.value: on for on in DepOn} | {f"on_{on.value}": on for on in DepOn}


class Dep:
    """A dependency edge: the task waits until ``target`` (an id or a key) ends as ``on`` says —
    ``success`` (succeeded), ``failure`` (failed or dead-lettered) or ``complete`` (any ending), in any
    case and optionally prefixed ``on_``, as every other enumerated option. If the target ends so that
    the edge can never be met, the dependent is skipped."""

    __slots__ = ("on", "target")

    def __init__(self, target: int | str, on: str = "success") -> None:
        self.target = task_ref("target", target)
        found = _DEP_ON.get(on.lower()) if isinstance(on, str) else None
        if found is None:
            raise ValueError(f"on must be one of success, failure, complete (got {on!r})")
        self.on = found.value

    def to_engine(self) -> DepEdge:
        return DepEdge(self.target, DepOn(self.on))

    def __repr__(self) -> str:
        return f"Dep({self.target!r}, on={self.on!r})"
