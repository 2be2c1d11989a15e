"""How long finished tasks stay known, on a server with the memory store (nothing behind the engine):
``[store] keep_finished_s`` and ``[outputs] info_entries`` bound the records Get, Wait and ListTasks
find; ``[limits] key_retention_s`` only how long a key deduplicates."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cronoq.client import Client
from cronoq.errors import NotFound

from .serverproc import running_server

pytestmark = pytest.mark.asyncio


async def test_records_outlive_keys_and_are_bounded_by_info_entries(tmp_path: Path) -> None:
    body = (
        '[store]\nkind = "memory"\nkeep_finished_s = 3600\n\n'
        "[limits]\nkey_retention_s = 0.2\n\n[outputs]\ninfo_entries = 2\n"
    )
    with running_server(tmp_path, body) as server:
        async with Client(server.target) as client:
            ids = [(await client.submit(b"", key=f"k{i}")).id for i in range(3)]
            for task_id in ids:
                assert await client.cancel(task_id)

            # The key stops deduplicating after key_retention_s (the server's timer drops it)...
            deadline = asyncio.get_running_loop().time() + 10
            while (again := await client.submit(b"", key="k2")).duplicate:
                assert asyncio.get_running_loop().time() < deadline, "key k2 still deduplicates"
                await asyncio.sleep(0.05)
            assert again.id not in ids
            # ...while its record stays for Get, Wait and ListTasks, up to info_entries records.
            assert (await client.get(ids[2])).status == "cancelled"
            assert (await client.wait(ids[1], timeout=1)).status == "cancelled"
            listed = [t.id for t in (await client.list_tasks(statuses=["cancelled"])).tasks]
            assert listed == ids[1:]
            with pytest.raises(NotFound):
                await client.get(ids[0])  # the oldest of three, beyond info_entries = 2
