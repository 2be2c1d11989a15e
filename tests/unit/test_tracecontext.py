"""The W3C trace context a task carries (cronoq.tracecontext) and when a process traces (cronoq.telemetry)."""

from __future__ import annotations

import types

import pytest
from multidict import CIMultiDict

from cronoq.config.model import TelemetrySection
from cronoq.telemetry import problems, wanted
from cronoq.tracecontext import MAX_TRACESTATE, from_headers, from_metadata, trace_context, with_context

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        PARENT.upper(),  # hex is lower-case
        "ff" + PARENT[2:],  # version ff is invalid
        PARENT[:3] + "0" * 32 + PARENT[35:],  # all-zero trace id
        PARENT[:36] + "0" * 16 + PARENT[52:],  # all-zero parent id
        PARENT + "-more",  # version 00 has exactly four fields
        " " + PARENT,
    ],
)
def test_a_malformed_traceparent_is_ignored(bad: str) -> None:
    assert trace_context(bad, "a=b") == ()


def test_a_context_and_its_state() -> None:
    assert trace_context(PARENT, None) == (("traceparent", PARENT),)
    assert trace_context(PARENT, "a=b") == (("traceparent", PARENT), ("tracestate", "a=b"))
    assert trace_context(PARENT, "a" * (MAX_TRACESTATE + 1)) == (("traceparent", PARENT),)
    future = "01" + PARENT[2:] + "-extra"  # a later version may add fields
    assert trace_context(future, None) == (("traceparent", future),)


def test_from_metadata_and_headers() -> None:
    assert from_metadata((("authorization", "x"), ("traceparent", PARENT), ("tracestate", "a=b"))) == (
        ("traceparent", PARENT),
        ("tracestate", "a=b"),
    )
    assert from_metadata((("tracestate", "a=b"),)) == ()
    assert from_metadata(None) == ()
    assert from_headers(CIMultiDict({"TraceParent": PARENT})) == (("traceparent", PARENT),)
    assert from_headers(CIMultiDict({"traceparent": "junk"})) == ()


def test_the_producers_own_traceparent_tag_wins() -> None:
    carried = (("traceparent", PARENT),)
    assert with_context({"a": "b"}, carried) == {"a": "b", "traceparent": PARENT}
    own = {"traceparent": "mine"}
    assert with_context(own, carried) is own
    assert with_context(own, ()) is own


def test_what_turns_tracing_on() -> None:
    off = TelemetrySection()
    assert wanted(off, {}) is None
    assert wanted(TelemetrySection(enabled=True), {}) == "telemetry.enabled"
    assert wanted(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}) == "OTEL_EXPORTER_OTLP_ENDPOINT"
    assert (
        wanted(off, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"})
        == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    assert wanted(TelemetrySection(enabled=True), {"OTEL_SDK_DISABLED": "True"}) is None
    assert problems(TelemetrySection(enabled=True), {}) == []  # the extra is installed here


def test_the_worker_asks_for_a_tracer_provider_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether the application set a provider is a question each lease would pay for (about 3 us of a
    no-op task's worker CPU): asked at most once a second until one is set, then never again."""
    from cronoq.client import _tracing

    class Proxy:
        pass

    asked: list[object] = []
    provider: list[object] = [Proxy()]

    def get_tracer_provider() -> object:
        asked.append(provider[0])
        return provider[0]

    trace = types.ModuleType("trace")  # the API module's two names the check uses
    trace.ProxyTracerProvider = Proxy  # type: ignore[attr-defined]
    trace.get_tracer_provider = get_tracer_provider  # type: ignore[attr-defined]
    now = [100.0]
    monkeypatch.setattr(_tracing, "monotonic", lambda: now[0])
    check = _tracing._ProviderCheck()
    assert not check(trace) and not check(trace) and len(asked) == 1
    provider[0] = object()  # the application sets one
    now[0] += 0.5
    assert not check(trace) and len(asked) == 1  # not asked again within the second
    now[0] += 0.5
    assert check(trace) and check(trace) and len(asked) == 2  # seen, and never asked again
