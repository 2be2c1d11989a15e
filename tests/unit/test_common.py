"""Unit tests for the small shared pieces: errors, auth, logging, the output cache."""

from __future__ import annotations

import io
import json
import logging
import pickle

import pytest
import structlog

from cronoq import errors
from cronoq.api.output_types import OutputTypes
from cronoq.auth import ANONYMOUS_ADMIN, Authenticator, Role, TokenEntry
from cronoq.logs import LogLevels, configure, get_logger, levels_from_env
from shard.outputs import OutputCache

TOKEN = "s3cret-token-0123456789"


@pytest.mark.parametrize(
    ("code", "cls", "http", "retryable"),
    [
        ("invalid_argument", errors.InvalidArgument, 400, False),
        ("unauthenticated", errors.Unauthenticated, 401, False),
        ("permission_denied", errors.PermissionDenied, 403, False),
        ("not_found", errors.NotFound, 404, False),
        ("failed_precondition", errors.FailedPrecondition, 409, False),
        ("resource_exhausted", errors.ResourceExhausted, 429, True),
        ("unavailable", errors.Unavailable, 503, True),
        ("deadline_exceeded", errors.DeadlineExceeded, 504, False),
        ("data_loss", errors.DataLoss, 500, False),
    ],
)
def test_error_classes_map_codes(code: str, cls: type[errors.ApiError], http: int, retryable: bool) -> None:
    err = errors.error_for(code, "why")
    assert type(err) is cls and err.code == code and err.http_status == http and err.retryable is retryable
    assert str(err) == f"{code}: why"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is cls and again.message == "why"


def test_unfamiliar_code_is_kept() -> None:
    err = errors.error_for("brand_new", "x")
    assert isinstance(err, errors.Unknown) and err.code == "brand_new"


def test_an_error_message_is_cut_to_what_a_grpc_trailer_carries() -> None:
    """A grpc client drops a status whose message is over its metadata limit (8-16 KiB, percent-encoded)
    and reports RESOURCE_EXHAUSTED "Stream removed" instead: every message is cut below it."""
    short = errors.NotFound("pools: unknown pool 'x'")
    assert short.message == "pools: unknown pool 'x'"
    # 1, 2 and 4 bytes in UTF-8; a lone surrogate (JSON can carry one) is kept as "?", valid UTF-8
    for char, kept in (("k", "k"), ("é", "é"), ("\U0001f600", "\U0001f600"), ("\ud800", "?")):
        long = errors.NotFound("pools: unknown pool " + char * 100_000)
        assert long.message.startswith("pools: unknown pool " + kept * 10)
        assert long.message.endswith("... (message cut: 100,020 characters)")
        assert len(long.message.encode(errors="replace")) <= errors.MAX_MESSAGE_BYTES
        assert str(long) == f"not_found: {long.message}"
    exactly = "x" * errors.MAX_MESSAGE_BYTES
    assert errors.InvalidArgument(exactly).message == exactly


def test_a_callers_value_is_quoted_short() -> None:
    assert errors.shown("gpu") == "'gpu'"
    assert errors.shown("p" * errors.SHOWN_CHARS) == f"'{'p' * errors.SHOWN_CHARS}'"
    assert errors.shown("p" * 100_000) == f"'{'p' * errors.SHOWN_CHARS}...' (100,000 characters)"


def test_authenticator_roles_and_failures() -> None:
    auth = Authenticator([TokenEntry(TOKEN, Role.CLIENT, pools=frozenset({"a"}))])
    assert auth.enabled
    principal = auth.require(f"Bearer {TOKEN}", Role.CLIENT)
    assert principal.may_use_pool("a") and not principal.may_use_pool("b")
    with pytest.raises(errors.PermissionDenied):
        auth.require(f"Bearer {TOKEN}", Role.WORKER)
    for header in (None, "", "Basic abc", "Bearer ", f"Bearer {TOKEN}x"):
        with pytest.raises(errors.Unauthenticated):
            auth.authenticate(header)


def test_no_credentials_means_anonymous_admin() -> None:
    auth = Authenticator([])
    assert not auth.enabled
    assert auth.require(None, Role.WORKER) is ANONYMOUS_ADMIN


@pytest.mark.parametrize(
    ("env", "level"),
    [
        ({}, logging.INFO),
        ({"CRONOQ_LOG": "debug"}, logging.DEBUG),
        ({"RUST_LOG": "warn"}, logging.WARNING),
        ({"CRONOQ_LOG": "error", "RUST_LOG": "debug"}, logging.ERROR),
        ({"RUST_LOG": "cronoq=debug,info"}, logging.DEBUG),  # the cronoq target wins over a bare level
        ({"CRONOQ_LOG": "warn,grpc=debug"}, logging.WARNING),  # a library's level is not ours
        ({"CRONOQ_LOG": "nonsense"}, logging.INFO),
    ],
)
def test_log_level_from_env(env: dict[str, str], level: int) -> None:
    assert levels_from_env(env).own == level


def test_log_targets_set_library_levels() -> None:
    levels = levels_from_env({"CRONOQ_LOG": " info , grpc=debug,psycopg.pool = INFO,aiohttp=bogus"})
    assert levels == LogLevels(logging.INFO, {"grpc": logging.DEBUG, "psycopg.pool": logging.INFO})
    assert levels.libraries == logging.WARNING  # the libraries not named
    assert levels_from_env({"CRONOQ_LOG": "error"}).libraries == logging.ERROR


def test_logs_are_json_lines_off_a_terminal() -> None:
    out = io.StringIO()
    try:
        configure({"CRONOQ_LOG": "info"}, stream=out)
        get_logger("t").info("hello", pool="default")
        get_logger("t").debug("hidden")
    finally:
        structlog.reset_defaults()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["event"] == "hello" and record["pool"] == "default" and record["level"] == "info"


def test_standard_library_records_are_json_lines_of_the_same_stream() -> None:
    """grpc and psycopg.pool log through the standard library: their records come out as our own lines
    are, naming their logger, at warning and above."""
    out = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        configure({"CRONOQ_LOG": "debug"}, stream=out)
        logging.getLogger("psycopg.pool").warning("error connecting in %r: %s", "cronoq:a", "refused")
        logging.getLogger("psycopg.pool").info("connection requested")  # below warning: not written
        try:
            raise RuntimeError("core said no")
        except RuntimeError:
            logging.getLogger("grpc._cython.cygrpc").exception("unexpected")
    finally:
        structlog.reset_defaults()
        root.handlers[:] = handlers
        root.setLevel(level)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert (first["logger"], first["level"], first["event"]) == (
        "psycopg.pool",
        "warning",
        "error connecting in 'cronoq:a': refused",
    )
    assert (second["logger"], second["level"], second["event"]) == (
        "grpc._cython.cygrpc",
        "error",
        "unexpected",
    )
    assert "RuntimeError: core said no" in second["exception"]


def test_a_library_named_in_cronoq_log_writes_at_its_own_level() -> None:
    """``CRONOQ_LOG=warn,aiohttp.access=info`` opens one library up (its info records come out as JSON
    lines of the stream) while cronoq's own info and the other libraries' stay quiet."""
    out = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    access = logging.getLogger("aiohttp.access")
    try:
        configure({"CRONOQ_LOG": "warn,aiohttp.access=info"}, stream=out)
        access.info("GET /v1/tasks 200")
        logging.getLogger("psycopg.pool").info("connection requested")  # not named: warning and above
        get_logger("cronoq.t").info("ours")  # below cronoq's own level
    finally:
        structlog.reset_defaults()
        root.handlers[:] = handlers
        root.setLevel(level)
        access.setLevel(logging.NOTSET)
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert (record["logger"], record["level"], record["event"]) == (
        "aiohttp.access",
        "info",
        "GET /v1/tasks 200",
    )


def test_output_cache_bounds_entries_and_bytes() -> None:
    cache = OutputCache(max_entries=2, max_bytes=10)
    cache.put(1, b"aaaa", "text/plain")
    cache.put(2, b"bbbb", "")
    cache.put(3, b"cccc", "")
    assert 1 not in cache and cache.get(3) == (b"cccc", "")
    cache.put(4, b"x" * 11, "")  # larger than the whole budget: not kept, nothing evicted
    assert 4 not in cache and len(cache) == 2
    cache.put(5, b"dddddddd", "")  # 8 bytes: evicts until the total fits
    assert cache.nbytes <= 10 and 5 in cache


def test_output_types_outlive_their_outputs_within_their_own_bound() -> None:
    cache = OutputCache(max_entries=1, max_bytes=10)
    cache.put(1, b"{}", "application/json")
    cache.put(2, b"ab", "")  # evicts 1's output, not its type
    cache.put(3, b"x" * 11, "text/plain")  # too big to cache: its type is kept all the same
    assert 1 not in cache and 3 not in cache
    assert [cache.content_type(i) for i in (1, 2, 3, 4)] == ["application/json", "", "text/plain", ""]

    types = OutputTypes(kept=2)
    types.record(1, "application/json")
    types.record(2, "text/plain")
    types.record(1, "application/json")  # recorded again: now the newest
    types.record(3, "")  # nothing to keep: evicts nothing
    types.record(4, "text/csv")  # one over the bound: the oldest recorded (2) goes
    assert [types.get(i) for i in (1, 2, 3, 4)] == ["application/json", "", "", "text/csv"]
