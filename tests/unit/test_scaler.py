"""The webhook scaler's rules without a network: coalescing, refusing plain http to other hosts, and
URLs shown in logs without their secrets."""

from __future__ import annotations

import asyncio

import pytest

from cronoq.config.model import WebhookScaler
from shard import scaler as scaler_module
from shard.scaler import WebhookScalers, _Target


def test_urls_in_logs_carry_no_user_info_or_query() -> None:
    target = _Target("https://user:secret@hooks.example.com:8443/scale?sig=abc#frag", "t")
    assert target.shown == "https://hooks.example.com:8443/scale"
    assert _Target("http://[::1]:9/h", "").shown == "http://[::1]:9/h"


def test_plain_http_is_only_for_loopback() -> None:
    assert _Target("http://scaler.internal/h", "").in_the_clear
    assert _Target("http://10.0.0.1/h", "").in_the_clear
    assert not _Target("https://scaler.internal/h", "").in_the_clear
    for host in ("127.0.0.1", "localhost", "[::1]"):
        assert not _Target(f"http://{host}:9/h", "").in_the_clear


async def test_changes_during_a_request_are_coalesced_into_the_newest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scalers = WebhookScalers({"p": WebhookScaler("http://127.0.0.1:9/h")})
    posted: list[int] = []
    release = asyncio.Event()

    async def post(self: WebhookScalers, pool: str, target: _Target, desired: int) -> None:
        posted.append(desired)
        await release.wait()

    monkeypatch.setattr(WebhookScalers, "_post", post)
    scalers.desired("p", 3)
    await asyncio.sleep(0)
    scalers.desired("p", 5)
    scalers.desired("p", 8)  # both arrive while 3 is in flight: only 8 is sent next
    scalers.desired("other", 1)  # not a webhook pool: ignored
    release.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert posted == [3, 8]
    await scalers.close()


async def test_nothing_is_sent_in_the_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    scalers = WebhookScalers({"p": WebhookScaler("http://scaler.internal/h", resolved_token="secret-token")})
    logged: list[tuple[str, dict[str, object]]] = []

    class Log:
        def error(self, event: str, **kw: object) -> None:
            logged.append((event, kw))

    monkeypatch.setattr(scaler_module, "log", Log())
    scalers.desired("p", 2)
    for _ in range(5):
        await asyncio.sleep(0)
    assert scalers.failed == 1 and scalers.sent == 0
    assert logged and logged[0][0] == "scaler_webhook_refused" and "secret-token" not in repr(logged)
    await scalers.close()
