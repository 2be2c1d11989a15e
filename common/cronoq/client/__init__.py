"""The cronoq gRPC SDK: :class:`Client` for producers and operators, :class:`Worker` for remote workers.

Errors from the server are :class:`ClientError` (``cronoq.errors.ApiError``) subclasses named for their
gRPC status; ``.code`` is the lower-case status name and ``.retryable`` is true for ``unavailable`` and
``resource_exhausted``. Statuses and priorities are lower-case names, times are Unix seconds.
"""

# ruff: noqa: E402 - grpc must be loaded with cronoq's settings before the modules below import it
from cronoq.grpc_settings import load_grpc

load_grpc()  # before the SDK's modules import grpc

from cronoq.client._client import Client, EventStream
from cronoq.client._models import (
    Event,
    PoolSnapshot,
    RecurringInfo,
    Result,
    Snapshot,
    Submitted,
    TaskInfo,
    TaskPage,
    Totals,
    WorkerGroup,
    WorkerInfo,
)
from cronoq.client._spec import TaskOptions, task
from cronoq.client._worker import MAX_REDIRECTS, PROTOCOL_VERSION, CancelTask, Lease, Reject, Worker
from cronoq.errors import ApiError as ClientError

__all__ = [
    "MAX_REDIRECTS",
    "PROTOCOL_VERSION",
    "CancelTask",
    "Client",
    "ClientError",
    "Event",
    "EventStream",
    "Lease",
    "PoolSnapshot",
    "RecurringInfo",
    "Reject",
    "Result",
    "Snapshot",
    "Submitted",
    "TaskInfo",
    "TaskOptions",
    "TaskPage",
    "Totals",
    "Worker",
    "WorkerGroup",
    "WorkerInfo",
    "task",
]
