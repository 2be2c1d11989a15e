"""The operator's decision, case by case: spec + pool reading + current replicas -> replicas to set (or
none) and the status that says why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kube_operator.decision import Decision, Observation, decide, status_changed, target_replicas
from kube_operator.readings import Desired, Unknown
from kube_operator.scaler import InvalidSpec, ScalerSpec

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
STAMP = "2026-03-01T12:00:00Z"
EARLIER = "2026-02-01T08:30:00Z"
SPEC = ScalerSpec("main", "default", "workers", slots_per_replica=4, min_replicas=1, max_replicas=10)


def run(
    reading: Desired | Unknown,
    current: int | Unknown,
    spec: ScalerSpec = SPEC,
    previous: dict[str, Any] | None = None,
    generation: int = 3,
) -> Decision:
    return decide(
        Observation(spec, reading, current), generation=generation, previous=previous or {}, now=NOW
    )


def ready(decision: Decision) -> dict[str, Any]:
    [condition] = decision.status["conditions"]
    assert condition["type"] == "Ready"
    return dict(condition)


@pytest.mark.parametrize(
    ("desired", "replicas"),
    [
        (1, 1),  # ceil(1 / 4)
        (4, 1),
        (5, 2),  # a partly used replica still counts
        (8, 2),
        (9, 3),
        (40, 10),
    ],
)
def test_replicas_are_the_ceiling_of_desired_over_slots_per_replica(desired: int, replicas: int) -> None:
    decision = run(Desired(desired), current=7)
    assert decision.replicas == (replicas if replicas != 7 else None)
    assert decision.status["replicas"] == replicas
    assert decision.status["desiredSlots"] == desired


def test_above_max_replicas_is_capped() -> None:
    decision = run(Desired(100), current=2)
    assert decision.replicas == 10
    assert (
        decision.status["message"]
        == "100 desired slots / 4 per replica = 25 replicas, capped at maxReplicas 10"
    )


def test_zero_desired_means_min_replicas() -> None:
    decision = run(Desired(0), current=6)
    assert decision.replicas == 1
    assert (
        decision.status["message"] == "0 desired slots / 4 per replica = 0 replicas, raised to minReplicas 1"
    )


def test_zero_desired_with_min_zero_scales_to_zero() -> None:
    spec = ScalerSpec("main", "default", "workers", 4, min_replicas=0, max_replicas=10)
    assert run(Desired(0), current=3, spec=spec).replicas == 0


def test_below_min_replicas_is_raised() -> None:
    spec = ScalerSpec("main", "default", "workers", 4, min_replicas=3, max_replicas=10)
    decision = run(Desired(5), current=0, spec=spec)
    assert decision.replicas == 3
    assert decision.status["message"].endswith("raised to minReplicas 3")


def test_a_scale_sets_replicas_and_stamps_the_scale_time() -> None:
    decision = run(Desired(12), current=1, previous={"lastScaleTime": EARLIER})
    assert decision.replicas == 3
    assert decision.status == {
        "observedGeneration": 3,
        "desiredSlots": 12,
        "replicas": 3,
        "reason": "Scaled",
        "message": "12 desired slots / 4 per replica = 3 replicas",
        "lastScaleTime": STAMP,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Scaled",
                "message": "12 desired slots / 4 per replica = 3 replicas",
                "observedGeneration": 3,
                "lastTransitionTime": STAMP,
            }
        ],
    }


def test_nothing_is_written_when_replicas_already_match() -> None:
    first = run(Desired(12), current=1)
    later = decide(
        Observation(SPEC, Desired(12), 3), generation=3, previous=first.status, now=NOW + timedelta(minutes=5)
    )
    assert later.replicas is None
    assert later.status == first.status  # times carried over: the status is not rewritten either
    assert not status_changed(first.status, later.status)


@pytest.mark.parametrize(
    "reason",
    [
        "ServerUnavailable",
        "Unauthenticated",
        "PermissionDenied",
        "PoolNotReported",
        "UnknownServer",
        "TokenUnreadable",
        "CertificateUnreadable",
    ],
)
def test_no_reading_leaves_the_deployment_alone(reason: str) -> None:
    previous = run(Desired(12), current=1).status
    decision = run(Unknown(reason, "what went wrong"), current=3, previous=previous)
    assert decision.replicas is None
    status = decision.status
    assert status["reason"] == reason
    assert status["message"] == "what went wrong; deployment 'workers' left at 3 replicas"
    assert status["desiredSlots"] is None  # removed: the last value would be stale
    assert status["replicas"] == 3
    assert status["lastScaleTime"] == STAMP  # the last scale is still the last scale
    assert ready(decision)["status"] == "False" and ready(decision)["reason"] == reason


def test_an_unknown_server_is_said_even_without_a_deployment() -> None:
    decision = run(
        Unknown("UnknownServer", "spec.server: no server named 'x'"), Unknown("DeploymentNotFound", "no")
    )
    assert decision.replicas is None
    assert decision.status["reason"] == "UnknownServer"
    assert decision.status["message"] == "spec.server: no server named 'x'"
    assert decision.status["replicas"] is None


def test_a_missing_deployment_is_not_scaled_but_desired_is_shown() -> None:
    decision = run(Desired(9), Unknown("DeploymentNotFound", "no deployment 'workers' in namespace 'ns'"))
    assert decision.replicas is None
    assert decision.status["reason"] == "DeploymentNotFound"
    assert decision.status["desiredSlots"] == 9
    assert decision.status["replicas"] is None


def test_an_invalid_spec_scales_nothing_and_names_the_fields() -> None:
    invalid = InvalidSpec(
        (
            "spec.minReplicas (5) must not exceed spec.maxReplicas (2)",
            "spec.slotsPerReplica must be at least 1 (got 0)",
        )
    )
    decision = decide(invalid, generation=7, previous={}, now=NOW)
    assert decision.replicas is None
    assert decision.status["reason"] == "InvalidSpec"
    assert decision.status["message"] == (
        "spec.minReplicas (5) must not exceed spec.maxReplicas (2); spec.slotsPerReplica must be at least 1 (got 0)"
    )
    assert decision.status["observedGeneration"] == 7
    assert ready(decision)["status"] == "False"


def test_ready_transition_time_moves_only_when_ready_flips() -> None:
    up = run(
        Desired(4),
        current=1,
        previous={"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": EARLIER}]},
    )
    assert ready(up)["lastTransitionTime"] == EARLIER
    down = run(Unknown("ServerUnavailable", "down"), current=1, previous=up.status)
    assert ready(down)["lastTransitionTime"] == STAMP
    still_down = decide(
        Observation(SPEC, Unknown("PoolNotReported", "gone"), 1),
        generation=3,
        previous=down.status | {"conditions": [ready(down) | {"lastTransitionTime": EARLIER}]},
        now=NOW,
    )
    assert ready(still_down)["lastTransitionTime"] == EARLIER


def test_status_changed_ignores_fields_the_operator_does_not_own_and_sees_removals() -> None:
    status = run(Desired(4), current=1).status
    assert not status_changed(status | {"somethingElse": 1}, status)
    assert status_changed(status, status | {"replicas": 2})
    assert status_changed(status | {"desiredSlots": 4}, status | {"desiredSlots": None})
    assert status_changed({}, status)


def test_target_replicas_never_goes_below_zero() -> None:
    spec = ScalerSpec("main", "default", "workers", 4, min_replicas=0, max_replicas=3)
    assert target_replicas(spec, -5)[0] == 0
