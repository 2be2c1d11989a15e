"""Fan-out calls across shards (ListTasks, Snapshot, ListWorkers, ListRecurring, RemoveRecurring): splitting the request, merging the
answers. Pure functions over wire messages, shared by shard servers and the router; a shard that could
not answer (UNAVAILABLE or DEADLINE_EXCEEDED in place of an answer) is named in ``unavailable_shards``
(docs/operations.md, Sharding), and any other error a shard answered is the caller's, raised as a single server would."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from google.protobuf.message import Message

from cronoq.errors import ApiError, DeadlineExceeded, NotFound, Unavailable, shown
from cronoq.v1 import cronoq_pb2 as pb

from .shards import Shard, ShardMap

R = TypeVar("R", bound=Message)
Answers = Sequence[tuple[Shard, R | ApiError]]  # each shard and its answer, or the ApiError it failed with
# Bytes of a ListTasks answer besides its tasks (the cursor, the names of unavailable shards).
PAGE_HEADROOM = 1024


def fit_page(page: pb.ListTasksResponse, max_message_bytes: int) -> pb.ListTasksResponse:
    """``page`` cut, in place, to the tasks one answer can carry under ``max_message_bytes``
    (``limits.max_message_bytes``, grpc's send limit), at least one so that paging moves on; the cursor
    then continues after the last one kept. A page of ``max_list`` tasks whose messages run to 8,192
    characters each can be tens of MiB, which grpc refuses to send: the caller got RESOURCE_EXHAUSTED
    and could never list past it. A shard cuts its own pages, and a merge of shards' pages is cut again."""
    budget = max_message_bytes - PAGE_HEADROOM
    used = 0
    for n, info in enumerate(page.tasks):
        used += info.ByteSize() + 6  # and its field tag and length prefix
        if used > budget and n:
            del page.tasks[n:]
            page.next_after = page.tasks[-1].id
            break
    return page


def unreachable(answer: object) -> bool:
    """Whether a shard's ``answer`` is the error of a shard that could not answer at all (down, between
    leaders, too slow), rather than an answer or a refusal."""
    return isinstance(answer, Unavailable | DeadlineExceeded)


def answered(answers: Answers[R]) -> tuple[list[R], list[str]]:
    """The answers of the shards that answered, and the names of those that were :func:`unreachable`,
    to be named in ``unavailable_shards``. Any other error is raised: a refusal (PERMISSION_DENIED for
    a pool the credential may not use, UNAUTHENTICATED) is what a single server would answer, not an
    outage."""
    got: list[R] = []
    unavailable: list[str] = []
    for shard, answer in answers:
        if not isinstance(answer, ApiError):
            got.append(answer)
        elif unreachable(answer):
            unavailable.append(shard.name)
        else:
            raise answer
    return got, unavailable


def split_list(shards: ShardMap, req: pb.ListTasksRequest) -> list[tuple[Shard, pb.ListTasksRequest]]:
    """One request per shard that can hold matching tasks: all shards, or those owning the pools asked
    for, each asked only for its own pools."""
    for pool in req.pools:
        if shards.by_pool(pool) is None:
            raise NotFound(f"pools: unknown pool {shown(pool)}")
    parts: list[tuple[Shard, pb.ListTasksRequest]] = []
    for shard in shards:
        part = pb.ListTasksRequest()
        part.CopyFrom(req)
        if req.pools:
            del part.pools[:]
            part.pools.extend(p for p in req.pools if p in shard.pools)
            if not part.pools:
                continue
        parts.append((shard, part))
    return parts


def merge_pages(answers: Answers[pb.ListTasksResponse], limit: int) -> pb.ListTasksResponse:
    """The first ``limit`` tasks of all pages in id order, with a cursor that skips none.

    Each shard returned its lowest ids after the cursor, but a shard that has more may have returned
    fewer than ``limit`` (its own ``limits.max_list`` may be smaller): past the last id it returned,
    its next tasks are unknown, so the page stops there, at the lowest such id of all shards. The last
    id kept is the next cursor whenever anything was left out here or by a shard."""
    merged: list[pb.TaskInfo] = []
    pages, unavailable = answered(answers)
    boundary: int | None = None  # the lowest id after which some shard has tasks it did not return
    for answer in pages:
        merged.extend(answer.tasks)
        if answer.next_after:
            boundary = answer.next_after if boundary is None else min(boundary, answer.next_after)
    merged.sort(key=lambda info: info.id)
    if boundary is not None:
        merged = [info for info in merged if info.id <= boundary]
    page = merged[:limit]
    more = boundary is not None or len(merged) > limit
    next_after = (page[-1].id if page else boundary or 0) if more else 0
    return pb.ListTasksResponse(tasks=page, next_after=next_after, unavailable_shards=unavailable)


def merge_snapshots(answers: Answers[pb.SnapshotResponse]) -> pb.SnapshotResponse:
    """Every shard's pools side by side; counts and totals added up."""
    snapshots, unavailable = answered(answers)
    merged = pb.SnapshotResponse(unavailable_shards=unavailable)
    for answer in snapshots:
        merged.pools.extend(answer.pools)
        merged.live_tasks += answer.live_tasks
        merged.running += answer.running
        merged.pending += answer.pending
        merged.workers_connected += answer.workers_connected
        for field in pb.Totals.DESCRIPTOR.fields:
            name = field.name
            setattr(merged.totals, name, getattr(merged.totals, name) + getattr(answer.totals, name))
    return merged


def merge_workers(answers: Answers[pb.ListWorkersResponse]) -> pb.ListWorkersResponse:
    lists, unavailable = answered(answers)
    return pb.ListWorkersResponse(
        workers=[w for answer in lists for w in answer.workers], unavailable_shards=unavailable
    )


def merge_recurring(answers: Answers[pb.ListRecurringResponse]) -> pb.ListRecurringResponse:
    """Every shard's schedules, in shard order (each shard lists its own in the order they were added)."""
    lists, unavailable = answered(answers)
    return pb.ListRecurringResponse(
        schedules=[s for answer in lists for s in answer.schedules], unavailable_shards=unavailable
    )


def merge_removed(answers: Answers[pb.RemoveRecurringResponse]) -> pb.RemoveRecurringResponse:
    """Removed if any shard removed a schedule of that name. When none did, a shard that failed to
    answer may still have one: its error is raised rather than a "not removed" that may be false."""
    failed: list[tuple[Shard, ApiError]] = []
    for shard, answer in answers:
        if isinstance(answer, ApiError):
            failed.append((shard, answer))
        elif answer.removed:
            return pb.RemoveRecurringResponse(removed=True)
    if failed:
        shard, error = failed[0]
        if isinstance(error, Unavailable):
            names = ", ".join(f"'{s.name}'" for s, _ in failed)
            raise Unavailable(
                f"shard(s) {names} did not answer ({error.message}); the schedule may still exist there: "
                "retry the removal"
            )
        raise error
    return pb.RemoveRecurringResponse(removed=False)
