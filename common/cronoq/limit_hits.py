"""How often each ``[limits]`` entry refused or cut a request: the ``cronoq_limit_hits_total`` counters.

A server keeps one :class:`LimitHits` and counts a hit where the limit is enforced: the request logic
(batch sizes, pending bounds, key and tag sizes, the caps on waits and list pages, worker slots), the
gRPC interceptor and the HTTP middleware of :mod:`cronoq.api.limits` (message and body sizes,
concurrent requests and streams, the request timeout). Validation that does not know the counter
(:mod:`cronoq.shard.convert`, :func:`cronoq.cluster.routing.check_batch`) marks the error it raises with the
limit's name (:func:`exceeded`), and the caller counts it with :meth:`LimitHits.counting`.

A hit is a request the limit changed: refused (an error naming the limit), or cut (a wait or a page
shorter than asked, slots fewer than asked). Four limits are never counted: the keepalive settings act
on connections inside the gRPC core, and key retention forgets old keys rather than refusing anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import fields
from typing import TypeVar

from prometheus_client.metrics_core import Metric

from cronoq.config.model import Limits
from cronoq.errors import ApiError
from cronoq.prometheus import family

NOT_COUNTED = frozenset(
    {"keepalive_interval_s", "keepalive_timeout_s", "key_retention_s", "key_retention_max"}
)
# Every [limits] key that can be hit, in the order of the configuration reference.
COUNTED: tuple[str, ...] = tuple(f.name for f in fields(Limits) if f.name not in NOT_COUNTED)

METRIC = "cronoq_limit_hits_total"
E = TypeVar("E", bound=ApiError)


def exceeded(limit: str, error: E) -> E:
    """``error``, marked as a refusal by ``limits.<limit>`` (counted by :meth:`LimitHits.counting`)."""
    if limit not in COUNTED:
        raise ValueError(f"not a counted limit: {limit!r}")
    error.limit = limit
    return error


class LimitHits:
    """Counts of limit hits by ``[limits]`` key, every counted key present from the start (at 0)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = dict.fromkeys(COUNTED, 0)

    def hit(self, limit: str) -> None:
        if limit not in self._counts:
            raise ValueError(f"not a counted limit: {limit!r}")
        self._counts[limit] += 1

    def counts(self) -> Mapping[str, int]:
        return dict(self._counts)

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count the limit of an error raised in the block (marked by :func:`exceeded`), then re-raise."""
        try:
            yield
        except ApiError as err:
            if err.limit is not None:
                self.hit(err.limit)
            raise

    def families(self) -> Iterator[Metric]:
        """The ``cronoq_limit_hits_total`` family."""
        yield family(
            METRIC,
            "counter",
            "Requests refused or cut short by a [limits] entry, by limit.",
            [({"limit": name}, float(count)) for name, count in self._counts.items()],
        )

    def refuse(self, limit: str, error: E) -> E:
        """Count a hit of ``limit`` and return ``error`` (marked) for the caller to raise."""
        self.hit(limit)
        return exceeded(limit, error)


__all__ = ["COUNTED", "NOT_COUNTED", "LimitHits", "exceeded"]
