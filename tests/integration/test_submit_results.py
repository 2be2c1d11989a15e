"""Submit's edges against a real server: a refused wait stores nothing, and a JSON output read back from
the store keeps its content type when the output cache holds nothing."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import grpc
import pytest

from cronoq.client import Lease
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .helpers import sqlite_store, toml_table, worker
from .serverproc import ServerProcess, running_server

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("timeout", [-1.0, 1e300, float("nan")])
async def test_a_submit_with_an_unusable_wait_timeout_is_refused_and_stores_nothing(
    server: ServerProcess, timeout: float
) -> None:
    async with grpc.aio.insecure_channel(server.target) as channel:
        tasks = pbg.TasksStub(channel)
        request = pb.SubmitRequest(task=pb.TaskSpec(key="never"), wait=True, wait_timeout_s=timeout)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tasks.Submit(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith("wait_timeout_s:")
        assert not (await tasks.ListTasks(pb.ListTasksRequest())).tasks

    async with aiohttp.ClientSession(base_url=server.http) as http:
        body = {"key": "never", "wait": True, "wait_timeout_s": -1}
        async with http.post("/v1/tasks", json=body) as resp:
            assert resp.status == 400 and (await resp.json())["error"].startswith("wait_timeout_s:")
        async with http.get("/v1/tasks") as resp:
            assert (await resp.json())["tasks"] == []


async def test_a_json_output_read_back_from_the_store_keeps_its_content_type(tmp_path: Path) -> None:
    # Nothing cached: every output is read from the store.
    body = sqlite_store(tmp_path / "cronoq.db") + toml_table("outputs", cache_entries=0)

    async def answer(lease: Lease) -> dict[str, int]:
        return {"answer": 42}

    with running_server(tmp_path, body) as server:
        async with worker(server.target, answer), aiohttp.ClientSession(base_url=server.http) as http:
            async with http.post("/v1/tasks", json={"wait": True, "key": "json"}) as resp:
                submitted = await resp.json()
            assert resp.status == 200, submitted
            assert submitted["result"]["output"] == {"answer": 42}, submitted
            async with http.get(f"/v1/tasks/{submitted['id']}/result") as resp:
                result = await resp.json()
            assert result["output"] == {"answer": 42} and result["content_type"] == "application/json"
