"""A scaler's spec as the operator reads it: valid specs parse, and every problem names its field."""

from __future__ import annotations

from typing import Any

import pytest

from kube_operator.scaler import InvalidSpec, ScalerRef, ScalerSpec, parse_spec

GOOD = {
    "server": "main",
    "pool": "default",
    "deployment": "default-workers",
    "slotsPerReplica": 4,
    "minReplicas": 0,
    "maxReplicas": 100,
}


def problems(**changes: Any) -> tuple[str, ...]:
    spec = {key: value for key, value in (GOOD | changes).items() if value is not None}
    parsed = parse_spec({"spec": spec})
    assert isinstance(parsed, InvalidSpec), parsed
    return tuple(parsed.problems)


def test_the_seed_example_parses() -> None:
    assert parse_spec({"spec": GOOD}) == ScalerSpec("main", "default", "default-workers", 4, 0, 100, None)


def test_min_replicas_defaults_to_zero_and_interval_to_the_operators() -> None:
    spec = {key: value for key, value in GOOD.items() if key != "minReplicas"} | {"intervalSeconds": 5}
    assert parse_spec({"spec": spec}) == ScalerSpec("main", "default", "default-workers", 4, 0, 100, 5)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"minReplicas": 5, "maxReplicas": 2}, "spec.minReplicas (5) must not exceed spec.maxReplicas (2)"),
        ({"slotsPerReplica": 0}, "spec.slotsPerReplica must be at least 1 (got 0)"),
        ({"slotsPerReplica": None}, "spec.slotsPerReplica: required"),
        ({"slotsPerReplica": 2.5}, "spec.slotsPerReplica: expected an integer (got 2.5)"),
        ({"slotsPerReplica": True}, "spec.slotsPerReplica: expected an integer (got True)"),
        ({"minReplicas": -1}, "spec.minReplicas must be at least 0 (got -1)"),
        ({"maxReplicas": 0}, "spec.maxReplicas must be at least 1 (got 0)"),
        ({"maxReplicas": None}, "spec.maxReplicas: required"),
        ({"intervalSeconds": 0}, "spec.intervalSeconds must be between 1 and 3600 (got 0)"),
        ({"server": None}, "spec.server: required"),
        ({"server": 7}, "spec.server: expected a string"),
        (
            {"pool": "no spaces"},
            "spec.pool: must be 1 to 64 characters from A-Z a-z 0-9 _ . : - (got 'no spaces')",
        ),
        (
            {"deployment": "Upper"},
            "spec.deployment: must be a Deployment name (lower-case letters, digits, - and .) (got 'Upper')",
        ),
    ],
)
def test_each_problem_names_its_field(changes: dict[str, Any], expected: str) -> None:
    assert problems(**changes) == (expected,)


def test_all_problems_are_reported_together() -> None:
    assert problems(slotsPerReplica=0, pool=None) == (
        "spec.pool: required",
        "spec.slotsPerReplica must be at least 1 (got 0)",
    )


def test_no_spec_at_all() -> None:
    assert parse_spec({"metadata": {}}) == InvalidSpec(("spec: required",))


def test_ref_reads_metadata_and_tells_a_recreated_scaler_apart() -> None:
    obj = {"metadata": {"namespace": "ns", "name": "s", "uid": "u-1", "generation": 4}}
    ref = ScalerRef.of(obj)
    assert (str(ref), ref.key, ref.generation) == ("ns/s", "u-1", 4)
    assert ScalerRef.of({"metadata": {"namespace": "ns", "name": "s"}}).key == "ns/s"
