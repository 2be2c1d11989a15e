"""A shard's request logic for unit tests, without a server process: the :class:`~shard.service.ShardService`
over a given runtime, with small limits the tests rely on."""

from __future__ import annotations

from collections.abc import Sequence

from cronoq.auth import Authenticator
from cronoq.engine.model import PoolConfig
from shard.convert import SpecLimits
from shard.runtime import Runtime
from shard.service import ShardService

SPEC_LIMITS = SpecLimits(
    max_key_len=128, max_kind_len=64, max_tags=8, max_tag_len=64, max_deps=2, max_resources=2
)
MAX_TASKS_PER_BATCH = 8
MAX_LIST = 50


def service_over(
    runtime: Runtime,
    pools: Sequence[PoolConfig],
    auth: Authenticator | None = None,
    *,
    max_wait_s: float = 5.0,
    request_timeout_s: float = 5.0,
) -> ShardService:
    """A ShardService serving ``runtime`` (whose engine has ``pools``); no credentials unless ``auth``."""
    service = ShardService(
        pools,
        auth if auth is not None else Authenticator([]),
        spec_limits=SPEC_LIMITS,
        max_tasks_per_batch=MAX_TASKS_PER_BATCH,
        max_wait_s=max_wait_s,
        request_timeout_s=request_timeout_s,
        max_list=MAX_LIST,
    )
    service.serve(runtime)
    return service
