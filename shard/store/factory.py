"""The store a configuration asks for."""

from __future__ import annotations

from cronoq.config import Config
from cronoq.config.model import MemoryStoreSection, PostgresStoreSection

from .base import Store


def make_store(config: Config) -> Store:
    """Build (not open) the store of ``[store]``; Postgres tables go in the shard's schema, SQLite's in
    the shard's file."""
    section = config.store
    if isinstance(section, MemoryStoreSection):
        from .memory import MemoryStore

        return MemoryStore()
    if isinstance(section, PostgresStoreSection):
        from .postgres import Keepalives, PostgresStore

        keepalives = Keepalives(
            idle_s=section.keepalives_idle_s,
            interval_s=section.keepalives_interval_s,
            count=section.keepalives_count,
            user_timeout_s=section.tcp_user_timeout_s,
        )
        return PostgresStore(
            section.resolved_url, schema=section.schema_for(config.server.shard), keepalives=keepalives
        )
    from .sqlite import SqliteStore

    return SqliteStore(section.path_for(config.server.shard))
