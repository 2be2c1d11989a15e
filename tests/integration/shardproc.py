"""Start a sharded cluster of real ``cronoq-server`` processes on loopback, one process per shard.

Every process of a cluster reads the same ``[[pools]]`` and ``[[shards]]`` (each shard's endpoint is
the gRPC address of the process serving it), so all ports are allocated before any file is written.
Each process then gets its own file: the shared tables, its own ``[server]`` (listeners and
``shard = "..."``) and whatever per-process extras a test needs (tokens that differ between shards,
an endpoint that points elsewhere).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_ports

from .helpers import postgres_store, toml_table
from .serverproc import ServerProcess, assert_clean_log, running_server, write_config


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One ``[[shards]]`` entry; ``number`` ends up in the top 8 bits of the shard's task ids."""

    name: str
    number: int
    pools: tuple[str, ...]
    pool_options: str = ""  # extra lines for each of its [[pools]] tables, e.g. "max = 1024"


def cluster_tables(
    shards: Sequence[ShardSpec],
    endpoints: Mapping[str, str],
    members: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The ``[[pools]]`` and ``[[shards]]`` tables every process of the cluster shares; ``members``
    lists a shard's processes for the router's leader search."""
    lines: list[str] = []
    for spec in shards:
        for pool in spec.pools:
            lines += ["[[pools]]", f'name = "{pool}"', spec.pool_options, ""]
    for spec in shards:
        listed = None if members is None else members.get(spec.name)
        lines.append(
            toml_table(
                "[shards]",
                name=spec.name,
                number=spec.number,
                endpoint=endpoints[spec.name],
                pools=spec.pools,
                members=listed,
            )
        )
    return "\n".join(lines)


def router_process(directory: Path, tables: str, members: Sequence[str] = ()) -> ServerProcess:
    """A ``cronoq-router`` (not started) on free ports, reading ``tables`` plus its ``[router]`` (with
    ``members``, the servers of a cluster without shards)."""
    grpc_port, http_port = free_ports(2)
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "cronoq.toml"
    router = toml_table(
        "router",
        grpc_addr=f"127.0.0.1:{grpc_port}",
        http_addr=f"127.0.0.1:{http_port}",
        members=list(members) or None,
    )
    config.write_text(router + tables)
    return ServerProcess(
        config,
        directory / "router.log",
        grpc_port=grpc_port,
        http_port=http_port,
        module="cronoq.router.main",
    )


def new_cluster(
    directory: Path,
    shards: Sequence[ShardSpec],
    *,
    extra: Mapping[str, str] | None = None,
    endpoints: Mapping[str, Mapping[str, str]] | None = None,
    env: dict[str, str] | None = None,
    via_env: Iterable[str] = (),
) -> dict[str, ServerProcess]:
    """One server process (not started) per shard, keyed by shard name, each in ``directory/<name>``.

    ``extra[name]`` is appended to that process's file (a ``[server]`` table in it is merged with the
    generated one). ``endpoints[name][other]`` overrides the endpoint of shard ``other`` as process
    ``name`` sees it, e.g. to make a peer look like it lives on another host. Shards named in
    ``via_env`` are told their shard by ``CRONOQ_SHARD`` instead of ``server.shard``.
    """
    told_by_env = set(via_env)
    picked = iter(free_ports(2 * len(shards)))
    ports = {spec.name: (next(picked), next(picked)) for spec in shards}
    actual = {name: f"http://127.0.0.1:{grpc_port}" for name, (grpc_port, _) in ports.items()}
    procs: dict[str, ServerProcess] = {}
    for spec in shards:
        seen = {**actual, **(endpoints or {}).get(spec.name, {})}
        own = (extra or {}).get(spec.name, "")
        by_env = spec.name in told_by_env
        server = "[server]\n" if by_env else f'[server]\nshard = "{spec.name}"\n'
        # write_config inserts the listener addresses right after the first "[server]" header.
        body = own.replace("[server]\n", server, 1) if "[server]\n" in own else server + own
        body = f"{body}\n{cluster_tables(shards, seen)}"
        folder = directory / spec.name
        folder.mkdir(parents=True, exist_ok=True)
        grpc_port, http_port = ports[spec.name]
        procs[spec.name] = ServerProcess(
            write_config(folder, body, grpc_port, http_port),
            folder / "server.log",
            env={**(env or {}), **({"CRONOQ_SHARD": spec.name} if by_env else {})},
            grpc_port=grpc_port,
            http_port=http_port,
        )
    return procs


@contextlib.contextmanager
def running_cluster(
    directory: Path,
    shards: Sequence[ShardSpec],
    *,
    extra: Mapping[str, str] | None = None,
    endpoints: Mapping[str, Mapping[str, str]] | None = None,
    env: dict[str, str] | None = None,
    via_env: Iterable[str] = (),
    start: Iterable[str] | None = None,
) -> Iterator[dict[str, ServerProcess]]:
    """The processes of :func:`new_cluster`, those named in ``start`` (default: all) started and ready.

    On a failure inside the block every process's log is printed, so pytest shows what the servers
    said next to the assertion.
    """
    procs = new_cluster(directory, shards, extra=extra, endpoints=endpoints, env=env, via_env=via_env)
    try:
        for name in procs if start is None else start:
            procs[name].start()
        yield procs
    except BaseException:
        for name, proc in procs.items():
            print(f"----- log of shard {name} ({proc.target}) -----\n{proc.logs()}")
        raise
    finally:
        for proc in procs.values():
            proc.stop()


@contextlib.contextmanager
def running_router(
    directory: Path, tables: str, env: dict[str, str] | None = None, members: Sequence[str] = ()
) -> Iterator[ServerProcess]:
    """A started :func:`router_process` in ``directory/router``; its log is printed on a failure inside
    the block."""
    router = router_process(directory / "router", tables, members)
    router.env = dict(env or {})
    router.start()
    try:
        yield router
    except BaseException:
        print(f"----- log of the router ({router.target}) -----\n{router.logs()}")
        raise
    finally:
        router.stop()


@contextlib.contextmanager
def routed_cluster(
    directory: Path, shards: Sequence[ShardSpec], shared: str, env: dict[str, str] | None = None
) -> Iterator[tuple[ServerProcess, dict[str, ServerProcess]]]:
    """A router in front of a cluster of ``shards``, all started; every process also reads ``shared``
    (limits, tokens, resources). Yields the router and the shards' processes by name."""
    with running_cluster(directory, shards, extra={spec.name: shared for spec in shards}, env=env) as procs:
        endpoints = {name: f"http://{proc.target}" for name, proc in procs.items()}
        with running_router(directory, f"{shared}\n{cluster_tables(shards, endpoints)}", env) as router:
            yield router, procs


@contextlib.contextmanager
def server_or_router(
    kind: str,
    directory: Path,
    config: str,
    shards: Sequence[ShardSpec],
    shared: str,
    env: dict[str, str] | None = None,
) -> Iterator[ServerProcess]:
    """The same API served two ways, for tests that run against both: ``kind`` "server" is one server
    reading ``config``; "router" is a router in front of ``shards`` (``shared`` read by every process),
    whose shards' logs are checked clean at the end as well: what the router let through reached them."""
    if kind == "server":
        with running_server(directory, config, env=env) as proc:
            yield proc
        return
    with routed_cluster(directory, shards, shared, env) as (router, procs):
        yield router
    for proc in procs.values():
        assert_clean_log(proc)


@contextlib.contextmanager
def routed_ha_cluster(
    directory: Path, shards: Sequence[ShardSpec], postgres_url: str, schema: str
) -> Iterator[tuple[ServerProcess, dict[str, list[ServerProcess]]]]:
    """The cluster as users run it (Compose, ``make cluster``): per shard a leader and a standby on the
    shard's own Postgres schema (``<schema>_<shard>``), both listed as the shard's ``members``, and a
    router in front. Yields the router and, per shard, [leader, standby], all started (the standbys
    standing by); every log is printed on a failure inside the block."""
    picked = iter(free_ports(4 * len(shards)))
    ports = {spec.name: [(next(picked), next(picked)) for _ in range(2)] for spec in shards}
    urls = {name: [f"http://127.0.0.1:{grpc}" for grpc, _ in pairs] for name, pairs in ports.items()}
    tables = cluster_tables(shards, {name: members[0] for name, members in urls.items()}, urls)
    body = postgres_store(f"{schema}_{{shard}}") + tables
    servers: dict[str, list[ServerProcess]] = {}
    for name, pairs in ports.items():
        servers[name] = []
        for i, (grpc_port, http_port) in enumerate(pairs):
            folder = directory / f"{name}{i}"
            folder.mkdir(parents=True)
            config = write_config(folder, f'[server]\nshard = "{name}"\n{body}', grpc_port, http_port)
            servers[name].append(
                ServerProcess(
                    config,
                    folder / "server.log",
                    env={"DATABASE_URL": postgres_url},
                    grpc_port=grpc_port,
                    http_port=http_port,
                )
            )
    router = router_process(directory / "router", tables)
    started: list[ServerProcess] = []
    with stopped_after(started):
        for procs in servers.values():
            procs[0].start()
            started.append(procs[0])
            procs[1].start(ready=False)
            started.append(procs[1])
        router.start()
        started.append(router)
        yield router, servers


@contextlib.contextmanager
def stopped_after(started: list[ServerProcess]) -> Iterator[None]:
    """Stop every process in ``started`` (which the block may fill as it starts them) when the block
    ends, and print each one's log first when it ends on a failure."""
    try:
        yield
    except BaseException:
        for proc in started:
            print(f"----- {proc.log_path} -----\n{proc.logs()}")
        raise
    finally:
        for proc in started:
            proc.stop()
