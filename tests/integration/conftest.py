"""Fixtures for integration tests: real server processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .serverproc import ServerProcess, running_server

# Short TTL and backoff so expiry/retry paths finish quickly; no jitter so delays are exact.
DEFAULT_CONFIG = """
[server]
shutdown_grace_s = 5

[limits]
max_message_bytes = 1048576

[[pools]]
name = "default"
max = 16
lease_ttl_s = 1
retry = { max_attempts = 3, initial_backoff_s = 0.05, multiplier = 1.0, max_backoff_s = 0.05, jitter = false }

[[pools]]
name = "other"
max = 4
lease_ttl_s = 30
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path, DEFAULT_CONFIG) as proc:
        yield proc
