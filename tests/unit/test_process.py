"""Which event loop cronoq's programs run on (``CRONOQ_EVENT_LOOP``)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from cronoq.process import EVENT_LOOP_ENV, choose_event_loop, running_loop_name


async def _loop_kind() -> tuple[str, str]:
    return running_loop_name(), type(asyncio.get_running_loop()).__module__


@pytest.mark.parametrize("value", [None, "", "auto", " AUTO ", "uvloop", "UVLoop"])
def test_uvloop_is_chosen_by_default_and_on_request(value: str | None) -> None:
    env = {} if value is None else {EVENT_LOOP_ENV: value}
    loop = choose_event_loop(env)
    assert loop.name == "uvloop"
    name, module = loop.run(_loop_kind())
    assert name == "uvloop" and module.startswith("uvloop")


def test_asyncio_on_request() -> None:
    loop = choose_event_loop({EVENT_LOOP_ENV: "asyncio"})
    assert loop.name == "asyncio"
    name, module = loop.run(_loop_kind())
    assert name == "asyncio" and module.startswith("asyncio")


@pytest.mark.parametrize("value", ["tokio", "uv loop", "1"])
def test_an_unknown_choice_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(
        ValueError, match=rf"^CRONOQ_EVENT_LOOP='{value}': expected one of auto, uvloop, asyncio$"
    ):
        choose_event_loop({EVENT_LOOP_ENV: value})


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # makes `import uvloop` raise ImportError
    assert choose_event_loop({}).name == "asyncio"
    with pytest.raises(ValueError, match="CRONOQ_EVENT_LOOP=uvloop, but uvloop is not installed"):
        choose_event_loop({EVENT_LOOP_ENV: "uvloop"})
