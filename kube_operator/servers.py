"""Reading the configured cronoq servers: one ``Admin.Snapshot`` per server per round.

Each server gets one SDK :class:`~cronoq.client.Client` (one gRPC channel, kept between rounds) with
its metrics token, its client certificate (servers that require one, mTLS), or both; a round reads the
snapshot of every server its due scalers name, all at once, and never once per scaler. A failed or slow
read becomes an :class:`~.readings.Unknown` saying why, so a server that is down only affects the
scalers that name it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cronoq.client import Client, Snapshot
from cronoq.errors import ApiError
from cronoq.logs import get_logger

from .config import OperatorConfig, ServerEntry, read_token_file
from .readings import (
    CERTIFICATE_UNREADABLE,
    SERVER_UNAVAILABLE,
    TOKEN_UNREADABLE,
    Unknown,
    server_failure,
    unknown,
)

log = get_logger("cronoq.operator")


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a channel to a server is opened with, as read from the configured files and variable: a
    client whose credentials differ from this round's is replaced. Never shown (``repr=False``): the
    token and the private key are secrets."""

    token: str | None = field(repr=False)
    root_certificates: bytes | None = field(repr=False)
    private_key: bytes | None = field(repr=False)
    certificate_chain: bytes | None = field(repr=False)

    def channel_credentials(self) -> Any:
        """gRPC channel credentials for https:// (None: no file given, system CAs and no client
        certificate, which the SDK's client picks itself for an https:// url)."""
        if self.root_certificates is None and self.certificate_chain is None:
            return None
        import grpc  # after cronoq.client, which loads grpc with cronoq's settings

        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )


class ServerSource:
    """One configured server. Its token and TLS files are read again at every read (a Secret's mounted
    files change when it is rotated, cert-manager renews certificates before they expire); different
    credentials get a new client, the same ones keep the channel."""

    def __init__(self, entry: ServerEntry, env: Mapping[str, str], timeout_s: float) -> None:
        self.entry = entry
        self._env = env
        self._timeout_s = timeout_s
        # What the server judges the operator by: a token, when one is sent, decides over a certificate.
        self._identity = (
            "client certificate" if entry.token_env is None and entry.token_file is None else "token"
        )
        self._client: Client | None = None
        self._credentials: Credentials | None = None

    async def read(self) -> Snapshot | Unknown:
        name = self.entry.name
        credentials = self._current_credentials()
        if isinstance(credentials, Unknown):
            return credentials
        client = await self._client_for(credentials)
        try:
            async with asyncio.timeout(self._timeout_s):
                return await client.snapshot()
        except ApiError as err:
            failure = server_failure(name, err, identity=self._identity)
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
            # A fresh channel next round: a kept one fails calls at once until its next reconnection
            # attempt (grpc backs off up to 5 s with the SDK's defaults), so a server that is back
            # would still read as down.
            await self.close()
        return failure

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _current_credentials(self) -> Credentials | Unknown:
        token = self._current_token()
        if isinstance(token, Unknown):
            return token
        entry = self.entry
        try:
            return Credentials(
                token,
                root_certificates=_read_optional(entry.ca_file),
                private_key=_read_optional(entry.key_file),
                certificate_chain=_read_optional(entry.cert_file),
            )
        except OSError as err:
            return unknown(
                CERTIFICATE_UNREADABLE, f"server {entry.name!r}: cannot read the operator's TLS files ({err})"
            )

    def _current_token(self) -> str | Unknown | None:
        if self.entry.token_env is not None:
            return self._env.get(self.entry.token_env, "").strip()
        if self.entry.token_file is None:
            return None  # a client certificate only: the configuration requires one or the other
        try:
            return read_token_file(self.entry.token_file)
        except (OSError, UnicodeDecodeError, ValueError) as err:
            return unknown(
                TOKEN_UNREADABLE, f"server {self.entry.name!r}: cannot read the operator's token ({err})"
            )

    async def _client_for(self, credentials: Credentials) -> Client:
        if self._client is None or credentials != self._credentials:
            await self.close()
            self._client = Client(
                self.entry.url, token=credentials.token, credentials=credentials.channel_credentials()
            )
            self._credentials = credentials
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


def _read_optional(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()
