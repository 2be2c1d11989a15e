"""Bearer tokens against a real server: roles decide which API a credential may call."""

from __future__ import annotations

from pathlib import Path

import pytest

from cronoq.client import Client, ClientError, Lease

from .helpers import token, toml_table, worker
from .serverproc import running_server

CLIENT = "client-token-0123456789abcdef"
WORKER = "worker-token-0123456789abcdef"
METRICS = "metrics-token-0123456789abcdef"

CONFIG = (
    token("T_CLIENT", "client", env=True)
    + token("T_WORKER", "worker", env=True)
    + token("T_METRICS", "metrics", env=True)
    + toml_table("[pools]", name="default")
)

pytestmark = pytest.mark.asyncio


async def test_roles_are_enforced(tmp_path: Path) -> None:
    env = {"T_CLIENT": CLIENT, "T_WORKER": WORKER, "T_METRICS": METRICS}
    with running_server(tmp_path, CONFIG, env=env) as server:
        async with Client(server.target) as anonymous:
            with pytest.raises(ClientError) as err:
                await anonymous.submit(b"x")
            assert err.value.code == "unauthenticated"
        async with Client(server.target, token="not-a-known-token-at-all") as stranger:
            with pytest.raises(ClientError) as err:
                await stranger.submit(b"x")
            assert err.value.code == "unauthenticated"
        async with Client(server.target, token=WORKER) as wrong_role:
            with pytest.raises(ClientError) as err:
                await wrong_role.submit(b"x")
            assert err.value.code == "permission_denied"
        async with Client(server.target, token=CLIENT) as client:
            with pytest.raises(ClientError) as err:
                await client.snapshot()
            assert err.value.code == "permission_denied"

            async def handler(lease: Lease) -> str:
                return "served with a worker token"

            async with worker(server.target, handler, token=WORKER):
                done = await client.submit(b"x", wait=True, wait_timeout=10)
            assert done.result is not None and done.result.text() == "served with a worker token"
        async with Client(server.target, token=METRICS) as metrics:
            assert (await metrics.snapshot()).totals.succeeded == 1
        assert CLIENT not in server.logs() and WORKER not in server.logs()


async def test_worker_with_client_token_is_refused(tmp_path: Path) -> None:
    env = {"T_CLIENT": CLIENT, "T_WORKER": WORKER, "T_METRICS": METRICS}
    with running_server(tmp_path, CONFIG, env=env) as server:
        from cronoq.client import Worker

        async def handler(lease: Lease) -> None:
            return None

        w = Worker(server.target, "default", handler, token=CLIENT)
        with pytest.raises(ClientError) as err:
            await w.run()
        assert err.value.code == "permission_denied"


async def test_unset_token_env_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as err, running_server(tmp_path, CONFIG, env={"T_CLIENT": CLIENT}):
        pass
    assert "T_WORKER" in str(err.value)
