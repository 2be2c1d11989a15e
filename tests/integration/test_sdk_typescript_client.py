"""The TypeScript SDK's producer ``Client`` against a real server: node's test runner runs
``sdk/typescript/test/integration/client.test.ts`` (submit with wait, payload encodings, options, get,
submitBatch, cancel, wait, watch, refused options) while a Python SDK worker serves pool ``default``
here; and the SDK's own unit tests (``npm test``: codecs, options, redirect rules, and the worker
against scripted servers)."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from cronoq.client import Lease
from tests.typescript import SDK, STUBS, generate_stubs, sdk_dist

from .helpers import worker
from .serverproc import running_server

CONFIG = """
[[pools]]
name = "default"
max = 8

[[pools]]
name = "idle"
max = 8
"""


async def node_tests(
    dist: Path, path: str, env: dict[str, str] | None = None, pattern: str | None = None
) -> str:
    """Runs node's test runner on ``path`` (under ``dist``) and returns its report; fails the test, with
    the report, unless every test passed."""
    args = ["node", "--enable-source-maps", "--test", "--test-reporter=tap"]
    if pattern is not None:
        args.append(f"--test-name-pattern={pattern}")
    proc = await asyncio.create_subprocess_exec(
        *args,
        str(dist / path),
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    report = out.decode(errors="replace")
    passed = re.search(r"^# pass (\d+)$", report, re.MULTILINE)
    assert proc.returncode == 0 and passed is not None and int(passed[1]) > 0, report
    assert re.search(r"^# fail 0$", report, re.MULTILINE), report
    return report


async def echo(lease: Lease) -> dict[str, str]:
    return {"pool": lease.pool, "contentType": lease.content_type, "payload": lease.text()}


async def test_the_client_against_a_server(tmp_path: Path) -> None:
    dist = sdk_dist()
    with running_server(tmp_path, CONFIG) as server:
        async with worker(server.target, echo, slots=4):
            report = await node_tests(
                dist, "test/integration/client.test.js", {"CRONOQ_TARGET": server.target}
            )
    assert "watch yields status changes as an async iterator" in report


async def test_the_sdks_unit_tests() -> None:
    """``npm test``'s tests: no server, but scripted gRPC servers on loopback for the worker's protocol."""
    dist = sdk_dist()
    await node_tests(dist, "test/unit/")


def test_the_committed_stubs_are_what_make_sdk_typescript_proto_makes(tmp_path: Path) -> None:
    """The generated TypeScript of cronoq.proto is committed; a change to the proto without
    ``make sdk-typescript-proto`` would leave the SDK speaking the old contract."""
    sdk_dist()
    made = generate_stubs(tmp_path)
    committed = SDK / STUBS
    # The header names the protoc that made it, which is whatever grpcio-tools bundles here.
    strip = re.compile(r"^//\s+protoc\s+v.*$", re.MULTILINE)
    assert strip.sub("", made.read_text()) == strip.sub("", committed.read_text()), (
        "sdk/typescript/src/gen is stale: run make sdk-typescript-proto"
    )
