"""Target parsing and the shard-redirect safety rules, as pure functions."""

from __future__ import annotations

import pytest

from cronoq import errors
from cronoq.client._connect import Endpoint, follow_redirect

PLAIN = Endpoint("10.0.0.1:7070", secure=False)
TLS = Endpoint("cronoq.internal:7070", secure=True)


@pytest.mark.parametrize(
    ("target", "tls", "expected"),
    [
        ("cronoq:7070", False, Endpoint("cronoq:7070", False)),
        ("cronoq:7070", True, Endpoint("cronoq:7070", True)),
        ("http://cronoq:7070", False, Endpoint("cronoq:7070", False)),
        ("http://cronoq:7070", True, Endpoint("cronoq:7070", True)),
        ("grpc://cronoq:7070/", False, Endpoint("cronoq:7070", False)),
        ("https://cronoq:7070", False, Endpoint("cronoq:7070", True)),
        ("[::1]:7070", False, Endpoint("[::1]:7070", False)),
    ],
)
def test_target_prefixes_are_stripped_and_https_means_tls(target: str, tls: bool, expected: Endpoint) -> None:
    assert Endpoint.parse(target, secure=tls) == expected


@pytest.mark.parametrize(
    ("current", "url", "token", "allow_http", "expected"),
    [
        (PLAIN, "http://127.0.0.1:7171", True, False, Endpoint("127.0.0.1:7171", False)),
        (PLAIN, "http://127.0.0.9:7171", True, False, Endpoint("127.0.0.9:7171", False)),
        (PLAIN, "http://localhost:7171", True, False, Endpoint("localhost:7171", False)),
        (PLAIN, "http://[::1]:7171", True, False, Endpoint("[::1]:7171", False)),
        (PLAIN, "http://10.0.0.2:7171", False, False, Endpoint("10.0.0.2:7171", False)),  # no token to leak
        (PLAIN, "http://10.0.0.2:7171", True, True, Endpoint("10.0.0.2:7171", False)),  # explicitly allowed
        (PLAIN, "https://shard-b:7171", True, False, Endpoint("shard-b:7171", True)),  # upgrading is fine
        (TLS, "https://shard-b:7171/", True, False, Endpoint("shard-b:7171", True)),
    ],
)
def test_allowed_redirects(
    current: Endpoint, url: str, token: bool, allow_http: bool, expected: Endpoint
) -> None:
    assert follow_redirect(current, url, sends_token=token, allow_http=allow_http) == expected


@pytest.mark.parametrize(
    ("current", "url", "token", "allow_http", "why"),
    [
        (TLS, "http://shard-b:7171", False, True, "downgrade"),
        (TLS, "http://127.0.0.1:7171", True, True, "downgrade"),
        (PLAIN, "http://shard-b:7171", True, False, "token over plain http"),
        (PLAIN, "http://10.0.0.2:7171", True, False, "insecure_redirect_http=True"),
        (PLAIN, "https://user@shard-b:7171", False, False, "user information"),
        (PLAIN, "http://:pw@127.0.0.1:7171", False, False, "user information"),
        (PLAIN, "grpc://shard-b:7171", False, False, "not an http"),
        (PLAIN, "shard-b:7171", False, False, "not an http"),
        (PLAIN, "http://", False, False, "not an http"),
        (PLAIN, "http://shard-b:99999", False, False, "not a valid URL"),
    ],
)
def test_refused_redirects(current: Endpoint, url: str, token: bool, allow_http: bool, why: str) -> None:
    with pytest.raises(errors.FailedPrecondition, match=why):
        follow_redirect(current, url, sends_token=token, allow_http=allow_http)
