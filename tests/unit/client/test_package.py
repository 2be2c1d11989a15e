"""What ``import cronoq`` and ``import cronoq.client`` expose."""

from __future__ import annotations

import subprocess
import sys

import cronoq
import cronoq.client
from cronoq import errors


def test_importing_cronoq_does_not_import_grpc() -> None:
    code = "import sys, cronoq; cronoq.Retryable; assert 'grpc' not in sys.modules, 'grpc imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_top_level_exports() -> None:
    assert cronoq.__version__ == "0.1.0"
    assert cronoq.Retryable is errors.Retryable and cronoq.Permanent is errors.Permanent
    assert cronoq.CronoqError is errors.CronoqError
    assert cronoq.client is sys.modules["cronoq.client"]
    assert "client" in dir(cronoq)


def test_client_exports() -> None:
    assert cronoq.client.ClientError is errors.ApiError
    assert (cronoq.client.PROTOCOL_VERSION, cronoq.client.MAX_REDIRECTS) == (3, 3)
    assert issubclass(cronoq.client.Reject, errors.CronoqError)
    assert issubclass(cronoq.client.CancelTask, errors.CronoqError)
    for name in cronoq.client.__all__:
        assert getattr(cronoq.client, name) is not None


def test_retryable_carries_retry_after() -> None:
    err = cronoq.Retryable("OOM", retry_after=10)
    assert (err.message, err.retry_after) == ("OOM", 10)
