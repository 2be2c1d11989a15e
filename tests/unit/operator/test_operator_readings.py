"""From a server's snapshot (or the error its call ended with) to one pool's desired slots or why they
are unknown."""

from __future__ import annotations

from cronoq.client import Snapshot
from cronoq.errors import DeadlineExceeded, PermissionDenied, Unauthenticated, Unavailable
from cronoq.v1 import cronoq_pb2 as pb
from kube_operator.readings import Desired, Unknown, pool_reading, server_failure, unknown


def snapshot(*pools: tuple[str, int], unavailable: tuple[str, ...] = ()) -> Snapshot:
    message = pb.SnapshotResponse(
        pools=[pb.PoolSnapshot(name=name, desired=desired) for name, desired in pools],
        unavailable_shards=list(unavailable),
    )
    return Snapshot.from_proto(message)


def test_the_pools_desired_slots() -> None:
    assert pool_reading("main", "gpu", snapshot(("cpu", 3), ("gpu", 12))) == Desired(12)
    assert pool_reading("main", "cpu", snapshot(("cpu", 0))) == Desired(0)


def test_a_pool_missing_from_the_snapshot_is_unknown_not_zero() -> None:
    assert pool_reading("main", "gpu", snapshot(("cpu", 3))) == Unknown(
        "PoolNotReported", "server 'main' does not report pool 'gpu'"
    )


def test_a_pool_behind_an_unreachable_shard_names_the_shard() -> None:
    reading = pool_reading("main", "gpu", snapshot(("cpu", 3), unavailable=("gpu-shard", "other")))
    assert reading == Unknown(
        "PoolNotReported", "server 'main' does not report pool 'gpu' (unreachable shards: gpu-shard, other)"
    )


def test_an_unconfigured_server() -> None:
    assert pool_reading("nowhere", "gpu", None) == Unknown(
        "UnknownServer", "spec.server: no server named 'nowhere' in the operator's configuration"
    )


def test_a_failed_read_is_passed_on() -> None:
    failed = Unknown("ServerUnavailable", "down")
    assert pool_reading("main", "gpu", failed) is failed


def test_errors_name_the_token_problem_or_the_unavailability() -> None:
    assert (
        server_failure("main", Unauthenticated("unknown token"), identity="token").reason == "Unauthenticated"
    )
    denied = server_failure("main", PermissionDenied("it needs metrics"), identity="token")
    assert denied.reason == "PermissionDenied" and "needs the metrics role" in denied.message
    assert server_failure("main", Unavailable("not the leader"), identity="token") == Unknown(
        "ServerUnavailable", "server 'main' did not answer: unavailable: not the leader"
    )
    assert server_failure("main", DeadlineExceeded("slow"), identity="token").reason == "ServerUnavailable"


def test_errors_name_what_the_server_judged_the_operator_by() -> None:
    """Without a token the server judges the client certificate, and the message says so: a status
    blaming a token the operator never sent would send people to fix the wrong thing."""
    assert server_failure("main", Unauthenticated("unknown certificate"), identity="client certificate") == (
        Unknown(
            "Unauthenticated", "server 'main' refused the operator's client certificate: unknown certificate"
        )
    )
    denied = server_failure("main", PermissionDenied("needs metrics"), identity="client certificate")
    assert denied.message.startswith("server 'main' does not let the operator's client certificate read")


def test_long_messages_are_cut() -> None:
    message = unknown("ServerUnavailable", "x" * 1000).message
    assert len(message) == 300 and message.endswith("...")
