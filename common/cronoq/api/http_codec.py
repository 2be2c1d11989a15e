"""JSON to protobuf and back, for the HTTP gateway (the conventions of docs/http-api.md).

The gateway is a thin adapter over :class:`~shard.service.ShardService`, which speaks wire protobuf messages.
This module only translates: it checks the *shape* of a JSON document (types, unknown fields, both of
two exclusive fields) and names the offending JSON field in the error, then leaves every rule about the
values (ranges, limits, pools, permissions) to the service, so HTTP and gRPC refuse the same things with
the same words.

Conventions: ids are JSON strings (u64 overflows a JavaScript number), enums are lower-case names,
durations are seconds, instants are RFC 3339 strings or Unix seconds, bytes are base64 unless they are
JSON. ``null`` means "absent" everywhere.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.message import Message
from multidict import MultiMapping

from cronoq.checks import MAX_POOL_LEN, check_text
from cronoq.errors import InvalidArgument
from cronoq.v1 import cronoq_pb2 as pb

if TYPE_CHECKING:  # the type of a generated enum (pb.TaskStatus, ...): it exists for the type checker only
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

NS = 1_000_000_000
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
JSON_TYPE = "application/json"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

JsonObject = dict[str, object]
T = TypeVar("T")
V = TypeVar("V", bound=int)
Reader = Callable[[str, object], T]

_DIGITS = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _enum_names(enum: _EnumTypeWrapper[V], prefix: str) -> dict[V, str]:
    """Lower-case JSON names of a wire enum's values (``TASK_STATUS_SHED`` → shed); the zero
    "unspecified" value has no name and renders as ``null``."""
    return {value: name.removeprefix(prefix).lower() for name, value in enum.items() if value}


STATUS_NAMES = _enum_names(pb.TaskStatus, "TASK_STATUS_")
PRIORITY_NAMES = _enum_names(pb.Priority, "PRIORITY_")
COND_NAMES = _enum_names(pb.EdgeCond, "EDGE_COND_ON_")
MISS_NAMES = _enum_names(pb.MissPolicy, "MISS_POLICY_")
OVERLAP_NAMES = _enum_names(pb.Overlap, "OVERLAP_")


# ------------------------------------------------------------------------------------------ raw JSON


class FieldError(ValueError):
    """A JSON document refused for one value in it (a number out of range, a key given twice); the
    message starts with that value's path (``tasks[1].timeout_s: ...``), as the readers' refusals do."""


class _Refused:
    """What the parser's hooks put in place of a refused value: they see the value but not where it is,
    so its path is looked up once the document is parsed (:func:`_first_refusal`)."""

    __slots__ = ("key", "why")

    def __init__(self, why: str, key: str | None = None) -> None:
        self.why = why
        self.key = key  # the key given twice, inside the object this stands for


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def parse_json(data: bytes) -> object:
    """Strict JSON (RFC 8259): UTF-8, no NaN/Infinity, no number that overflows a double (so every value
    we take in can be stored and written back as valid JSON), and no key given twice in one object (which
    one counts would be a guess: parsers disagree). Every refusal is a ``ValueError``; those of one value
    are a :class:`FieldError` naming its path."""
    refused = False

    def number(text: str) -> object:
        nonlocal refused
        value = float(text)
        if math.isfinite(value):
            return value
        refused = True
        return _Refused(f"number {text} is out of range")

    def pairs(items: list[tuple[str, object]]) -> object:
        nonlocal refused
        obj: JsonObject = {}
        for key, value in items:
            if key in obj:
                refused = True
                return _Refused("given more than once in the same object", key)
            obj[key] = value
        return obj

    try:
        text = data.decode()
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start})") from None
    try:
        document = json.loads(text, parse_float=number, parse_constant=_no_constants, object_pairs_hook=pairs)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    error = _first_refusal(document) if refused else None
    if error is not None:
        raise error
    return document


def _first_refusal(document: object) -> FieldError | None:
    """The first refused value of ``document``, in document order, as an error naming its path. Walked
    with a stack rather than recursion: a document may be nested close to the interpreter's limit."""
    stack: list[tuple[str, object]] = [("", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _Refused):
            if value.key is not None:
                path = f"{path}.{value.key}" if path else value.key
            return FieldError(f"{path or 'request body'}: {value.why}")
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else k, v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            where = path or "request body"
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


def dump_json(value: object) -> str:
    """Compact JSON text for responses; ASCII-only so text that came in with unpaired surrogate escapes
    (legal JSON, not encodable as UTF-8) still goes out intact."""
    return json.dumps(value, separators=(",", ":"))


def media_type(content_type: str) -> str:
    return content_type.partition(";")[0].strip().lower()


# ---------------------------------------------------------------------------------- error messages

# Wire field names the shared request logic (shard/convert.py, shard/service.py, the router) puts in its
# messages, and the HTTP names of the same fields, so that a message names the field the caller sent
# (docs/http-api.md, Errors). The instants are renamed wherever a message mentions them ("use either start_in_s or
# start_unix_ns"); ``pools``, an English word too ("this credential's pools"), only as the field a
# message starts with (the ``pool`` query parameter of a listing or a watch).
_INSTANT_NAMES: Mapping[str, str] = {"start_unix_ns": "start_at", "deadline_unix_ns": "deadline_at"}
_FIELD_NAMES: Mapping[str, str] = {**_INSTANT_NAMES, "pools": "pool"}
_WORD = re.compile(r"'[^']*'|\"[^\"]*\"|\w+")  # a quoted value (what the caller sent: left alone) or a word


def _renamed(text: str, names: Mapping[str, str]) -> str:
    return _WORD.sub(lambda m: names.get(m[0], m[0]), text)


def http_message(message: str) -> str:
    """An error message of the request logic in the HTTP API's words: ``task.start_unix_ns: ...`` becomes
    ``task.start_at: ...``, ``pools: unknown pool 'x'`` becomes ``pool: unknown pool 'x'``."""
    field, colon, rest = message.partition(": ")
    if not colon or " " in field:  # the message does not start with a field path
        return _renamed(message, _INSTANT_NAMES)
    return _renamed(field, _FIELD_NAMES) + colon + _renamed(rest, _INSTANT_NAMES)


# ------------------------------------------------------------------------------------ value readers


def text(path: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{path}: expected a string")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidArgument(f"{path}: not valid Unicode (unpaired surrogate)") from None
    return value


def boolean(path: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{path}: expected true or false")
    return value


def _float(path: str, value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{path}: expected {what}")
    try:
        return float(value)
    except OverflowError:
        raise InvalidArgument(f"{path}: expected {what} (got a number too large)") from None


def seconds(path: str, value: object) -> float:
    return _float(path, value, "a number of seconds")


def number(path: str, value: object) -> float:
    return _float(path, value, "a number")


def uint32(path: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U32_MAX:
        raise InvalidArgument(f"{path}: expected an integer between 0 and {U32_MAX}")
    return value


def task_id(path: str, value: object) -> int:
    """A task id given as a string of digits (what responses carry) or as a JSON integer."""
    if isinstance(value, str) and _DIGITS.fullmatch(value) and len(value) <= 20:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
        raise InvalidArgument(f"{path}: expected a task id (a string of digits below 2^64)")
    return value


def instant_ns(path: str, value: object) -> int:
    """An instant as Unix nanoseconds, from an RFC 3339 string (with an offset) or Unix seconds."""
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.upper())  # RFC 3339 allows a lower-case t and z
        except ValueError:
            when = None
        if when is None or when.tzinfo is None:
            raise InvalidArgument(
                f"{path}: expected an RFC 3339 timestamp with an offset (2030-01-02T03:04:05Z) "
                "or Unix seconds"
            )
        delta = when - EPOCH
        result = (delta.days * 86_400 + delta.seconds) * NS + delta.microseconds * 1000
    else:
        stamp = _float(path, value, "an RFC 3339 timestamp or Unix seconds")
        if isinstance(value, int):
            result = value * NS
        else:  # int64 nanoseconds end near ±9.2e9 s; larger floats must not reach round() (inf)
            result = round(stamp * NS) if abs(stamp) < 1e10 else _INT64_MAX + 1
    if not _INT64_MIN <= result <= _INT64_MAX:
        raise InvalidArgument(f"{path}: out of range (years 1678 to 2261)")
    return result


def base64_bytes(path: str, value: object) -> bytes:
    encoded = text(path, value)
    try:
        return base64.b64decode(encoded, validate=True)
    except ValueError:  # binascii.Error, or non-ASCII text
        raise InvalidArgument(f"{path}: not valid base64 (standard alphabet, padded)") from None


def named(names: Mapping[V, str]) -> Reader[V]:
    """A reader for a wire enum given by its lower-case name."""
    values = {name: number for number, name in names.items()}
    choices = ", ".join(names.values())

    def read(path: str, value: object) -> V:
        if not isinstance(value, str) or value not in values:
            raise InvalidArgument(f"{path}: expected one of {choices}")
        return values[value]

    return read


def _any(path: str, value: object) -> object:
    return value


def _array(path: str, value: object) -> list[object]:
    if not isinstance(value, list):
        raise InvalidArgument(f"{path}: expected an array")
    return value


def _map(path: str, value: object, read: Reader[T]) -> dict[str, T]:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{path}: expected an object")
    return {text(f"{path} key", k): read(f"{path}.{k}", v) for k, v in value.items()}


def text_map(path: str, value: object) -> dict[str, str]:
    return _map(path, value, text)


def uint32_map(path: str, value: object) -> dict[str, int]:
    return _map(path, value, uint32)


class Fields:
    """One JSON object read field by field; whatever no reader took is reported as an unknown field."""

    def __init__(self, path: str, value: object) -> None:
        if not isinstance(value, dict):
            raise InvalidArgument(f"{path or 'request body'}: expected a JSON object")
        self.path = path
        self._rest: dict[str, object] = dict(value)

    def at(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, read: Reader[T]) -> T | None:
        value = self._rest.pop(name, None)
        return None if value is None else read(self.at(name), value)

    def set(self, msg: Message, table: tuple[tuple[str, str, Reader[Any]], ...]) -> None:
        """Copy the fields named in ``table`` (JSON name, wire name, reader) that are present."""
        for name, wire, read in table:
            value = self.get(name, read)
            if value is not None:
                setattr(msg, wire, value)

    def finish(self) -> None:
        unknown = next(iter(self._rest), None)
        if unknown is not None:
            raise InvalidArgument(f"{self.at(unknown)}: unknown field")


# ----------------------------------------------------------------------------------- request bodies

_SPEC_SCALARS: tuple[tuple[str, str, Reader[Any]], ...] = (
    ("kind", "kind", text),
    ("pool", "pool", text),
    ("key", "key", text),
    ("tenant", "tenant", text),
    ("priority", "priority", named(PRIORITY_NAMES)),
    ("deadline_in_s", "deadline_in_s", seconds),
    ("deadline_at", "deadline_unix_ns", instant_ns),
    ("start_in_s", "start_in_s", seconds),
    ("start_at", "start_unix_ns", instant_ns),
    ("tolerance_s", "tolerance_s", seconds),
    ("on_miss", "on_miss", named(MISS_NAMES)),
    ("duration_hint_s", "duration_hint_s", seconds),
    ("timeout_s", "timeout_s", seconds),
)
_SPEC_MAPS: tuple[tuple[str, Reader[Mapping[str, Any]]], ...] = (
    ("resources", uint32_map),
    ("tags", text_map),
    ("labels", text_map),
)
_RETRY: tuple[tuple[str, str, Reader[Any]], ...] = (
    ("max_attempts", "max_attempts", uint32),
    ("initial_backoff_s", "initial_backoff_s", seconds),
    ("multiplier", "multiplier", number),
    ("max_backoff_s", "max_backoff_s", seconds),
    ("jitter", "jitter", boolean),
)


def _retry(path: str, value: object) -> pb.RetryPolicy:
    fields = Fields(path, value)
    msg = pb.RetryPolicy()
    fields.set(msg, _RETRY)
    fields.finish()
    return msg


def _ref(fields: Fields) -> pb.TaskRef:
    ref_id = fields.get("id", task_id)
    key = fields.get("key", text)
    if key is None and ref_id is not None:
        return pb.TaskRef(id=ref_id)
    if ref_id is None and key is not None:
        return pb.TaskRef(key=key)
    raise InvalidArgument(f"{fields.path}: set either id or key")


def _dep(path: str, value: object) -> pb.Dep:
    fields = Fields(path, value)
    dep = pb.Dep(target=_ref(fields), cond=fields.get("on", named(COND_NAMES)) or pb.EDGE_COND_UNSPECIFIED)
    fields.finish()
    return dep


def _payload(fields: Fields, spec: pb.TaskSpec) -> None:
    """``payload`` (a JSON value, stored as compact UTF-8 JSON) or ``payload_base64`` (+ content_type)."""
    value = fields.get("payload", _any)
    encoded = fields.get("payload_base64", base64_bytes)
    content_type = fields.get("content_type", text)
    if value is not None and encoded is not None:
        raise InvalidArgument(f"{fields.at('payload')}: send either payload or payload_base64, not both")
    if value is None:
        if encoded is not None:
            spec.payload = encoded
        if content_type is not None:
            spec.content_type = content_type
        return
    if content_type is not None and media_type(content_type) != JSON_TYPE:
        raise InvalidArgument(
            f"{fields.at('content_type')}: payload is JSON; send payload_base64 for {content_type!r} bytes"
        )
    try:
        spec.payload = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise InvalidArgument(f"{fields.at('payload')}: not valid Unicode (unpaired surrogate)") from None
    except RecursionError:  # parsed near the interpreter's limit, encoded from a deeper call stack
        raise InvalidArgument(f"{fields.at('payload')}: nested too deeply") from None
    spec.content_type = content_type or JSON_TYPE


def _fill_spec(fields: Fields, spec: pb.TaskSpec) -> None:
    _payload(fields, spec)
    fields.set(spec, _SPEC_SCALARS)
    for name, read in _SPEC_MAPS:
        entries = fields.get(name, read)
        if entries is not None:
            getattr(spec, name).update(entries)
    retry = fields.get("retry", _retry)
    if retry is not None:
        spec.retry.CopyFrom(retry)
    deps = fields.get("deps", _array)
    if deps is not None:
        spec.deps.extend(_dep(f"{fields.at('deps')}[{i}]", d) for i, d in enumerate(deps))


def _task_spec(path: str, value: object) -> pb.TaskSpec:
    fields = Fields(path, value)
    spec = pb.TaskSpec()
    _fill_spec(fields, spec)
    fields.finish()
    return spec


def submit_request(document: object) -> pb.SubmitRequest:
    """``POST /v1/tasks``: TaskSpec fields at the top level, plus ``wait`` and ``wait_timeout_s``."""
    fields = Fields("", document)
    req = pb.SubmitRequest(wait=fields.get("wait", boolean) or False)
    wait_timeout = fields.get("wait_timeout_s", seconds)
    if wait_timeout is not None:
        req.wait_timeout_s = wait_timeout
    _fill_spec(fields, req.task)
    fields.finish()
    return req


def submit_batch_request(document: object) -> pb.SubmitBatchRequest:
    """``POST /v1/tasks:batch``: ``{"tasks": [TaskSpec, ...]}``."""
    fields = Fields("", document)
    tasks = fields.get("tasks", _array)
    fields.finish()
    if tasks is None:
        raise InvalidArgument("tasks: required")
    return pb.SubmitBatchRequest(tasks=[_task_spec(f"tasks[{i}]", t) for i, t in enumerate(tasks)])


def recurring_request(document: object) -> pb.RecurringRequest:
    """``POST /v1/recurring``: ``{"name", "cron", "tz", "overlap", "template": {TaskSpec fields}}``."""
    fields = Fields("", document)
    req = pb.RecurringRequest()
    fields.set(
        req,
        (
            ("name", "name", text),
            ("cron", "cron", text),
            ("tz", "tz", text),
            ("overlap", "overlap", named(OVERLAP_NAMES)),
        ),
    )
    template = fields.get("template", _task_spec)
    fields.finish()
    if template is not None:
        req.template.CopyFrom(template)
    return req


# ------------------------------------------------------------------------------ paths and queries


def task_ref(value: str) -> pb.TaskRef:
    """``{id-or-key}`` of a task route: all digits is an id, anything else a key."""
    if not _DIGITS.fullmatch(value):
        return pb.TaskRef(key=value)
    if len(value) > 20 or int(value) > U64_MAX:
        raise InvalidArgument(f"id: {value[:40]} is out of range (task ids are below 2^64)")
    return pb.TaskRef(id=int(value))


class Query:
    """The query string of one request; parameters nobody asked for are reported as unknown."""

    def __init__(self, query: MultiMapping[str]) -> None:
        self._query = query
        self._unread = set(query)

    def all(self, name: str, *, comma: bool) -> list[str]:
        """Every value of a repeatable parameter; ``comma`` also splits ``a,b`` (not for free text)."""
        self._unread.discard(name)
        values = self._query.getall(name, [])
        if comma:
            values = [part for value in values for part in value.split(",")]
        return [v for v in values if v]

    def one(self, name: str, read: Callable[[str, str], T]) -> T | None:
        self._unread.discard(name)
        values = self._query.getall(name, [])
        if len(values) > 1:
            raise InvalidArgument(f"{name}: given {len(values)} times; give it once")
        return read(name, values[0]) if values else None

    def finish(self) -> None:
        if self._unread:
            raise InvalidArgument(f"{min(self._unread)}: unknown query parameter")


def query_seconds(name: str, value: str) -> float:
    if not _DECIMAL.fullmatch(value):
        raise InvalidArgument(f"{name}: expected a number of seconds")
    return seconds(name, float(value))


def query_uint(bound: int) -> Callable[[str, str], int]:
    def read(name: str, value: str) -> int:
        if not _DIGITS.fullmatch(value) or len(value) > 20 or int(value) > bound:
            raise InvalidArgument(f"{name}: expected an integer between 0 and {bound}")
        return int(value)

    return read


def query_flag(name: str, value: str) -> bool:
    """``all``, ``all=true``/``1`` or ``all=false``/``0``."""
    flags = {"": True, "true": True, "1": True, "false": False, "0": False}
    if value.lower() not in flags:
        raise InvalidArgument(f"{name}: expected true or false")
    return flags[value.lower()]


_status = named(STATUS_NAMES)


def named_pool(query: Query, *, finish: bool) -> str:
    """``?pool=`` of a task lookup: the pool of the task named ("" when not given), which settles a key
    that tasks on two shards hold. ``finish`` refuses every other parameter."""
    pool = query.one("pool", _text_parameter) or ""
    if finish:
        query.finish()
    return pool


def _text_parameter(name: str, value: str) -> str:
    return check_text(name, value, MAX_POOL_LEN)


def wait_request(ref: str, query: Query) -> pb.WaitRequest:
    req = pb.WaitRequest(task=task_ref(ref))
    timeout = query.one("timeout_s", query_seconds)
    query.finish()
    if timeout is not None:
        req.timeout_s = timeout
    return req


def list_request(query: Query) -> pb.ListTasksRequest:
    """``?pool=&status=&after=&limit=``; pool and status repeat or take comma-separated lists."""
    req = pb.ListTasksRequest(
        pools=query.all("pool", comma=True),
        statuses=[_status("status", s) for s in query.all("status", comma=True)],
        after=query.one("after", query_uint(U64_MAX)) or 0,
        limit=query.one("limit", query_uint(U32_MAX)) or 0,
    )
    query.finish()
    return req


def watch_request(query: Query) -> pb.WatchRequest:
    """``?pool=&id=&key=&all=``; pool and id take comma-separated lists, key only repeats."""
    req = pb.WatchRequest(
        pools=query.all("pool", comma=True),
        ids=[task_id("id", i) for i in query.all("id", comma=True)],
        keys=query.all("key", comma=False),
        all_transitions=query.one("all", query_flag) or False,
    )
    query.finish()
    return req


# ------------------------------------------------------------------------------------ responses


def timestamp(unix_ns: int) -> str:
    """RFC 3339 in UTC with microseconds (``2030-01-02T03:04:05.123456Z``)."""
    whole, frac = divmod(unix_ns, NS)
    return (EPOCH + timedelta(seconds=whole)).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac // 1000:06d}Z"


def _optional_time(msg: Message, field: str) -> str | None:
    return timestamp(getattr(msg, field)) if msg.HasField(field) else None


def task_info(msg: pb.TaskInfo) -> JsonObject:
    return {
        "id": str(msg.id),
        "status": STATUS_NAMES.get(msg.status),
        "pool": msg.pool,
        "key": msg.key,
        "kind": msg.kind,
        "priority": PRIORITY_NAMES.get(msg.priority),
        "tenant": msg.tenant,
        "attempt": msg.attempt,
        "max_attempts": msg.max_attempts,
        "created_at": _optional_time(msg, "created_unix_ns"),
        "started_at": _optional_time(msg, "started_unix_ns"),
        "finished_at": _optional_time(msg, "finished_unix_ns"),
        "message": msg.message,
        "output_available": msg.output_available,
    }


def output(data: bytes, content_type: str) -> JsonObject:
    """``output`` as a JSON value when the bytes are JSON, else ``output_base64``; plus content_type.

    A JSON output is kept only if it also encodes again here: the response is encoded from a shallower
    call stack, so a value nested too deeply for the interpreter goes out as base64 instead of failing.
    """
    rendered: JsonObject = {}
    if media_type(content_type) == JSON_TYPE:
        with contextlib.suppress(ValueError, RecursionError):  # declared JSON but is not: base64
            value = parse_json(data)
            dump_json(value)
            rendered["output"] = value
    if not rendered:
        rendered["output_base64"] = base64.b64encode(data).decode("ascii")
    if content_type:
        rendered["content_type"] = content_type
    return rendered


def task_result(msg: pb.TaskResult, content_type: Callable[[int], str]) -> JsonObject:
    """``content_type`` gives the stored content type of a task's output (the wire message has none)."""
    result: JsonObject = {
        "id": str(msg.id),
        "status": STATUS_NAMES.get(msg.status),
        "message": msg.message,
        "output_available": msg.output_available,
    }
    if msg.HasField("output"):
        result.update(output(msg.output, content_type(msg.id)))
    return result


def submitted(msg: pb.SubmitResponse) -> JsonObject:
    return {"id": str(msg.id), "duplicate": msg.duplicate}


def submit_response(msg: pb.SubmitResponse, content_type: Callable[[int], str]) -> JsonObject:
    rendered = submitted(msg)
    if msg.HasField("result"):
        rendered["result"] = task_result(msg.result, content_type)
    return rendered


def submit_batch_response(msg: pb.SubmitBatchResponse) -> JsonObject:
    return {"tasks": [submitted(t) for t in msg.tasks]}


def list_response(msg: pb.ListTasksResponse) -> JsonObject:
    return {
        "tasks": [task_info(t) for t in msg.tasks],
        "next_after": str(msg.next_after),
        "unavailable_shards": list(msg.unavailable_shards),
    }


def status_event(msg: pb.StatusEvent) -> JsonObject:
    return {
        "id": str(msg.id),
        "pool": msg.pool,
        "key": msg.key,
        "status": STATUS_NAMES.get(msg.status),
        "attempt": msg.attempt,
        "at": timestamp(msg.at_unix_ns),
        "message": msg.message,
    }


def _pool_snapshot(p: pb.PoolSnapshot) -> JsonObject:
    return {
        "name": p.name,
        "capacity": p.capacity,
        "busy": p.busy,
        "held": p.held,
        "desired": p.desired,
        "pending_by_class": dict(zip(PRIORITY_NAMES.values(), p.pending_by_class, strict=False)),
        "reservations": p.reservations,
        "dispatched": p.dispatched,
        "succeeded": p.succeeded,
        "failed": p.failed,
        "priority_adherence": p.priority_adherence,
        "fixed_start_hit_rate": p.fixed_start_hit_rate,
        "utilization": p.utilization,
        "schedule_efficiency": p.schedule_efficiency,
        "wait_p50_s": p.wait_p50_s,
        "wait_p90_s": p.wait_p90_s,
        "wait_p99_s": p.wait_p99_s,
        "cost": p.cost,
        "workers_connected": p.workers_connected,
        "groups": [{"labels": dict(g.labels), "capacity": g.capacity, "busy": g.busy} for g in p.groups],
    }


def snapshot(msg: pb.SnapshotResponse) -> JsonObject:
    return {
        "pools": [_pool_snapshot(p) for p in msg.pools],
        "live_tasks": msg.live_tasks,
        "running": msg.running,
        "pending": msg.pending,
        "totals": {f.name: getattr(msg.totals, f.name) for f in pb.Totals.DESCRIPTOR.fields},
        "workers_connected": msg.workers_connected,
        "unavailable_shards": list(msg.unavailable_shards),
    }


def recurring_info(msg: pb.RecurringInfo) -> JsonObject:
    return {
        "name": msg.name,
        "cron": msg.cron,
        "tz": msg.tz,
        "pool": msg.pool,
        "kind": msg.kind,
        "overlap": OVERLAP_NAMES.get(msg.overlap, "skip"),
        "next_at": _optional_time(msg, "next_unix_ns"),
        "last_task_id": str(msg.last_task_id) if msg.HasField("last_task_id") else None,
    }


def recurring_list(msg: pb.ListRecurringResponse) -> JsonObject:
    return {
        "schedules": [recurring_info(s) for s in msg.schedules],
        "unavailable_shards": list(msg.unavailable_shards),
    }


def workers(msg: pb.ListWorkersResponse) -> JsonObject:
    return {
        "workers": [
            {
                "id": str(w.id),
                "name": w.name,
                "pool": w.pool,
                "labels": dict(w.labels),
                "slots": w.slots,
                "busy": w.busy,
                "connected_at": timestamp(w.connected_unix_ns) if w.connected_unix_ns else None,
            }
            for w in msg.workers
        ],
        "unavailable_shards": list(msg.unavailable_shards),
    }
