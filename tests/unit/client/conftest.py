from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .scripted import ApiServer, WorkersServer, serve


@pytest.fixture
async def workers() -> AsyncIterator[WorkersServer]:
    """A scripted Workers service on a loopback port."""
    servicer = WorkersServer()
    async with serve(servicer):
        yield servicer


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    """A scripted Tasks + Admin service on a loopback port."""
    servicer = ApiServer()
    async with serve(servicer):
        yield servicer
