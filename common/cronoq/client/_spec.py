"""``task(...)``: task options as a wire ``TaskSpec``.

One builder serves ``Client.submit``, ``Client.submit_batch`` and ``Client.add_recurring``, so every
option is converted and checked the same way whichever call carries it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypedDict, Unpack

from cronoq.client._codec import encode
from cronoq.client._wire import duration, edge_value, miss_value, priority_value, task_ref, unix_ns
from cronoq.v1 import cronoq_pb2 as pb

Ref = int | str
"""A task named by its id or its key."""

DepSpec = tuple[Ref, str] | Mapping[str, Any]
"""A dependency: ``(ref, cond)`` or ``{"ref": ..., "cond": ...}``; cond is success, failure or complete."""


class TaskOptions(TypedDict, total=False):
    """Keyword options of :func:`task` (and of ``Client.submit`` / ``Client.add_recurring``).

    Times are seconds; ``*_at`` take a datetime or Unix seconds. Unset options take the pool's defaults.
    """

    pool: str
    kind: str
    priority: str | int | None
    key: str | None
    deadline_in: float | None
    deadline_at: datetime | float | None
    start_in: float | None
    start_at: datetime | float | None
    tolerance: float | None
    on_miss: str | None
    duration_hint: float | None
    timeout: float | None
    retry: object
    after: Ref | Iterable[Ref] | None
    deps: Iterable[DepSpec]
    resources: Mapping[str, int] | None
    tags: Mapping[str, object] | None
    labels: Mapping[str, object] | None
    tenant: str | None
    content_type: str | None


def task(payload: object = None, **options: Unpack[TaskOptions]) -> pb.TaskSpec:
    """A ``cronoq.v1.TaskSpec`` for ``payload``, for ``Client.submit_batch`` or a recurring template.

    The payload is encoded as bytes/str/None/JSON (``content_type=`` overrides the guessed type).
    ``priority`` is a class name or 0..3 (default normal). ``retry`` is a mapping or an object with
    ``max_attempts``, ``initial_backoff``, ``multiplier``, ``max_backoff`` and ``jitter``; a missing
    field (or 0) means the pool's value, except ``jitter``, which defaults to True. ``after``
    names tasks that must succeed first; ``deps`` adds edges with other conditions.
    """
    unknown = options.keys() - TaskOptions.__optional_keys__
    if unknown:
        raise TypeError(f"unknown task option(s): {', '.join(sorted(unknown))}")
    for relative, absolute in (("deadline_in", "deadline_at"), ("start_in", "start_at")):
        if options.get(relative) is not None and options.get(absolute) is not None:
            raise ValueError(f"use either {relative} or {absolute}")
    payload_bytes, content_type = encode(payload, options.get("content_type"))
    deadline_at = options.get("deadline_at")
    start_at = options.get("start_at")
    retry = options.get("retry")
    return pb.TaskSpec(
        payload=payload_bytes,
        content_type=content_type,
        kind=options.get("kind") or "",
        pool=options.get("pool") or "",
        priority=priority_value(options.get("priority")),
        key=options.get("key") or "",
        deadline_in_s=duration("deadline_in", options.get("deadline_in")),
        deadline_unix_ns=None if deadline_at is None else unix_ns("deadline_at", deadline_at),
        start_in_s=duration("start_in", options.get("start_in")),
        start_unix_ns=None if start_at is None else unix_ns("start_at", start_at),
        tolerance_s=duration("tolerance", options.get("tolerance")),
        on_miss=miss_value(options.get("on_miss")),
        duration_hint_s=duration("duration_hint", options.get("duration_hint")),
        timeout_s=duration("timeout", options.get("timeout")),
        retry=None if retry is None else _retry(retry),
        deps=_deps(options.get("after"), options.get("deps", ())),
        resources=dict(options.get("resources") or {}),
        tags=_strings(options.get("tags")),
        labels=_strings(options.get("labels")),
        tenant=options.get("tenant") or "",
    )


def _retry(policy: object) -> pb.RetryPolicy:
    """Missing fields go out as 0 (jitter as True), since the wire's RetryPolicy cannot leave one unset;
    the server reads 0 as "the pool's value"."""

    def field(name: str, default: object) -> Any:  # whatever the caller's policy holds; protobuf checks it
        if isinstance(policy, Mapping):
            return policy.get(name, default)
        return getattr(policy, name, default)

    return pb.RetryPolicy(
        max_attempts=field("max_attempts", 0),
        initial_backoff_s=field("initial_backoff", 0.0),
        multiplier=field("multiplier", 0.0),
        max_backoff_s=field("max_backoff", 0.0),
        jitter=field("jitter", True),
    )


def _deps(after: Ref | Iterable[Ref] | None, deps: Iterable[DepSpec]) -> list[pb.Dep]:
    edges: list[tuple[Ref, str]] = []
    if after is not None:
        refs = [after] if isinstance(after, int | str) else list(after)
        edges.extend((ref, "success") for ref in refs)
    for dep in deps:
        if isinstance(dep, Mapping):
            edges.append((dep["ref"], dep.get("cond", "success")))
        else:
            ref, cond = dep
            edges.append((ref, cond))
    return [pb.Dep(target=task_ref(ref), cond=edge_value(cond)) for ref, cond in edges]


def _strings(mapping: Mapping[str, object] | None) -> dict[str, str]:
    return {str(key): str(value) for key, value in (mapping or {}).items()}
