"""The scalers the operator knows of, kept current by watching the API server instead of listing on a
timer.

For each scope (every namespace, or each of the configured ``namespaces``) it lists the scalers once,
then watches from that list's ``resourceVersion``: each ``ADDED``, ``MODIFIED`` or ``DELETED`` updates
the copy and wakes the reconciler (:attr:`Inventory.changed`), so a new or changed scaler is acted on at
once. A watch the API server ends after its timeout is resumed where it was; one that fails (410 Gone:
too old to resume, a broken connection, a refusal) is started again from a new list after a short
pause, since changes may have been missed. Both standby and leader keep watching, so a standby that
takes over starts with a current copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from cronoq.logs import get_logger

from .kube import KubeApi, KubeError
from .scaler import ScalerRef

log = get_logger("cronoq.operator")

# How long to wait before listing again after a failed watch or list (the API server may be down).
RETRY_S = 1.0


class Inventory:
    """A copy of the scalers in ``namespaces`` (empty: all), by key (:attr:`ScalerRef.key`)."""

    def __init__(self, kube: KubeApi, namespaces: tuple[str, ...]) -> None:
        self._kube = kube
        self._scopes: tuple[str | None, ...] = namespaces or (None,)
        self._objects: dict[str | None, dict[str, dict[str, Any]]] = {scope: {} for scope in self._scopes}
        self._synced: set[str | None] = set()
        self.changed = asyncio.Event()
        # Watches started again, by why: "closed" (ended by the API server), "expired" (410), "error".
        self.restarts: dict[str, int] = {"closed": 0, "expired": 0, "error": 0}

    @property
    def synced(self) -> bool:
        """Whether every scope has been listed at least once (readiness)."""
        return len(self._synced) == len(self._scopes)

    def scalers(self) -> list[dict[str, Any]]:
        return [obj for objects in self._objects.values() for obj in objects.values()]

    def update(self, obj: Mapping[str, Any]) -> None:
        """Takes a scaler as the operator itself just wrote it (its status), so that the next round does
        not decide from the copy before the write while the watch event is on its way."""
        key = ScalerRef.of(obj).key
        for objects in self._objects.values():
            if key in objects:
                objects[key] = dict(obj)

    async def resync(self) -> dict[str | None, str]:
        """Lists every scope afresh; the version to watch each from."""
        return {scope: await self._list(scope) for scope in self._scopes}

    async def run(self) -> None:
        """Watch every scope until cancelled."""
        async with asyncio.TaskGroup() as group:
            for scope in self._scopes:
                group.create_task(self._watch(scope))

    async def _list(self, scope: str | None) -> str:
        listed = await self._kube.list_scalers(scope)
        self._objects[scope] = {ScalerRef.of(obj).key: obj for obj in listed.items}
        self._synced.add(scope)
        self.changed.set()
        return listed.resource_version

    async def _watch(self, scope: str | None) -> None:
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list(scope)
                async for event in self._kube.watch_scalers(scope, version):
                    version = self._apply(scope, event.kind, event.obj) or version
                self.restarts["closed"] += 1
            except KubeError as err:
                cause = "expired" if err.status == 410 else "error"
                self.restarts[cause] += 1
                log.warning("scalers_watch_restarted", namespace=scope or "all", cause=cause, error=str(err))
                version = None
                await asyncio.sleep(RETRY_S)

    def _apply(self, scope: str | None, kind: str, obj: dict[str, Any]) -> str | None:
        """Applies one event; the version it brings the watch to."""
        meta = obj.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if kind in ("ADDED", "MODIFIED"):
            self._objects[scope][ScalerRef.of(obj).key] = obj
            self.changed.set()
        elif kind == "DELETED":
            self._objects[scope].pop(ScalerRef.of(obj).key, None)
            self.changed.set()
        return str(version) if version else None
