"""Hand-made chaos histories for the checker's tests: a :class:`Story` writes the records a run would,
one call at a time, with the times the test gives (seconds from 1000)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chaos.history import Record, failure_message, identity

SHARD_A = 1 << 56  # task ids of shard "a" (pool "pa"); shard "b" (pool "pb") is 2 << 56
META: Record = {
    "type": "meta",
    "t": 1000.0,
    "seed": 7,
    "seconds": 60,
    "source": "a story",
    "bounds": {"takeover_s": 12.0, "grace_s": 3.0},
    "pools": {
        "pa": {"shard": "a", "cluster": "main", "lease_ttl_s": 5.0, "max_attempts": 4},
        "pb": {"shard": "b", "cluster": "main", "lease_ttl_s": 5.0, "max_attempts": 4},
    },
    "servers": {"a1": "a", "a2": "a", "b1": "b"},
    "shards": {"a": 1, "b": 2},
    "workers": {"w1": "pa", "w2": "pa", "w3": "pb"},
}


@dataclass
class Story:
    records: list[Record] = field(default_factory=lambda: [dict(META)])
    leases: int = 0

    def add(self, record_type: str, t: float, /, **fields: Any) -> Record:
        record: Record = {"type": record_type, "t": 1000.0 + t, **fields}
        self.records.append(record)
        return record

    def submit(
        self, t: float, task: int | None, *, pool: str = "pa", duplicate: bool = False, took: float = 0.01,
        error: str = "", result: Record | None = None, **request: Any,
    ) -> Record:  # fmt: skip
        """A submit answered at ``t`` (sent ``took`` earlier): ``task`` acknowledged, or ``error``."""
        asked = {"pool": pool, "uid": f"u{task}", "timeout_s": 4.0, **request}
        for name in ("start_at",):
            if name in asked:
                asked[name] += 1000.0
        if error:
            return self.add("call", t, op="submit", t0=1000.0 + t - took, client="p", request=asked, ok=False,
                            error={"code": error, "message": error})  # fmt: skip
        answer: Record = {"id": task, "duplicate": duplicate}
        if result is not None:
            answer["result"] = result
        return self.add(
            "call", t, op="submit", t0=1000.0 + t - took, client="p", request=asked, ok=True, answer=answer
        )

    def call(self, t: float, op: str, task: int, **answer: Any) -> Record:
        return self.add(
            "call", t, op=op, t0=1000.0 + t - 0.01, client="p", request={"task": task}, ok=True, answer=answer
        )

    def lease(
        self, t: float, task: int, attempt: int = 1, *, worker: str = "w1", outcome: str | None = "complete",
        reported: float | None = None, pool: str = "pa", retry_after_s: float = 0.0, hung: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """A lease begun at ``t`` on ``worker`` and, unless ``outcome`` is None, reported at
        ``reported`` (default 0.1 s later); its identity."""
        self.leases += 1
        ident = identity(task, attempt, worker, 100, 1, self.leases)
        self.add("lease", t, **ident, pool=pool, uid=f"u{task}")
        if outcome is not None:
            self.add("report", t + 0.1 if reported is None else reported, **ident, outcome=outcome,
                     retry_after_s=retry_after_s, hung=hung)  # fmt: skip
        return ident

    def final(self, t: float, task: int, status: str = "succeeded", *, output: Any = None, pool: str = "pa",
              found: bool | None = True, **fields: Any) -> Record:  # fmt: skip
        extra: Record = {
            "status": status,
            "attempt": 1,
            "pool": pool,
            "key": None,
            "message": "",
            "started_at": None,
        }
        if status == "succeeded":
            extra["output"] = output
        elif isinstance(output, dict):
            extra["message"] = failure_message(output, "on purpose")
            extra["failure"] = output
        extra.update(fields)
        if not found:
            extra = {"error": "it timed out"} if found is None else {}
        return self.add("final", t, task=task, found=found, **extra)

    def fault(self, t: float, fault_id: int, kind: str, process: str | None, *, shards: tuple[str, ...] = (),
              pools: tuple[str, ...] = ("pa",), heal: float | None = None) -> None:  # fmt: skip
        self.add("fault", t, id=fault_id, kind=kind, target=process, process=process, shards=list(shards),
                 pools=list(pools), duration_s=0, seed=7)  # fmt: skip
        if heal is not None:
            self.add("heal", heal, fault=fault_id)

    def role(self, t: float, server: str, state: str, since: float | None) -> None:
        shard = META["servers"][server]
        self.add(
            "role",
            t,
            server=server,
            shard=shard,
            state=state,
            since=None if since is None else 1000.0 + since,
        )

    def simple(
        self, t: float, task: int, *, worker: str = "w1", pool: str = "pa", **request: Any
    ) -> dict[str, Any]:
        """A task submitted at ``t``, run at once and succeeded, with its final record at 100."""
        self.submit(t, task, pool=pool, **request)
        ident = self.lease(t + 0.05, task, worker=worker, pool=pool)
        self.final(100, task, output=ident, pool=pool, key=request.get("key"))
        return ident

    def sorted(self) -> list[Record]:
        return sorted(self.records, key=lambda r: float(r["t"]))
