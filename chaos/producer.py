"""Producers: tasks submitted at a steady rate through the SDK's ``Client``, every call in the history.

A submission starts every ``1 / rate`` seconds whether or not earlier ones have been answered (a
producer does not slow down because the cluster is failing; at most ``MAX_IN_FLIGHT`` calls wait at
once, beyond which a tick is skipped). The mix, drawn from the run's seed:

- pools in turn with the weights given; 40 % keyed, a third of those reusing a recent key of the same
  cluster, of any pool (so a key one shard holds is submitted to the other);
- 15 % depend on a recent task of the same pool, by id or by its key, on ``success``, ``complete`` or
  ``failure``; 10 % have a fixed start 1 to 4 s ahead (``run_late`` or ``skip`` when missed);
- 20 % fail their first one or two attempts on purpose (a retry policy of their own), 5 % fail for
  good; 10 % submit and wait, 10 % submit then wait by id, 3 % are cancelled soon after.

A keyed submission that fails ``UNAVAILABLE`` is sent again (a key makes that safe), up to 3 times.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

from cronoq.client import Client, Result
from cronoq.errors import ApiError

from .history import HistoryWriter

MAX_IN_FLIGHT = 256
WAIT_S = 10.0
RECENT = 64  # tasks and keys remembered for dependencies and key reuse
RETRY_AFTER_S = 0.3


@dataclass(slots=True)
class Known:
    """An acknowledged task a later submission may depend on."""

    id: int
    pool: str
    key: str | None  # set only when this pool's shard holds the key (not a duplicate of another shard's)
    at: float


@dataclass(slots=True)
class Producer:
    """One cluster's producer: ``pools`` with their weights, all behind ``client``."""

    name: str
    client: Client
    history: HistoryWriter
    pools: dict[str, float]
    rate: float
    rng: random.Random
    key_prefix: str
    count: int = 0
    recent: list[Known] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    in_flight: set[asyncio.Task[None]] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)  # every task id an answer named

    async def run(self, until: float) -> None:
        """Submit until the time ``until`` (``time.time()``), then wait for the calls in flight."""
        next_at = time.time()
        while next_at < until:
            delay = next_at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at += 1 / self.rate
            if len(self.in_flight) < MAX_IN_FLIGHT:
                task = asyncio.create_task(self._one())
                self.in_flight.add(task)
                task.add_done_callback(self.in_flight.discard)
        await asyncio.gather(*self.in_flight, return_exceptions=True)

    async def _one(self) -> None:
        self.count += 1
        rng = self.rng
        pool = rng.choices(list(self.pools), weights=list(self.pools.values()))[0]
        uid = f"{self.name}-{self.count}"
        payload: dict[str, Any] = {"uid": uid, "ms": rng.choice((10, 30, 80, 150, 300))}
        options: dict[str, Any] = {
            "pool": pool,
            "timeout": 4.0,
            "priority": rng.choice(("normal", "high", "low")),
        }
        request: dict[str, Any] = {"pool": pool, "uid": uid, "timeout_s": 4.0}
        key = self._key(rng)
        if key is not None:
            options["key"] = request["key"] = key
        roll = rng.random()
        if roll < 0.2:
            fail = rng.choice((1, 2))
            payload.update(fail=fail, retry_after_s=RETRY_AFTER_S)
            options["retry"] = {
                "max_attempts": fail + 2,
                "initial_backoff": 0.2,
                "multiplier": 1.0,
                "max_backoff": 0.2,
            }
            request.update(fail=fail, retry_after_s=RETRY_AFTER_S, max_attempts=fail + 2)
        elif roll < 0.25:
            payload["permanent"] = request["permanent"] = True
        deps = self._deps(rng, pool)
        if deps:
            options["deps"] = deps
            request["deps"] = [list(dep) for dep in deps]
        if rng.random() < 0.1:
            start_at = time.time() + rng.uniform(1.0, 4.0)
            on_miss = rng.choice(("run_late", "run_late", "skip"))
            options.update(start_at=start_at, tolerance=1.0, on_miss=on_miss)
            request.update(start_at=start_at, tolerance_s=1.0, on_miss=on_miss)
        mode = rng.random()
        waits = mode < 0.1
        request["wait"] = waits
        submitted = await self._submit(payload, options, request, waits)
        if submitted is None:
            return
        task_id, duplicate = submitted
        if not duplicate or key is None:
            self.recent.append(Known(task_id, pool, key, time.time()))
            del self.recent[:-RECENT]
        if 0.1 <= mode < 0.2:
            await self._call("wait", {"task": task_id}, self._wait(task_id))
        elif 0.2 <= mode < 0.23:
            await asyncio.sleep(rng.uniform(0.05, 1.0))
            await self._call("cancel", {"task": task_id}, self._cancel(task_id))

    def _key(self, rng: random.Random) -> str | None:
        if rng.random() >= 0.4:
            return None
        if self.keys and rng.random() < 1 / 3:
            return rng.choice(self.keys)
        key = f"{self.key_prefix}{self.name}-{self.count}"
        self.keys.append(key)
        del self.keys[:-RECENT]
        return key

    def _deps(self, rng: random.Random, pool: str) -> list[tuple[int | str, str]]:
        if rng.random() >= 0.15:
            return []
        now = time.time()
        parents = [known for known in self.recent if known.pool == pool and now - known.at < 10]
        if not parents:
            return []
        parent = rng.choice(parents)
        cond = rng.choices(("success", "complete", "failure"), weights=(60, 25, 15))[0]
        ref: int | str = parent.key if parent.key is not None and rng.random() < 0.3 else parent.id
        return [(ref, cond)]

    async def _submit(
        self, payload: dict[str, Any], options: dict[str, Any], request: dict[str, Any], waits: bool
    ) -> tuple[int, bool] | None:
        """The task's id and whether it was a duplicate, or None when no answer acknowledged it."""
        tries = 4 if "key" in request else 1
        for attempt in range(tries):
            wait_options: dict[str, Any] = {"wait": True, "wait_timeout": WAIT_S} if waits else {}
            answer, code = await self._call(
                "submit", request, self.client.submit(payload, **wait_options, **options), try_=attempt + 1
            )
            if answer is not None:
                self.acked.add(int(answer["id"]))
                return int(answer["id"]), bool(answer["duplicate"])
            if attempt + 1 < tries and code == "unavailable":
                await asyncio.sleep(0.5)
                continue
            return None
        return None

    async def _wait(self, task_id: int) -> Result:
        return await self.client.wait(task_id, timeout=WAIT_S)

    async def _cancel(self, task_id: int) -> bool:
        return await self.client.cancel(task_id)

    async def _call(
        self, op: str, request: dict[str, Any], call: Any, try_: int = 1
    ) -> tuple[dict[str, Any] | None, str]:
        """Run one call and record it: the answer as recorded (None on an error), and the error's code."""
        t0 = time.time()
        try:
            answer = describe(await call)
        except (ApiError, TimeoutError) as err:
            code, message = (err.code, err.message) if isinstance(err, ApiError) else ("timeout", str(err))
            error = {"code": code, "message": message[:300]}
            self.history.write(
                "call", op=op, t0=t0, client=self.name, request=request, ok=False, try_=try_, error=error
            )
            return None, code
        self.history.write(
            "call", op=op, t0=t0, client=self.name, request=request, ok=True, try_=try_, answer=answer
        )
        return answer, ""


def describe(answer: Any) -> dict[str, Any]:
    """An SDK answer as the history records it."""
    if isinstance(answer, bool):
        return {"cancelled": answer}
    if isinstance(answer, Result):
        return result_fields(answer)
    described: dict[str, Any] = {"id": answer.id, "duplicate": answer.duplicate}
    if answer.result is not None:
        described["result"] = result_fields(answer.result)
    return described


def result_fields(result: Result) -> dict[str, Any]:
    output = None
    if result.output is not None:
        with contextlib.suppress(ValueError):
            output = result.json()
    return {"status": result.status, "output": output, "message": result.message[:500]}
