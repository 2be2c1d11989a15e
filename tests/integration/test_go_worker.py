"""The Go SDK's worker (sdk/go, ``cronoq.RunWorker``) in the scenarios of :mod:`.sdkworkers`, driving
sdk/go/internal/testworker (see :mod:`.gosdk`)."""

from __future__ import annotations

import pytest

from .gosdk import GoWorker, built_testworker
from .sdkworkers import *  # noqa: F403 (the shared tests, collected here)
from .sdkworkers import Sdk


@pytest.fixture(scope="module")
def sdk() -> Sdk:
    return Sdk(GoWorker, built_testworker, cancelled="context canceled")
