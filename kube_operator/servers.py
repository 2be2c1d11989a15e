"""Reading the configured cronoq servers: one ``Admin.Snapshot`` per server per round.

Each server gets one SDK :class:`~cronoq.client.Client` (one gRPC channel, kept between rounds) with
its metrics token; a round reads the snapshot of every server its due scalers name, all at once, and
never once per scaler. A failed or slow read becomes an :class:`~.readings.Unknown` saying why, so a
server that is down only affects the scalers that name it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cronoq.client import Client, Snapshot
from cronoq.errors import ApiError
from cronoq.logs import get_logger

from .config import OperatorConfig, ServerEntry, read_token_file
from .readings import SERVER_UNAVAILABLE, TOKEN_UNREADABLE, Unknown, server_failure, unknown

log = get_logger("cronoq.operator")


class ServerSource:
    """One configured server. The token is looked up at every read (``token_file`` may have been
    rotated); a new token gets a new client."""

    def __init__(self, entry: ServerEntry, env: Mapping[str, str], timeout_s: float) -> None:
        self.entry = entry
        self._env = env
        self._timeout_s = timeout_s
        self._credentials = _credentials(entry.ca_file)
        self._client: Client | None = None
        self._token: str | None = None

    async def read(self) -> Snapshot | Unknown:
        name = self.entry.name
        token = self._current_token()
        if isinstance(token, Unknown):
            return token
        client = await self._client_for(token)
        try:
            async with asyncio.timeout(self._timeout_s):
                return await client.snapshot()
        except ApiError as err:
            failure = server_failure(name, err)
        except TimeoutError:
            failure = unknown(
                SERVER_UNAVAILABLE, f"server {name!r} did not answer within {self._timeout_s:g} s"
            )
        except Exception as err:  # whatever else went wrong, only this server's scalers wait
            log.exception("snapshot_failed", server=name)
            failure = unknown(
                SERVER_UNAVAILABLE, f"server {name!r} could not be read: {type(err).__name__}: {err}"
            )
        if failure.reason == SERVER_UNAVAILABLE:
            # A fresh channel next round: grpc's own reconnection backs off up to two minutes, so a
            # kept channel could go on failing that long after the server is back.
            await self.close()
        return failure

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _current_token(self) -> str | Unknown:
        if self.entry.token_env is not None:
            return self._env.get(self.entry.token_env, "").strip()
        assert self.entry.token_file is not None  # the configuration requires one of them
        try:
            return read_token_file(self.entry.token_file)
        except (OSError, UnicodeDecodeError, ValueError) as err:
            return unknown(
                TOKEN_UNREADABLE, f"server {self.entry.name!r}: cannot read the operator's token ({err})"
            )

    async def _client_for(self, token: str) -> Client:
        if self._client is None or token != self._token:
            await self.close()
            self._client = Client(self.entry.url, token=token, credentials=self._credentials)
            self._token = token
        return self._client


class Servers:
    """Every configured server, by name."""

    def __init__(self, config: OperatorConfig, env: Mapping[str, str]) -> None:
        self._sources = {entry.name: ServerSource(entry, env, config.timeout_s) for entry in config.servers}

    async def snapshots(self, names: Iterable[str]) -> dict[str, Snapshot | Unknown]:
        """The snapshot (or why there is none) of each named server, read concurrently; names that are
        not configured are left out."""
        wanted = sorted({name for name in names if name in self._sources})
        answers = await asyncio.gather(*(self._sources[name].read() for name in wanted))
        return dict(zip(wanted, answers, strict=True))

    async def close(self) -> None:
        for source in self._sources.values():
            await source.close()


def _credentials(ca_file: str | None) -> Any:
    """gRPC channel credentials trusting ``ca_file`` (None: an https:// url trusts the system's CAs)."""
    if ca_file is None:
        return None
    import grpc  # after cronoq.client, which loads grpc with cronoq's settings

    return grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
