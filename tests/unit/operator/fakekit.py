"""The fake Kubernetes API (:mod:`tests.kube_fake`) served in the test's own process, with a client of
it, and a monotonic clock the test moves: what the reconciler's and the election's tests share."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp.test_utils import TestServer

from kube_operator.kube import KubeApi, KubeTarget
from tests.kube_fake import FakeKube, make_app

TOKEN = "kube-token-0123456789"


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def in_process_fake(directory: Path) -> AsyncIterator[tuple[FakeKube, KubeApi]]:
    """The fake on a loopback port (``FakeKube`` to drive it as a test, ``KubeApi`` as the operator)."""
    kube = FakeKube(directory, TOKEN)
    server = TestServer(make_app(TOKEN), host="127.0.0.1", port=kube.port)
    await server.start_server()
    kube.token_file.write_text(TOKEN)
    try:
        async with KubeApi(KubeTarget(kube.url, kube.token_file, None)) as api:
            yield kube, api
    finally:
        await kube.stop()
        await server.close()
