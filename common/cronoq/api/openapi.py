"""The OpenAPI 3.0 description of the HTTP/JSON API, served at ``GET /v1/openapi.json``.

It is data, kept next to the gateway so a route or field change and its description land in one commit;
``tests/unit/test_http_openapi.py`` checks that every route of the application is described and that the
answers of a live server match these schemas.
"""

from __future__ import annotations

from typing import Any, Final

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict[str, Schema], *, required: tuple[str, ...] = (), closed: bool = True) -> Schema:
    """An object schema; ``closed`` (every request body) means unknown fields are refused with 400."""
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def _all(properties: dict[str, Schema]) -> Schema:
    """A response object: every listed field is always present."""
    return _obj(properties, required=tuple(properties))


def _nullable(schema: Schema) -> Schema:
    """``schema`` or ``null``. OpenAPI 3.0 honours ``nullable`` only next to ``type`` (beside a ``$ref``
    it is ignored, as every sibling of a reference is), and an ``enum`` still refuses what it does not
    list, so a nullable enum lists ``null``."""
    if "type" not in schema:
        raise ValueError(f"nullable needs a type beside it to have any effect: {schema}")
    nullable = {**schema, "nullable": True}
    if "enum" in schema:
        nullable["enum"] = [*schema["enum"], None]
    return nullable


def _optional(schema: Schema) -> Schema:
    """A request field that may also be ``null``, which means "not given" (the gateway reads every
    ``null`` that way): :func:`_nullable` where the schema has a type; a reference or a combination is
    wrapped in ``allOf``."""
    if "type" in schema:
        return _nullable(schema)
    notes = {k: v for k, v in schema.items() if k in ("description", "default")}
    core = {k: v for k, v in schema.items() if k not in notes}
    return {**notes, "nullable": True, "allOf": [core]} if core else schema


def _request(properties: dict[str, Schema], *, required: tuple[str, ...] = ()) -> Schema:
    """A request body object: closed, and every field but the required ones may be ``null``."""
    fields = {name: s if name in required else _optional(s) for name, s in properties.items()}
    return _obj(fields, required=required)


STRING: Final[Schema] = {"type": "string"}
BOOL: Final[Schema] = {"type": "boolean"}
UINT: Final[Schema] = {"type": "integer", "minimum": 0}
NUMBER: Final[Schema] = {"type": "number"}
SECONDS: Final[Schema] = {"type": "number", "minimum": 0, "description": "seconds"}
TIMESTAMP: Final[Schema] = {"type": "string", "format": "date-time", "description": "RFC 3339, UTC"}
STRING_MAP: Final[Schema] = {"type": "object", "additionalProperties": STRING}
STRINGS: Final[Schema] = {"type": "array", "items": STRING}
# Written out (not a reference) where an id may be null: nullable works only beside a type.
TASK_ID: Final[Schema] = {"type": "string", "pattern": "^[0-9]+$", "description": "u64 as a decimal string"}

PRIORITIES = ["critical", "high", "normal", "low"]
STATUSES = [
    "blocked",
    "scheduled",
    "ready",
    "running",
    "retrying",
    "succeeded",
    "failed",
    "dead_lettered",
    "cancelled",
    "skipped",
    "missed",
    "shed",
]
OVERLAPS = ["skip", "allow", "queue", "queue_on_success"]
ERROR_CODES = [
    "invalid_argument",
    "unauthenticated",
    "permission_denied",
    "not_found",
    "failed_precondition",
    "resource_exhausted",
    "unavailable",
    "deadline_exceeded",
    "unimplemented",
    "data_loss",
    "internal",
    "already_exists",
    "aborted",
    "out_of_range",
    "cancelled",
    "unknown",
]

_TASK_SPEC_FIELDS: dict[str, Schema] = {
    "payload": {"description": "any JSON value; stored as compact UTF-8 JSON, content type application/json"},
    "payload_base64": {"type": "string", "format": "byte", "description": "bytes; not with payload"},
    "content_type": {"type": "string", "maxLength": 128},
    "kind": STRING,
    "pool": {"type": "string", "description": "default: the default pool"},
    "priority": {"$ref": "#/components/schemas/Priority"},
    "key": {"type": "string", "description": "idempotency key; a live task with it is returned instead"},
    "deadline_in_s": SECONDS,
    "deadline_at": _ref("Instant"),
    "start_in_s": SECONDS,
    "start_at": _ref("Instant"),
    "tolerance_s": SECONDS,
    "on_miss": {"type": "string", "enum": ["run_late", "skip", "fail"]},
    "duration_hint_s": SECONDS,
    "timeout_s": {**SECONDS, "description": "limit of each attempt, seconds"},
    "retry": _ref("RetryPolicy"),
    "deps": {"type": "array", "items": _ref("Dep")},
    "resources": {"type": "object", "additionalProperties": {**UINT, "maximum": 4294967295}},
    "tags": STRING_MAP,
    "labels": {**STRING_MAP, "description": "worker labels the task requires"},
    "tenant": STRING,
}

SCHEMAS: Final[dict[str, Schema]] = {
    "Error": _all(
        {
            "error": {"type": "string", "description": "what was wrong, naming the field"},
            "code": {"type": "string", "enum": ERROR_CODES, "description": "gRPC status name, lower case"},
        }
    ),
    "TaskId": TASK_ID,
    "Priority": {"type": "string", "enum": PRIORITIES},
    "Status": {"type": "string", "enum": STATUSES},
    "Instant": {
        "oneOf": [TIMESTAMP, {"type": "number", "description": "Unix seconds"}],
        "description": "RFC 3339 with an offset, or Unix seconds",
    },
    "RetryPolicy": _request(
        {
            "max_attempts": {**UINT, "maximum": 4294967295},
            "initial_backoff_s": SECONDS,
            "multiplier": {
                **NUMBER,
                "oneOf": [{"minimum": 1}, {"enum": [0]}],
                "description": "at least 1; 0 means the pool's value",
            },
            "max_backoff_s": SECONDS,
            "jitter": BOOL,
        }
    ),
    "Dep": _request(
        {
            "id": {"oneOf": [_ref("TaskId"), UINT]},
            "key": STRING,
            "on": {"type": "string", "enum": ["success", "failure", "complete"], "default": "success"},
        }
    ),
    "TaskSpec": _request(_TASK_SPEC_FIELDS),
    "SubmitRequest": _request(
        {
            **_TASK_SPEC_FIELDS,
            "wait": {**BOOL, "description": "answer only when the task finished (result is set)"},
            "wait_timeout_s": {**SECONDS, "description": "with wait; capped by limits.max_wait_s"},
        }
    ),
    "SubmitBatchRequest": _request(
        {"tasks": {"type": "array", "items": _ref("TaskSpec"), "minItems": 1}}, required=("tasks",)
    ),
    "Submitted": _all({"id": _ref("TaskId"), "duplicate": BOOL}),
    "SubmitResponse": _obj(
        {"id": _ref("TaskId"), "duplicate": BOOL, "result": _ref("TaskResult")}, required=("id", "duplicate")
    ),
    "SubmitBatchResponse": _all({"tasks": {"type": "array", "items": _ref("Submitted")}}),
    "TaskInfo": _all(
        {
            "id": _ref("TaskId"),
            "status": _ref("Status"),
            "pool": STRING,
            "key": STRING,
            "kind": STRING,
            "priority": _nullable({"type": "string", "enum": PRIORITIES, "description": "null when unknown"}),
            "tenant": STRING,
            "attempt": UINT,
            "max_attempts": {**UINT, "description": "0 when unknown"},
            "created_at": _nullable(TIMESTAMP),
            "started_at": _nullable(TIMESTAMP),
            "finished_at": _nullable(TIMESTAMP),
            "message": STRING,
            "output_available": BOOL,
        }
    ),
    "TaskResult": _obj(
        {
            "id": _ref("TaskId"),
            "status": _ref("Status"),
            "message": STRING,
            "output_available": BOOL,
            "output": {"description": "the output as JSON, when its content type is application/json"},
            "output_base64": {"type": "string", "format": "byte", "description": "any other output"},
            "content_type": STRING,
        },
        required=("id", "status", "message", "output_available"),
    ),
    "CancelResponse": _all({"cancelled": {**BOOL, "description": "false when it had already finished"}}),
    "TaskList": _all(
        {
            "tasks": {"type": "array", "items": _ref("TaskInfo")},
            "next_after": {**_ref("TaskId"), "description": "pass as after for the next page; 0 at the end"},
            "unavailable_shards": STRINGS,
        }
    ),
    "StatusEvent": _all(
        {
            "id": _ref("TaskId"),
            "pool": STRING,
            "key": STRING,
            "status": _ref("Status"),
            "attempt": UINT,
            "at": TIMESTAMP,
            "message": STRING,
        }
    ),
    "WorkerGroup": _all({"labels": STRING_MAP, "capacity": UINT, "busy": UINT}),
    "PoolSnapshot": _all(
        {
            "name": STRING,
            "capacity": UINT,
            "busy": UINT,
            "held": UINT,
            "desired": UINT,
            "pending_by_class": _obj({p: UINT for p in PRIORITIES}, closed=True),
            "reservations": UINT,
            "dispatched": UINT,
            "succeeded": UINT,
            "failed": UINT,
            "priority_adherence": NUMBER,
            "fixed_start_hit_rate": NUMBER,
            "utilization": NUMBER,
            "schedule_efficiency": NUMBER,
            "wait_p50_s": NUMBER,
            "wait_p90_s": NUMBER,
            "wait_p99_s": NUMBER,
            "cost": NUMBER,
            "workers_connected": UINT,
            "groups": {"type": "array", "items": _ref("WorkerGroup")},
        }
    ),
    "Totals": _all(
        {
            name: UINT
            for name in (
                "submitted",
                "dispatched",
                "succeeded",
                "failed",
                "dead_lettered",
                "cancelled",
                "skipped",
                "missed",
                "shed",
                "retries",
                "timeouts",
                "lease_expiries",
                "stale_completions",
            )
        }
    ),
    "Snapshot": _all(
        {
            "pools": {"type": "array", "items": _ref("PoolSnapshot")},
            "live_tasks": UINT,
            "running": UINT,
            "pending": UINT,
            "totals": _ref("Totals"),
            "workers_connected": UINT,
            "unavailable_shards": STRINGS,
        }
    ),
    "WorkerInfo": _all(
        {
            "id": {**STRING, "pattern": "^[0-9]+$"},
            "name": STRING,
            "pool": STRING,
            "labels": STRING_MAP,
            "slots": UINT,
            "busy": UINT,
            "connected_at": _nullable(TIMESTAMP),
        }
    ),
    "WorkerList": _all(
        {"workers": {"type": "array", "items": _ref("WorkerInfo")}, "unavailable_shards": STRINGS}
    ),
    "RecurringRequest": _request(
        {
            "name": {"type": "string", "minLength": 1, "description": "adding an existing name replaces it"},
            "cron": {
                "type": "string",
                "minLength": 1,
                "description": "5 fields (minute resolution), or 6 with a leading seconds field",
            },
            "tz": {"type": "string", "description": "IANA time zone the cron is read in; default UTC"},
            "overlap": {**_ref("Overlap"), "default": "skip"},
            "template": {
                **_ref("TaskSpec"),
                "description": (
                    "each occurrence's task: no start_*, deps or deadline_at; deadline_in_s is relative to "
                    "each occurrence's start; key (if any) prefixes occurrence keys as key@<UTC start>"
                ),
            },
        },
        required=("name", "cron"),
    ),
    "Overlap": {"type": "string", "enum": OVERLAPS},
    "RecurringInfo": _all(
        {
            "name": STRING,
            "cron": STRING,
            "tz": STRING,
            "pool": STRING,
            "kind": STRING,
            "overlap": _ref("Overlap"),
            "next_at": _nullable({**TIMESTAMP, "description": "start of the next occurrence"}),
            "last_task_id": _nullable(
                {**TASK_ID, "description": "the last occurrence created; null before the first"}
            ),
        }
    ),
    "RecurringAdded": _all({"name": STRING}),
    "RecurringRemoved": _all({"removed": {**BOOL, "description": "false when no schedule had that name"}}),
    "RecurringList": _all(
        {"schedules": {"type": "array", "items": _ref("RecurringInfo")}, "unavailable_shards": STRINGS}
    ),
    "Health": _all({"status": {"type": "string", "enum": ["ok"]}}),
}

_ERRORS: Final[dict[int, str]] = {
    400: (
        "invalid request (invalid_argument); the message names the field, the query parameter (unknown "
        "ones are refused) or the body (refused on routes that take none)"
    ),
    401: "missing or unknown credential (unauthenticated)",
    403: "role or pool not allowed, or a non-loopback Host without auth (permission_denied)",
    404: "unknown task, pool, resource, dependency or route (not_found)",
    405: "wrong method for this path (unimplemented); see the Allow header",
    409: (
        "fixed-start reservation conflict, or a call for another shard that this server will not forward "
        "(failed_precondition; cronoq-shard and cronoq-shard-endpoint headers name the owner)"
    ),
    413: "body larger than limits.max_http_body_bytes (resource_exhausted)",
    415: "JSON body without content-type: application/json, or not in UTF-8 (invalid_argument)",
    429: (
        "pool full under overflow = reject, limits.max_pending_total reached, or too many requests or "
        "streams in progress (limits.max_concurrent_requests, max_concurrent_streams) (resource_exhausted); "
        "retry later"
    ),
    500: "internal error, or a watch that fell behind (data_loss)",
    503: "shutting down or not the leader (unavailable); retry",
    504: (
        "the server-side wait ended before the task finished, or the request took longer than "
        "limits.request_timeout_s (deadline_exceeded)"
    ),
}


def _error_responses(*statuses: int) -> dict[str, Schema]:
    return {str(s): {"$ref": f"#/components/responses/E{s}"} for s in statuses}


def _json_body(schema: str) -> Schema:
    return {"required": True, "content": {"application/json": {"schema": _ref(schema)}}}


def _op(
    operation_id: str,
    summary: str,
    response: str,
    *errors: int,
    parameters: list[Schema] | None = None,
    body: str | None = None,
    public: bool = False,
) -> Schema:
    """One operation; ``public`` routes take no credential."""
    op: Schema = {
        "operationId": operation_id,
        "summary": summary,
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": _ref(response)}}},
            **_error_responses(*errors),
        },
    }
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = _json_body(body)
    if public:
        op["security"] = []
    return op


def _param(name: str, where: str, schema: Schema, description: str, *, required: bool = False) -> Schema:
    param: Schema = {"name": name, "in": where, "schema": schema, "description": description}
    if required or where == "path":
        param["required"] = True
    return param


def _list(items: Schema) -> Schema:
    return {"type": "array", "items": items}


REF = _param("ref", "path", STRING, "task id (all digits) or key (URL-encoded)")
POOL = _param(
    "pool",
    "query",
    STRING,
    "the task's pool: a key held by tasks on two shards of a cluster is refused (409) until the pool is named",
)
# Every route: an unknown query parameter or a body where none is read (400), a body over
# limits.max_http_body_bytes (413).
_ANY = (400, 413)
# Every authenticated API route besides: credentials, a standby, a call for another shard that this
# server may not forward (each route can reach another shard: the task's or pool's owner, or all of them
# for a listing), and the server-wide [limits] (concurrent requests or streams: 429;
# limits.request_timeout_s: 504).
_API = (*_ANY, 401, 403, 409, 429, 503, 504)

PATHS: Final[dict[str, Schema]] = {
    "/v1/tasks": {
        "post": _op(
            "submit",
            "Submit one task (optionally wait for it)",
            "SubmitResponse",
            *_API,
            404,
            415,
            body="SubmitRequest",
        ),
        "get": _op(
            "listTasks",
            "List tasks in id order, one page at a time",
            "TaskList",
            *_API,
            404,
            parameters=[
                _param("pool", "query", _list(STRING), "pool names; repeat or comma-separate"),
                _param(
                    "status",
                    "query",
                    _list({"type": "string", "enum": [*STATUSES, ""]}),
                    "statuses; repeat or comma-separate (empty entries are ignored)",
                ),
                _param("after", "query", _ref("TaskId"), "return ids greater than this (next_after)"),
                _param(
                    "limit",
                    "query",
                    {**UINT, "maximum": 4294967295},
                    "page size (default 100, capped by limits.max_list)",
                ),
            ],
        ),
    },
    "/v1/tasks:batch": {
        "post": _op(
            "submitBatch",
            "Submit tasks atomically: all are accepted or none",
            "SubmitBatchResponse",
            *_API,
            404,
            415,
            body="SubmitBatchRequest",
        )
    },
    "/v1/tasks/{ref}": {
        "get": _op("getTask", "Look a task up", "TaskInfo", *_API, 404, parameters=[REF, POOL])
    },
    "/v1/tasks/{ref}:cancel": {
        "post": _op(
            "cancelTask",
            "Cancel a task (it takes no body)",
            "CancelResponse",
            *_API,
            404,
            parameters=[REF, POOL],
        )
    },
    "/v1/tasks/{ref}/result": {
        "get": _op(
            "waitTask",
            "Wait until the task finished and return its result",
            "TaskResult",
            *_API,
            404,
            parameters=[
                REF,
                POOL,
                _param("timeout_s", "query", SECONDS, "longest wait, capped by limits.max_wait_s"),
            ],
        )
    },
    "/v1/watch": {
        "get": {
            **_op(
                "watch",
                "Server-Sent Events stream of status changes",
                "StatusEvent",
                *_API,
                404,
                parameters=[
                    _param("pool", "query", _list(STRING), "pools; repeat or comma-separate"),
                    _param("id", "query", _list(_ref("TaskId")), "task ids; repeat or comma-separate"),
                    _param("key", "query", _list(STRING), "task keys; repeat"),
                    _param("all", "query", BOOL, "every transition, not only terminal ones"),
                ],
            ),
            "responses": {
                "200": {
                    "description": (
                        "text/event-stream: `data: <StatusEvent JSON>` per event, `: keepalive` comments, "
                        "and `event: error` with `data: <Error JSON>` before the server ends the stream"
                    ),
                    "content": {"text/event-stream": {"schema": _ref("StatusEvent")}},
                },
                **_error_responses(*_API, 404),
            },
        }
    },
    "/v1/snapshot": {"get": _op("snapshot", "Scheduler snapshot (metrics role)", "Snapshot", *_API)},
    "/v1/workers": {"get": _op("listWorkers", "Connected workers (metrics role)", "WorkerList", *_API)},
    "/v1/recurring": {
        "get": _op(
            "listRecurring",
            "Recurring schedules (metrics role); with shards, every shard's",
            "RecurringList",
            *_API,
        ),
        "post": _op(
            "addRecurring",
            "Add (or replace, by name) a recurring schedule (admin role); answered once it is durable",
            "RecurringAdded",
            *_API,
            404,
            415,
            body="RecurringRequest",
        ),
    },
    "/v1/recurring/{name}": {
        "delete": _op(
            "removeRecurring",
            "Remove a recurring schedule (admin role) and cancel its next occurrence if that one's start "
            "is still to come; occurrences whose start has come run to their end",
            "RecurringRemoved",
            *_API,
            parameters=[_param("name", "path", STRING, "schedule name (URL-encoded)")],
        )
    },
    "/v1/openapi.json": {
        "get": {
            "operationId": "openapi",
            "summary": "This document",
            "security": [],
            "responses": {
                "200": {"description": "OpenAPI 3.0", "content": {"application/json": {}}},
                **_error_responses(*_ANY),
            },
        }
    },
    "/metrics": {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus text format 0.0.4, or OpenMetrics 1.0 when Accept asks for it (metrics role)",
            "responses": {
                "200": {
                    "description": "metrics",
                    "content": {
                        "text/plain": {"schema": STRING},
                        "application/openmetrics-text": {"schema": STRING},
                    },
                },
                **_error_responses(*_ANY, 401, 403, 503, 404),  # not subject to [limits]
            },
        }
    },
    "/healthz": {"get": _op("healthz", "Liveness: 200 while the process runs", "Health", *_ANY, public=True)},
    "/readyz": {
        "get": _op("readyz", "Readiness: 200 only while serving as leader", "Health", *_ANY, 503, public=True)
    },
}

OPENAPI: Final[dict[str, Any]] = {
    "openapi": "3.0.3",
    "info": {
        "title": "cronoq HTTP/JSON API",
        "version": "1",
        "description": (
            "The same requests as the cronoq.v1 gRPC API. Task ids are strings, enums are lower-case names, "
            "durations are seconds, instants RFC 3339 or Unix seconds. Errors are "
            '{"error": "...", "code": "..."}. HEAD is answered wherever GET is.'
        ),
    },
    # Relative: the server this document was fetched from, whatever its address.
    "servers": [{"url": "/"}],
    "security": [{"bearer": []}],
    "paths": PATHS,
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": SCHEMAS,
        "responses": {
            f"E{status}": {
                "description": description,
                "content": {"application/json": {"schema": _ref("Error")}},
            }
            for status, description in _ERRORS.items()
        },
    },
}

__all__ = ["OPENAPI"]
