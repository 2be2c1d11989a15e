"""Webhook scalers (``scaler = { kind = "webhook", url, token_env }``): tell an external system a pool's
desired capacity whenever the autoscaler changes it.

The request is ``POST url`` with ``{"pool": "<name>", "desired": <n>}`` and, when ``token_env`` is set,
``authorization: Bearer <token>``. One request per pool is in flight at a time; changes that arrive
meanwhile are coalesced, so the receiver always ends up with the newest value. A failed request (network
error, timeout, a status that is not 2xx, a redirect) is logged without the token and not retried on its
own: the next change sends the then-current value. A new leader sends each pool's current value once,
so a receiver that missed changes during a failover hears the truth again.

The token never travels in the clear: a plain ``http://`` URL is only used for a loopback host
(configuration validation refuses others, and this module checks again before sending anything).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from cronoq.config.model import WebhookScaler
from cronoq.hosts import is_loopback_name
from cronoq.logs import get_logger

log = get_logger("cronoq.scaler")
REQUEST_TIMEOUT_S = 10.0


@dataclass(slots=True, frozen=True)
class _Target:
    url: str
    token: str

    @property
    def shown(self) -> str:
        """The URL for logs: no user info, query or fragment (they may carry secrets)."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{host}:{parts.port}" if parts.port is not None else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    @property
    def in_the_clear(self) -> bool:
        """A plain-http URL to another host: nothing is sent there."""
        parts = urlsplit(self.url)
        return parts.scheme != "https" and not is_loopback_name(parts.hostname or "")


class WebhookScalers:
    """The webhook scalers of the pools this server schedules; :meth:`desired` is the runtime's
    ``on_scale`` callback."""

    def __init__(self, scalers: Mapping[str, WebhookScaler], *, timeout: float = REQUEST_TIMEOUT_S) -> None:
        self._targets = {pool: _Target(s.url, s.resolved_token) for pool, s in scalers.items()}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._latest: dict[str, int] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self.sent = 0  # requests answered 2xx, for tests and logs
        self.failed = 0

    @property
    def pools(self) -> frozenset[str]:
        return frozenset(self._targets)

    def desired(self, pool: str, desired: int) -> None:
        """The autoscaler's target for ``pool`` changed (or a new leader states it): send it."""
        target = self._targets.get(pool)
        if target is None:
            return
        self._latest[pool] = desired
        sender = self._senders.get(pool)
        if sender is None or sender.done():
            self._senders[pool] = asyncio.get_running_loop().create_task(self._send(pool, target))

    async def _send(self, pool: str, target: _Target) -> None:
        """Post the newest value until no newer one arrived during the request."""
        while True:
            desired = self._latest[pool]
            await self._post(pool, target, desired)
            if self._latest.get(pool) == desired:
                return

    async def _post(self, pool: str, target: _Target, desired: int) -> None:
        if target.in_the_clear:
            self.failed += 1
            log.error(
                "scaler_webhook_refused",
                pool=pool,
                url=target.shown,
                reason="plain http to a non-loopback host would expose the request; use https",
            )
            return
        headers = {"authorization": f"Bearer {target.token}"} if target.token else {}
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.post(
                target.url, json={"pool": pool, "desired": desired}, headers=headers, allow_redirects=False
            ) as response:
                await response.read()
                if 200 <= response.status < 300:
                    self.sent += 1
                    log.info("scaler_webhook_sent", pool=pool, desired=desired, url=target.shown)
                    return
                self.failed += 1
                log.warning(
                    "scaler_webhook_failed",
                    pool=pool,
                    desired=desired,
                    url=target.shown,
                    status=response.status,
                    retry="on the next change of the desired capacity",
                )
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            self.failed += 1
            log.warning(
                "scaler_webhook_failed",
                pool=pool,
                desired=desired,
                url=target.shown,
                error=type(err).__name__ + (f": {err}" if str(err) else ""),
                retry="on the next change of the desired capacity",
            )

    async def close(self) -> None:
        """Stop sending (requests in flight are abandoned) and release the connections."""
        senders = list(self._senders.values())
        self._senders.clear()
        for sender in senders:
            sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*senders, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
