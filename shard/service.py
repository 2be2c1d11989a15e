"""The request logic of the Tasks and Admin APIs, once, for both transports.

gRPC servicers and HTTP handlers authenticate the caller, build the wire request message and call a
method here; errors are raised as :mod:`cronoq.errors` classes and each transport renders them. That
keeps validation, authorization and engine calls identical whichever way a request arrives.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from cronoq.auth import Authenticator, Principal, Role
from cronoq.checks import check_key
from cronoq.cluster.fanout import fit_page
from cronoq.cluster.forward import Peers
from cronoq.cluster.routing import Routing, check_batch, named_pool
from cronoq.cluster.shards import Shard, ShardMap
from cronoq.engine.fixed import reservation_limit
from cronoq.engine.model import AdmissionError, PoolConfig, RecurringError, RetryRule, Status, Task, TaskSpec
from cronoq.engine.snapshot import EngineSnapshot, Totals
from cronoq.errors import (
    AlreadyExists,
    ApiError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
    shown,
)
from cronoq.limit_hits import LimitHits
from cronoq.telemetry import traced
from cronoq.tracecontext import TraceContext
from cronoq.transport import ADD_RECURRING, CANCEL, GET, SUBMIT, SUBMIT_BATCH, WAIT, unadmitted
from cronoq.v1 import cronoq_pb2 as pb

from .convert import (
    NS,
    SpecLimits,
    carry_trace,
    check_duration,
    recurring_from_wire,
    recurring_info,
    spec_from_wire,
    status_from_wire,
    status_to_wire,
    task_info,
)
from .runtime import Runtime
from .store import StoredTask, StoreError

if TYPE_CHECKING:
    from cronoq.otel import ServerTracing

# A full pool's bound, as error messages name it.
POOL_BOUND = "(its max_pending; by default limits.max_pending_per_pool)"
# A Submit parks on a full ``overflow = wait`` pool until this much before ``request_timeout_s``.
PARK_MARGIN_S = 1.0
PARK_MARGIN_SHARE = 0.1
DEFAULT_PAGE = 100  # ListTasks without a limit
STANDBY = "this server is a standby, not the leader; retry against the leader"
SHUTTING_DOWN = "server is shutting down; retry against the new leader"
_NOT_FOUND_CODES = frozenset({"unknown_pool", "unknown_resource", "unknown_dependency"})
_EXHAUSTED_CODES = frozenset({"full", "overloaded"})


def _pool_of(found: Task | StoredTask) -> str:
    return (found.task if isinstance(found, StoredTask) else found).spec.pool


def submit_error(prefix: str, err: AdmissionError) -> ApiError:
    """The API error for an engine refusal, naming the offending task (docs/http-api.md, Errors): unknown pool, resource
    or dependency NOT_FOUND; a full pool or the global bound RESOURCE_EXHAUSTED; a fixed-start
    reservation conflict FAILED_PRECONDITION; everything else (cycle, a resource amount above its
    capacity, a key twice in one batch) INVALID_ARGUMENT."""
    message = f"{prefix}: {err.message}"
    if err.code in _NOT_FOUND_CODES:
        return NotFound(message)
    if err.code in _EXHAUSTED_CODES:
        return ResourceExhausted(message)
    if err.code == "reservation_conflict":
        return FailedPrecondition(message)
    return InvalidArgument(message)


class ShardService:
    """Tasks and Admin operations of one shard server: served by the runtime of its leadership while it
    leads (:meth:`serve`), refused with UNAVAILABLE while it stands by."""

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        auth: Authenticator,
        *,
        spec_limits: SpecLimits,
        max_tasks_per_batch: int,
        max_wait_s: float,
        request_timeout_s: float,
        max_list: int,
        shards: ShardMap | None = None,
        peers: Peers | None = None,
        limit_hits: LimitHits | None = None,
        tracing: ServerTracing | None = None,
    ) -> None:
        self._runtime: Runtime | None = None
        self.tracing = tracing  # None: this server does not trace (cronoq.telemetry)
        # Hits of [limits] enforced here (refusals, and waits and pages cut short), for /metrics.
        self.limit_hits = limit_hits if limit_hits is not None else LimitHits()
        # Worker id -> (name, connected Unix ns), kept by the worker streams, for ListWorkers.
        self.connected: dict[int, tuple[str, int]] = {}
        self.auth = auth
        self.spec_limits = spec_limits
        self.max_tasks_per_batch = max_tasks_per_batch
        self.max_wait_s = max_wait_s
        self.request_timeout_s = request_timeout_s
        self.max_list = max_list
        names = [p.name for p in pools]
        self.default_pool = "default" if "default" in names else names[0]
        self.retry_defaults: dict[str, RetryRule] = {p.name: p.retry for p in pools}
        # With [[shards]], ``pools`` are the whole cluster's and calls for other shards are routed.
        self.routing = (
            Routing(
                shards,
                peers,
                self.default_pool,
                max_wait_s=max_wait_s,
                max_list=max_list,
                max_message_bytes=spec_limits.max_message_bytes,
                on_output=self._keep_output,
            )
            if peers is not None and shards is not None and shards.sharded
            else None
        )

    def _keep_output(self, task_id: int, output: bytes, content_type: str) -> None:
        """A forwarded call's output, kept as if local so that HTTP renders it by its content type."""
        if self._runtime is not None:
            self._runtime.outputs.put(task_id, output, content_type)

    @property
    def runtime(self) -> Runtime:
        """The serving runtime; UNAVAILABLE while this server is a standby. Not marked as refused before
        admission (``authorize`` is): a step-down between a Submit's commit and its wait lands here too."""
        runtime = self._runtime
        if runtime is None:
            raise Unavailable(STANDBY)
        return runtime

    @property
    def ready(self) -> bool:
        return self._runtime is not None and self._runtime.accepting

    def output_type(self, task_id: int) -> str:
        runtime = self._runtime
        return runtime.outputs.content_type(task_id) if runtime is not None else ""

    def serve(self, runtime: Runtime | None) -> None:
        """Start serving requests from ``runtime`` (None: stand by)."""
        self._runtime = runtime

    # ---------------------------------------------------------------------------------- callers

    def authorize(
        self, authorization: str | None, role: Role, forwarded: bool = False, cert_names: Sequence[str] = ()
    ) -> Principal:
        """Authenticate, check the role, and refuse while the server is not serving (``/metrics``
        excepted: a standby reports that it is one). Where calls may be forwarded to other shards, the
        principal keeps the caller's credential to present there."""
        # A forwarded call comes over a peer's connection: its certificate ([server.peer_tls]) is the
        # peer's, never the caller's identity; the caller's token is.
        principal = self.auth.require(authorization, role, () if forwarded else cert_names)
        if self.routing is not None:
            principal = replace(principal, credential=authorization or "", forwarded=forwarded)
        if role is not Role.METRICS:
            runtime = self._runtime
            if runtime is None or not runtime.accepting:  # refused before the engine saw anything
                raise unadmitted(STANDBY if runtime is None else SHUTTING_DOWN)
        return principal

    def _check_pool(self, caller: Principal, field: str, pool: str) -> None:
        if not caller.may_use_pool(pool):
            raise PermissionDenied(f"{field}: this credential may not use pool {shown(pool)}")

    async def _task(
        self, caller: Principal, field: str, ref: pb.TaskRef, pool: str = ""
    ) -> Task | StoredTask:
        """The task ``ref`` names (of ``pool``, when the caller named one): from the engine (every live
        task and recently finished ones), else from a durable store (finished tasks kept for
        ``keep_finished_s``)."""
        which = ref.WhichOneof("target")
        if which is None:
            raise InvalidArgument(f"{field}: set either id or key")
        target: int | str = ref.id if which == "id" else ref.key
        if which == "key" and not ref.key:
            raise InvalidArgument(f"{field}.key: must not be empty")
        found = await self._lookup(target)
        if found is None or not caller.may_use_pool(_pool_of(found)) or (pool and _pool_of(found) != pool):
            shown_target = shown(target) if isinstance(target, str) else target
            raise NotFound(f"{field}: no task {shown_target}" + (f" in pool {shown(pool)}" if pool else ""))
        return found

    async def _lookup(self, target: int | str) -> Task | StoredTask | None:
        runtime = self.runtime
        found: Task | StoredTask | None = runtime.engine.get(target)
        if found is None and runtime.store is not None:
            try:
                found = await runtime.store.fetch(target)
            except StoreError as err:
                raise Unavailable(f"the store cannot be read: {err}") from None
            if found is not None and found.output is not None:  # so HTTP finds its content type
                runtime.outputs.put(found.task.id, found.output, found.output_type)
        return found

    # A shard's own part of a cluster-wide lookup by key (cronoq.cluster.routing.LocalKeys).

    def held(self, caller: Principal, key: str) -> tuple[int, str] | None:
        task = self.runtime.engine.get(key)
        if task is None or not caller.may_use_pool(task.spec.pool):
            return None
        return task.id, task.spec.pool

    async def stored(self, caller: Principal, key: str) -> tuple[int, str] | None:
        found = await self._lookup(key)
        if found is None or not caller.may_use_pool(_pool_of(found)):
            return None
        return (found.task.id if isinstance(found, StoredTask) else found.id), _pool_of(found)

    async def probe(self, caller: Principal, req: pb.GetRequest) -> pb.TaskInfo:
        """Another shard's question before it admits a submission with this key: does a task here hold
        it (``KEY_PROBE_KEY``)? Answered from the engine alone, and ALREADY_EXISTS when the holder is of
        a pool the caller may not use: that submission must be refused, where a Get says NOT_FOUND.

        A holder is named only once it is committed: the asking shard answers its caller with this id
        as a duplicate, an acknowledgement, and a holder this leader has not committed yet is lost with
        it (found by the chaos suite, with this shard's link to its store cut). A holder whose commit
        does not come in time leaves the probe unanswered, and the asking shard passes this shard over
        as one it could not ask."""
        if req.task.WhichOneof("target") != "key" or not req.task.key:
            raise InvalidArgument("task.key: a key probe names a key")
        key = req.task.key
        runtime = self.runtime
        task = runtime.engine.get(key)
        if task is None:
            raise NotFound(f"task.key: no task holds key {shown(key)}")
        if not caller.may_use_pool(task.spec.pool):
            raise AlreadyExists(
                f"task.key: key {shown(key)} is held by a task outside this credential's pools"
            )
        await runtime.settle([task.id])
        return task_info(task, runtime.output_available(task))

    # ---------------------------------------------------------------------------------- submit

    def _specs(
        self, caller: Principal, field: str, msgs: Sequence[pb.TaskSpec], trace: TraceContext
    ) -> list[TaskSpec]:
        """The validated specs of a Submit (``field`` is ``task``) or a SubmitBatch (``tasks[i]``), each
        carrying the ``trace`` context of the call (its Submit span's, when this server traces)."""
        now = self.runtime.clock()
        specs: list[TaskSpec] = []
        with self.limit_hits.counting():
            for i, msg in enumerate(msgs):
                where = field if field == "task" else f"{field}[{i}]"
                spec = spec_from_wire(
                    where,
                    msg,
                    default_pool=self.default_pool,
                    pools=self.retry_defaults,
                    limits=self.spec_limits,
                    now=now,
                )
                if trace:
                    carry_trace(where, spec, trace, self.spec_limits)
                self._own(caller, where, spec)
                self._scoped_refs(caller, where, spec)
                specs.append(spec)
        return specs

    def _scoped_refs(self, caller: Principal, field: str, spec: TaskSpec) -> None:
        """A pool-scoped caller may name only tasks of its pools: a key held by a task it may not see is
        refused (not answered with that task's id as a duplicate), and a dependency on such a task is
        refused as unknown, as looking it up would be."""
        if caller.pools is None:
            return
        engine = self.runtime.engine
        held = engine.get(spec.key) if spec.key else None
        if held is not None and not caller.may_use_pool(held.spec.pool):
            raise PermissionDenied(
                f"{field}.key: key {shown(spec.key)} is held by a task outside this credential's pools"
            )
        for j, dep in enumerate(spec.deps):
            target = engine.get(dep.target)
            if target is not None and not caller.may_use_pool(target.spec.pool):
                if isinstance(dep.target, str):
                    raise NotFound(f"{field}.deps[{j}].key: unknown dependency {shown(dep.target)}")
                raise NotFound(f"{field}.deps[{j}].id: unknown dependency {dep.target}")

    def _own(self, caller: Principal, field: str, spec: TaskSpec) -> None:
        """The caller may use the spec's pool; a credential's tenant becomes the spec's."""
        if not caller.may_use_pool(spec.pool):
            self._check_pool(caller, f"{field}.pool", spec.pool)
        if caller.tenant is not None:
            if spec.tenant and spec.tenant != caller.tenant:
                raise PermissionDenied(
                    f"{field}.tenant: this credential submits only for tenant '{caller.tenant}'"
                )
            spec.tenant = caller.tenant

    async def _admit(
        self, specs: list[TaskSpec], prefix: str, positions: Sequence[int] | None = None
    ) -> list[tuple[int, bool]]:
        """Submit atomically; a full ``overflow = wait`` pool parks the request until space frees, for
        a little less than ``request_timeout_s``, so that "pool full" rather than the call's timeout
        answers it. ``positions`` are the specs' places in the batch, when some of it was answered
        before admission (keys held on other shards), so that a refusal names the right task."""
        runtime = self.runtime
        park_s = self.request_timeout_s - min(PARK_MARGIN_S, PARK_MARGIN_SHARE * self.request_timeout_s)
        deadline = runtime.clock() + park_s
        while True:
            if not runtime.accepting:  # nothing admitted yet: "full" refuses the whole call
                raise unadmitted(SHUTTING_DOWN)
            try:
                submitted = runtime.engine.submit(specs, runtime.clock())
            except AdmissionError as err:
                index = err.index if positions is None or err.index is None else positions[err.index]
                where = prefix if index is None or prefix == "task" else f"{prefix}[{index}]"
                if err.code == "overloaded":
                    raise self._overloaded(where, err) from None
                if err.code != "full":
                    raise self._refusal(where, err, specs) from None
                remaining = deadline - runtime.clock()
                pool = specs[err.index or 0].pool
                if remaining <= 0:
                    raise self.limit_hits.refuse(
                        "max_pending_per_pool",
                        ResourceExhausted(
                            f"{where}: pool '{pool}' stayed full {POOL_BOUND} for {park_s:g} s, as long as "
                            f"this call may wait (limits.request_timeout_s is {self.request_timeout_s:g} s)"
                        ),
                    ) from None
                with contextlib.suppress(TimeoutError):  # the loop re-checks the deadline
                    await runtime.wait_for_space(pool, remaining)
                continue
            runtime.flush()
            await runtime.sync()
            return [(s.id, s.duplicate) for s in submitted]

    def _overloaded(self, where: str, err: AdmissionError) -> ApiError:
        """A refusal for want of room, counted: the pool's bound (``overflow = reject``, or nothing to
        shed), or ``limits.max_pending_total``."""
        if err.limit == "max_pending_total":
            return self.limit_hits.refuse("max_pending_total", ResourceExhausted(f"{where}: {err.message}"))
        message = err.message.replace("(max_pending)", POOL_BOUND)
        return self.limit_hits.refuse("max_pending_per_pool", ResourceExhausted(f"{where}: {message}"))

    def _refusal(self, where: str, err: AdmissionError, specs: Sequence[TaskSpec]) -> ApiError:
        """The engine's refusal as an API error naming the field (``tasks[2].deps[0].key``)."""
        if err.index is None:
            return submit_error(where, err)
        spec = specs[err.index]
        engine = self.runtime.engine
        where += err.field
        if err.code == "reservation_conflict":
            config = engine.pool_config(spec.pool)
            limit = reservation_limit(config.max, config.reservable_fraction)
            err = AdmissionError(
                err.code,
                f"{err.message}: pool '{spec.pool}' allows {limit} overlapping fixed-start "
                "reservation(s) (max x reservable_fraction, at least 1), and this start's window "
                "[start - tolerance, start + duration + tolerance] would be one more",
                err.index,
            )
        return submit_error(where, err)

    # ---------------------------------------------------------------------------------- shards

    async def _ref_owner(self, caller: Principal, field: str, ref: pb.TaskRef, pool: str) -> Shard | None:
        if self.routing is None:
            return None
        return await self.routing.ref_owner(caller, field, ref, self, pool)

    def _named_pool(self, caller: Principal, pool: str) -> str:
        return named_pool(caller, pool, self.retry_defaults.__contains__)

    async def _held_elsewhere(
        self, caller: Principal, field: str, specs: Sequence[TaskSpec]
    ) -> dict[int, tuple[Shard, pb.TaskInfo]]:
        """The specs (by index) whose keys another shard holds for this caller: keys are one namespace
        across the cluster, so these are duplicates of the tasks there (:meth:`Routing.held_elsewhere`).
        A key this shard holds is this shard's to answer (its engine deduplicates it)."""
        if self.routing is None:
            return {}
        engine = self.runtime.engine
        keyed = {
            spec.key: (field if field == "task" else f"{field}[{i}]")
            for i, spec in enumerate(specs)
            if spec.key and engine.get(spec.key) is None
        }
        if not keyed:
            return {}
        held = await self.routing.held_elsewhere(caller, [(where, key) for key, where in keyed.items()])
        return {i: held[spec.key] for i, spec in enumerate(specs) if spec.key in held}

    async def submit(self, caller: Principal, req: pb.SubmitRequest) -> pb.SubmitResponse:
        return await traced(
            self.tracing,
            ("Submit", req.task.pool or self.default_pool),
            lambda trace: self._submit(caller, req, trace),
            lambda answer: [answer.id],
        )

    async def _submit(
        self, caller: Principal, req: pb.SubmitRequest, trace: TraceContext
    ) -> pb.SubmitResponse:
        if req.HasField("wait_timeout_s") and not req.wait:
            raise InvalidArgument("wait_timeout_s: only meaningful with wait = true")
        remote = self.routing.pool_owner(req.task.pool) if self.routing is not None else None
        if remote is not None:
            assert self.routing is not None
            return await self.routing.forward(remote, SUBMIT, req, caller)
        # Checked before admission: a refused call must leave nothing behind.
        timeout = (
            self._wait_limit("wait_timeout_s", req.wait_timeout_s if req.HasField("wait_timeout_s") else None)
            if req.wait
            else 0.0
        )
        specs = self._specs(caller, "task", [req.task], trace)
        elsewhere = await self._held_elsewhere(caller, "task", specs)
        if elsewhere:
            return await self._duplicate_elsewhere(caller, *elsewhere[0], timeout if req.wait else None)
        await self._own_shard_deps(caller, "task", specs, [0])
        [(task_id, duplicate)] = await self._admit(specs, "task")
        response = pb.SubmitResponse(id=task_id, duplicate=duplicate)
        if req.wait:
            response.result.CopyFrom(await self._await_result(task_id, timeout))
        return response

    async def _own_shard_deps(
        self, caller: Principal, field: str, specs: Sequence[TaskSpec], positions: Sequence[int]
    ) -> None:
        """A task can depend only on tasks of its own shard, the only ones its engine sees. A dependency
        of the specs at ``positions`` on a task of another shard, by id (its shard number tells) or by a
        key another shard holds for the caller (asked only for keys neither this shard nor the batch
        holds), is refused naming that shard, rather than as an unknown dependency or, in a pool that
        awaits unknown keys, waited for in vain."""
        routing = self.routing
        if routing is None:
            return
        shards = routing.shards
        engine = self.runtime.engine
        batch_keys = {spec.key for spec in specs if spec.key}
        keyed: dict[str, tuple[str, str]] = {}  # key -> the first dependency naming it, and its pool
        for i in positions:
            spec = specs[i]
            where = field if field == "task" else f"{field}[{i}]"
            for j, dep in enumerate(spec.deps):
                target = dep.target
                if isinstance(target, str):
                    if target not in batch_keys and engine.get(target) is None:
                        keyed.setdefault(target, (f"{where}.deps[{j}].key", spec.pool))
                elif (owner := shards.by_id(target)) is not None and owner is not shards.local:
                    raise self._other_shard(
                        f"{where}.deps[{j}].id", f"task {target} is on shard '{owner.name}'", spec.pool
                    )
        if not keyed:
            return
        held = await routing.held_by_others(caller, list(keyed))
        for key, (path, pool) in keyed.items():
            if key in held:
                shard, task_id = held[key]
                raise self._other_shard(
                    path, f"key {shown(key)} is held by task {task_id} on shard '{shard.name}'", pool
                )

    def _other_shard(self, path: str, found: str, pool: str) -> InvalidArgument:
        """The refusal of a dependency on a task of another shard (docs/http-api.md, Dependencies)."""
        assert self.routing is not None and self.routing.shards.local is not None
        return InvalidArgument(
            f"{path}: {found}; a task can depend only on tasks of its own shard, and pool {shown(pool)} "
            f"is served by shard '{self.routing.shards.local.name}'"
        )

    async def _duplicate_elsewhere(
        self, caller: Principal, shard: Shard, held: pb.TaskInfo, wait: float | None
    ) -> pb.SubmitResponse:
        """The answer to a Submit whose key a task of another shard holds: that task, as a duplicate,
        with its result when the caller waits (asked of that shard)."""
        response = pb.SubmitResponse(id=held.id, duplicate=True)
        if wait is not None:
            assert self.routing is not None
            request = pb.WaitRequest(task=pb.TaskRef(id=held.id), timeout_s=wait)
            response.result.CopyFrom(await self.routing.forward(shard, WAIT, request, caller, last_hop=True))
        return response

    async def submit_batch(self, caller: Principal, req: pb.SubmitBatchRequest) -> pb.SubmitBatchResponse:
        return await traced(
            self.tracing,
            ("SubmitBatch", (req.tasks[0].pool if req.tasks else "") or self.default_pool),
            lambda trace: self._submit_batch(caller, req, trace),
            lambda answer: [t.id for t in answer.tasks],
        )

    async def _submit_batch(
        self, caller: Principal, req: pb.SubmitBatchRequest, trace: TraceContext
    ) -> pb.SubmitBatchResponse:
        with self.limit_hits.counting():
            check_batch(req, self.max_tasks_per_batch)
        if self.routing is not None:
            remote = self.routing.batch_owner(req)
            if remote is not None:
                return await self.routing.forward(remote, SUBMIT_BATCH, req, caller)
        specs = self._specs(caller, "tasks", req.tasks, trace)
        elsewhere = await self._held_elsewhere(caller, "tasks", specs)
        positions = [i for i in range(len(specs)) if i not in elsewhere]
        await self._own_shard_deps(caller, "tasks", specs, positions)
        admitted = iter(
            await self._admit([specs[i] for i in positions], "tasks", positions) if positions else ()
        )
        return pb.SubmitBatchResponse(
            tasks=[
                pb.SubmitResponse(id=elsewhere[i][1].id, duplicate=True)
                if i in elsewhere
                else pb.SubmitResponse(id=(result := next(admitted))[0], duplicate=result[1])
                for i in range(len(specs))
            ]
        )

    # ------------------------------------------------------------------------------ lookups

    async def cancel(self, caller: Principal, req: pb.CancelRequest, pool: str = "") -> pb.CancelResponse:
        pool = self._named_pool(caller, pool)
        remote = await self._ref_owner(caller, "task", req.task, pool)
        if remote is not None:
            assert self.routing is not None
            return await self.routing.forward(remote, CANCEL, req, caller, pool=pool)
        found = await self._task(caller, "task", req.task, pool)
        if isinstance(found, StoredTask):  # the engine holds every live task: this one has finished
            return pb.CancelResponse(cancelled=False)
        runtime = self.runtime
        cancelled = runtime.engine.cancel(found.id, runtime.clock())
        runtime.flush()
        await runtime.sync()
        return pb.CancelResponse(cancelled=cancelled)

    async def get(self, caller: Principal, req: pb.GetRequest, pool: str = "") -> pb.TaskInfo:
        pool = self._named_pool(caller, pool)
        remote = await self._ref_owner(caller, "task", req.task, pool)
        if remote is not None:
            assert self.routing is not None
            return await self.routing.forward(remote, GET, req, caller, pool=pool)
        found = await self._task(caller, "task", req.task, pool)
        if isinstance(found, StoredTask):
            return task_info(found.task, found.output is not None)
        info = task_info(found, self.runtime.output_available(found))
        await self.runtime.settle((found.id,))
        return info

    async def list_tasks(self, caller: Principal, req: pb.ListTasksRequest) -> pb.ListTasksResponse:
        """One page in id order; with [[shards]], every shard's page merged (the requested pools split by
        shard), and shards that did not answer named in ``unavailable_shards``. A page larger than
        ``limits.max_list`` is cut to it (counted where the call arrived)."""
        if not caller.forwarded and (req.limit or DEFAULT_PAGE) > self.max_list:
            self.limit_hits.hit("max_list")
        if self.routing is None or caller.forwarded:
            page = self._list_local(caller, req)
        else:
            page = await self.routing.list_tasks(caller, req, self._list_local)
        await self.runtime.settle(t.id for t in page.tasks)  # other shards' ids are never ours
        return page

    def _list_local(self, caller: Principal, req: pb.ListTasksRequest) -> pb.ListTasksResponse:
        engine = self.runtime.engine
        for pool in req.pools:
            if not engine.has_pool(pool):
                raise NotFound(f"pools: unknown pool {shown(pool)}")
            self._check_pool(caller, "pools", pool)
        pools: set[str] | None = set(req.pools) if req.pools else None
        if pools is None and caller.pools is not None:
            pools = set(caller.pools)
        statuses = {status_from_wire("statuses", s) for s in req.statuses} or None
        limit = min(req.limit or DEFAULT_PAGE, self.max_list)
        page, next_after = engine.list_tasks(pools=pools, statuses=statuses, after=req.after, limit=limit)
        infos = [task_info(t, self.runtime.output_available(t)) for t in page]
        answer = pb.ListTasksResponse(tasks=infos, next_after=next_after)
        return fit_page(answer, self.spec_limits.max_message_bytes)

    def _wait_limit(self, field: str, requested: float | None) -> float:
        """The server-side wait: as requested, but at most ``limits.max_wait_s`` (a longer request is cut,
        and counted); that limit when none is requested."""
        if requested is None:
            return self.max_wait_s
        if check_duration(field, requested) > self.max_wait_s:
            self.limit_hits.hit("max_wait_s")
            return self.max_wait_s
        return requested

    async def result(self, task: Task) -> pb.TaskResult:
        """A finished task's result; its output from the cache, else from a durable store."""
        result = pb.TaskResult(id=task.id, status=status_to_wire(task.status), message=task.message)
        if task.status is Status.SUCCEEDED:
            runtime = self.runtime
            cached = runtime.outputs.get(task.id)
            if cached is None and runtime.store is not None:
                with contextlib.suppress(StoreError):  # the status is known; only the output is not
                    stored = await runtime.store.fetch(task.id)
                    if stored is not None and stored.output is not None:
                        cached = (stored.output, stored.output_type)
                        runtime.outputs.put(task.id, *cached)
            if cached is not None:
                result.output = cached[0]
                result.output_available = True
        return result

    async def _await_result(self, task_id: int, timeout: float) -> pb.TaskResult:
        if not await self.runtime.wait_terminal(task_id, timeout):
            cap = " (limits.max_wait_s)" if timeout >= self.max_wait_s else ""
            raise DeadlineExceeded(f"task {task_id} is still not finished after waiting {timeout:g} s{cap}")
        task = self.runtime.engine.get(task_id)
        if task is None:
            raise NotFound(f"task {task_id} finished and is no longer retained")
        result = await self.result(task)
        await self.runtime.settle((task_id,))  # it may have finished in a commit still to come
        return result

    async def wait(self, caller: Principal, req: pb.WaitRequest, pool: str = "") -> pb.TaskResult:
        pool = self._named_pool(caller, pool)
        remote = await self._ref_owner(caller, "task", req.task, pool)
        if remote is not None:
            assert self.routing is not None
            return await self.routing.forward(remote, WAIT, req, caller, pool=pool)
        found = await self._task(caller, "task", req.task, pool)
        timeout = self._wait_limit("timeout_s", req.timeout_s if req.HasField("timeout_s") else None)
        if isinstance(found, StoredTask):
            return await self.result(found.task)
        return await self._await_result(found.id, timeout)

    def watch(self, caller: Principal, req: pb.WatchRequest) -> AsyncIterator[pb.StatusEvent]:
        """Status events of this shard; with [[shards]], of every shard (unless forwarded here)."""
        if self.routing is None or caller.forwarded:
            return self._watch_local(caller, req)
        return self.routing.watch(caller, req, self._watch_local)

    async def _watch_local(self, caller: Principal, req: pb.WatchRequest) -> AsyncIterator[pb.StatusEvent]:
        engine = self.runtime.engine
        for pool in req.pools:
            if not engine.has_pool(pool):
                raise NotFound(f"pools: unknown pool {shown(pool)}")
            self._check_pool(caller, "pools", pool)
        # No pools asked: every pool the caller may see (None: all; an empty scope sees none).
        pools = frozenset(req.pools) if req.pools else caller.pools
        watcher = self.runtime.subscribe(pools, req.ids, req.keys, req.all_transitions)
        try:
            while True:
                await watcher.wakeup.wait()
                watcher.wakeup.clear()
                if watcher.error is not None:
                    raise watcher.error
                while watcher.buffer:
                    status, attempt, at, message, task = watcher.buffer.popleft()
                    yield pb.StatusEvent(
                        id=task.id,
                        pool=task.spec.pool,
                        key=task.spec.key,
                        status=status_to_wire(status),
                        attempt=attempt,
                        at_unix_ns=int(at * NS),
                        message=message,
                    )
        finally:
            self.runtime.unsubscribe(watcher)

    # -------------------------------------------------------------------------------- admin

    async def snapshot(self, caller: Principal) -> pb.SnapshotResponse:
        """This shard's snapshot; with [[shards]], every shard's pools and counts added up."""
        if self.routing is None or caller.forwarded:
            return self._snapshot_local(caller, pb.Empty())
        return await self.routing.snapshot(caller, self._snapshot_local)

    def _snapshot_local(self, caller: Principal, req: pb.Empty) -> pb.SnapshotResponse:
        snap = self.runtime.engine.snapshot(self.runtime.clock())
        if caller.pools is not None:
            snap = scoped_snapshot(snap, caller.pools)
        return snapshot_to_wire(snap)

    async def list_workers(self, caller: Principal) -> pb.ListWorkersResponse:
        """Connected workers; with [[shards]], every shard's."""
        if self.routing is None or caller.forwarded:
            return self._workers_local(caller, pb.Empty())
        return await self.routing.list_workers(caller, self._workers_local)

    def _workers_local(self, caller: Principal, req: pb.Empty) -> pb.ListWorkersResponse:
        connected = self.connected
        workers = []
        for view in self.runtime.engine.workers():
            if not caller.may_use_pool(view.pool):
                continue
            name, since = connected.get(view.id, ("", 0))
            workers.append(
                pb.WorkerInfo(
                    id=view.id,
                    name=name,
                    pool=view.pool,
                    labels=dict(view.labels),
                    slots=view.slots,
                    busy=view.busy,
                    connected_unix_ns=since,
                )
            )
        return pb.ListWorkersResponse(workers=workers)

    # ---------------------------------------------------------------------------------- recurring

    async def add_recurring(self, caller: Principal, req: pb.RecurringRequest) -> pb.Empty:
        """Add or replace a schedule on the shard owning its template's pool; answered once the
        schedule (and its first occurrence) is committed."""
        if self.routing is not None:
            remote = self.routing.pool_owner(req.template.pool)
            if remote is not None:
                return await self.routing.forward(remote, ADD_RECURRING, req, caller)
        runtime = self.runtime
        with self.limit_hits.counting():
            spec = recurring_from_wire(
                req,
                default_pool=self.default_pool,
                pools=self.retry_defaults,
                limits=self.spec_limits,
                now=runtime.clock(),
            )
        self._own(caller, "template", spec.template)
        held = next((r for r in runtime.engine.list_recurring() if r.spec.name == spec.name), None)
        if held is not None and not caller.may_use_pool(held.spec.template.pool):  # would replace it
            raise PermissionDenied(
                f"name: schedule '{spec.name}' exists in a pool this credential may not use"
            )
        if not runtime.accepting:
            raise unadmitted(SHUTTING_DOWN)
        try:
            runtime.engine.add_recurring(spec, runtime.clock())
        except RecurringError as err:  # the engine names the field: "cron: ...", "template.resources: ..."
            # NOT_FOUND, as for a task's (docs/http-api.md, Errors)
            missing = err.code in ("unknown_pool", "unknown_resource")
            raise (NotFound if missing else InvalidArgument)(str(err)) from None
        runtime.flush()
        await runtime.sync()
        return pb.Empty()

    def _schedule_name(self, name: str) -> str:
        if not name:
            raise InvalidArgument("name: required")
        with self.limit_hits.counting():
            return check_key("name", name, self.spec_limits.max_key_len)

    async def remove_recurring(
        self, caller: Principal, req: pb.RemoveRecurringRequest
    ) -> pb.RemoveRecurringResponse:
        """Remove a schedule by name; with [[shards]], from every shard that has one of that name
        (removed if any did). The engine cancels the occurrence it created ahead, if not started."""
        self._schedule_name(req.name)
        if self.routing is None or caller.forwarded:
            return await self._remove_local(caller, req)
        return await self.routing.remove_recurring(caller, req, self._remove_local)

    async def _remove_local(
        self, caller: Principal, req: pb.RemoveRecurringRequest
    ) -> pb.RemoveRecurringResponse:
        runtime = self.runtime
        engine = runtime.engine
        found = next((r for r in engine.list_recurring() if r.spec.name == req.name), None)
        if found is None or not caller.may_use_pool(found.spec.template.pool):
            return pb.RemoveRecurringResponse(removed=False)
        removed = engine.remove_recurring(req.name, runtime.clock())
        runtime.flush()
        await runtime.sync()
        return pb.RemoveRecurringResponse(removed=removed)

    async def list_recurring(self, caller: Principal) -> pb.ListRecurringResponse:
        """Schedules in the pools the caller may see; with [[shards]], every shard's."""
        if self.routing is None or caller.forwarded:
            return self._recurring_local(caller, pb.Empty())
        return await self.routing.list_recurring(caller, self._recurring_local)

    def _recurring_local(self, caller: Principal, req: pb.Empty) -> pb.ListRecurringResponse:
        return pb.ListRecurringResponse(
            schedules=[
                recurring_info(r)
                for r in self.runtime.engine.list_recurring()
                if caller.may_use_pool(r.spec.template.pool)
            ]
        )


def scoped_snapshot(snap: EngineSnapshot, pools: Collection[str]) -> EngineSnapshot:
    """What a pool-scoped credential sees: its pools only, with the counts that add up over pools
    (running, pending, workers) summed over them; the process-wide ``live_tasks`` and ``totals``, kept
    for no single pool, are zero."""
    mine = [p for p in snap.pools if p.name in pools]
    return replace(
        snap,
        pools=mine,
        live_tasks=0,
        running=sum(p.busy for p in mine),
        pending=sum(sum(p.pending_by_class) for p in mine),
        totals=Totals(),
        workers_connected=sum(p.workers_connected for p in mine),
    )


def snapshot_to_wire(snap: EngineSnapshot) -> pb.SnapshotResponse:
    t = snap.totals
    return pb.SnapshotResponse(
        pools=[
            pb.PoolSnapshot(
                name=p.name,
                capacity=p.capacity,
                busy=p.busy,
                held=p.held,
                desired=p.desired,
                pending_by_class=list(p.pending_by_class),
                reservations=p.reservations,
                dispatched=p.dispatched,
                succeeded=p.succeeded,
                failed=p.failed,
                priority_adherence=_finite(p.priority_adherence),
                fixed_start_hit_rate=_finite(p.fixed_start_hit_rate),
                utilization=_finite(p.utilization),
                schedule_efficiency=_finite(p.schedule_efficiency),
                wait_p50_s=p.wait_p50,
                wait_p90_s=p.wait_p90,
                wait_p99_s=p.wait_p99,
                cost=p.cost,
                workers_connected=p.workers_connected,
                groups=[
                    pb.WorkerGroup(labels=dict(g.labels), capacity=g.capacity, busy=g.busy) for g in p.groups
                ],
            )
            for p in snap.pools
        ],
        live_tasks=snap.live_tasks,
        running=snap.running,
        pending=snap.pending,
        totals=pb.Totals(
            submitted=t.submitted,
            dispatched=t.dispatched,
            succeeded=t.succeeded,
            failed=t.failed,
            dead_lettered=t.dead_lettered,
            cancelled=t.cancelled,
            skipped=t.skipped,
            missed=t.missed,
            shed=t.shed,
            retries=t.retries,
            timeouts=t.timeouts,
            lease_expiries=t.lease_expiries,
            stale_completions=t.stale_completions,
        ),
        workers_connected=snap.workers_connected,
    )


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


__all__ = ["ShardService", "scoped_snapshot", "snapshot_to_wire", "submit_error"]
