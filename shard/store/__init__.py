"""Where accepted work is kept: one interface (:mod:`.base`), three implementations.

``memory`` keeps nothing across restarts and leads at once; ``sqlite`` keeps a local file and lets a
second process on the same file stand by; ``postgres`` keeps a schema and lets any number of standbys on
other hosts take over, fenced by an epoch checked in every commit.
"""

from .base import (
    Batch,
    Fenced,
    Leadership,
    Recovered,
    SchemaTooNew,
    Store,
    StoredTask,
    StoreError,
    StoreUnavailable,
)

__all__ = [
    "Batch",
    "Fenced",
    "Leadership",
    "Recovered",
    "SchemaTooNew",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "StoredTask",
]
