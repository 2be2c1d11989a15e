"""Target parsing and the shard-redirect rules, as pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from cronoq import errors
from cronoq.client import Worker
from cronoq.client._connect import Origin, Redirect, Redirects, allowed_hosts, shard_redirect
from cronoq.transport import Endpoint

PLAIN = Endpoint("10.0.0.1:7070", secure=False)
TLS = Endpoint("cronoq.internal:7070", secure=True)
LOCAL = Endpoint("127.0.0.1:7070", secure=False)


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


def named(*urls: str) -> frozenset[Origin]:
    return frozenset(Origin.of(url) for url in urls)


def rules(home: Endpoint, *, token: bool = True, allow_http: bool = False, allow: Any = None) -> Redirects:
    return Redirects(home, sends_token=token, allow_http=allow_http, allow=allowed_hosts(allow))


def follow(home: Endpoint, url: str, **kw: Any) -> Endpoint:
    """A redirect from ``home`` that names ``url`` among the shard's endpoints (as our servers do)."""
    try:
        listed = named(url)
    except ValueError:  # not a URL: it names nothing
        listed = frozenset()
    return rules(home, **kw).follow(home, Redirect(url, listed))


# ------------------------------------------------------------------------------ transport rules


@pytest.mark.parametrize(
    ("home", "url", "token", "allow_http", "expected"),
    [
        (LOCAL, "http://127.0.0.1:7171", True, False, Endpoint("127.0.0.1:7171", False)),
        (LOCAL, "http://127.0.0.9:7171", True, False, Endpoint("127.0.0.9:7171", False)),
        (LOCAL, "http://localhost:7171", True, False, Endpoint("localhost:7171", False)),
        (LOCAL, "http://[::1]:7171", True, False, Endpoint("[::1]:7171", False)),
        (Endpoint("localhost:7070", False), "http://[::1]:1", True, False, Endpoint("[::1]:1", False)),
        (PLAIN, "http://127.0.0.1:7171", False, False, Endpoint("127.0.0.1:7171", False)),  # no token
        (PLAIN, "http://127.0.0.1:7171", True, True, Endpoint("127.0.0.1:7171", False)),  # allowed
        (PLAIN, "http://10.0.0.2:7171", False, False, Endpoint("10.0.0.2:7171", False)),  # no token to leak
        (PLAIN, "http://10.0.0.2:7171", True, True, Endpoint("10.0.0.2:7171", False)),  # explicitly allowed
        (PLAIN, "https://shard-b:7171", True, False, Endpoint("shard-b:7171", True)),  # upgrading is fine
        (TLS, "https://shard-b:7171/", True, False, Endpoint("shard-b:7171", True)),
    ],
)
def test_allowed_redirects(
    home: Endpoint, url: str, token: bool, allow_http: bool, expected: Endpoint
) -> None:
    assert follow(home, url, token=token, allow_http=allow_http) == expected


@pytest.mark.parametrize(
    ("home", "url", "token", "allow_http", "why"),
    [
        (TLS, "http://shard-b:7171", False, True, "downgrade"),
        (Endpoint("127.0.0.1:7070", True), "http://127.0.0.1:7171", True, True, "downgrade"),
        (PLAIN, "http://shard-b:7171", True, False, "token over plain http to another host"),
        (PLAIN, "http://10.0.0.2:7171", True, False, "insecure_redirect_http=True"),
        # A server's loopback address, read on another machine: whatever local program holds the port.
        (PLAIN, "http://127.0.0.1:7171", True, False, "a port of this machine"),
        (Endpoint("cronoq.internal:7070", False), "http://localhost:7171", True, False, "this machine"),
        (PLAIN, "https://user@shard-b:7171", False, False, "user information"),
        (PLAIN, "http://:pw@127.0.0.1:7171", False, False, "user information"),
        (PLAIN, "grpc://shard-b:7171", False, False, "not an http"),
        (PLAIN, "shard-b:7171", False, False, "not an http"),
        (PLAIN, "http://", False, False, "not an http"),
        (PLAIN, "http://shard-b:99999", False, False, "not a valid URL"),
    ],
)
def test_refused_redirects(home: Endpoint, url: str, token: bool, allow_http: bool, why: str) -> None:
    with pytest.raises(errors.FailedPrecondition, match=why) as refused:
        follow(home, url, token=token, allow_http=allow_http)
    assert refused.value.message.startswith(f"refusing shard redirect to {url!r}: ")


# -------------------------------------------------------------------------- where it may lead


def test_the_configured_targets_shard_endpoints_are_pinned() -> None:
    """The first answer of the configured target names the shard's URLs; a shard the worker was sent
    to can lead only among them, whatever it names itself; the configured target's next answer
    replaces them."""
    home = Endpoint("router.internal:7070", secure=True)
    shard = Endpoint("b-1.internal:7070", True)
    redirects = rules(home)
    listed = named("https://b.internal:7070", "https://b-1.internal:7070", "https://b-2.internal:7070")
    assert redirects.follow(home, Redirect("https://b-1.internal:7070", listed)) == shard
    assert redirects.named == listed
    # b-1 steps down and sends the worker to another member: named, so followed.
    assert redirects.follow(shard, Redirect("https://b-2.internal:7070", None)).address == "b-2.internal:7070"
    # A shard cannot widen the set by naming more.
    forged = Redirect("https://collector.example:443", named("https://collector.example"))
    with pytest.raises(errors.FailedPrecondition, match="not one of the shard endpoints") as refused:
        redirects.follow(shard, forged)
    assert "https://b-2.internal:7070" in refused.value.message  # it says which it knows
    assert redirects.named == listed
    # The configured target's next answer (say, after the shard map changed) replaces them.
    moved = named("https://c.internal:7070")
    assert redirects.follow(home, Redirect("https://c.internal:7070", moved)).address == "c.internal:7070"
    with pytest.raises(errors.FailedPrecondition, match="not one of the shard endpoints"):
        redirects.follow(shard, Redirect("https://b-2.internal:7070", None))
    # An answer of the configured target that names nothing (an older server in a rolling upgrade)
    # keeps what it named before.
    assert redirects.follow(home, Redirect("https://c.internal:7070", None)).address == "c.internal:7070"
    assert redirects.named == moved


def test_the_configured_targets_own_redirect_must_be_among_the_urls_it_names() -> None:
    with pytest.raises(errors.FailedPrecondition, match="not one of the shard endpoints"):
        rules(TLS).follow(TLS, Redirect("https://elsewhere:7070", named("https://b:7070")))


@pytest.mark.parametrize(
    ("listed", "url"),
    [
        ("https://Shard-B.Example:443/", "https://shard-b.example"),
        ("https://shard-b.example", "https://SHARD-B.example.:443"),
        ("http://shard-b.example", "http://shard-b.example:80/"),
        ("http://[0:0::1]:7070", "http://[::1]:7070"),
    ],
)
def test_origins_compare_host_case_insensitively_with_default_ports(listed: str, url: str) -> None:
    assert Origin.of(listed) == Origin.of(url)
    rules(LOCAL, token=False).follow(LOCAL, Redirect(url, named(listed)))


@pytest.mark.parametrize(
    ("listed", "url"),
    [
        ("https://shard-b.example:7070", "https://shard-b.example"),  # another port
        ("https://shard-b.example", "http://shard-b.example:443"),  # another scheme
        ("https://shard-b.example", "https://shard-b.example.evil"),  # another host
    ],
)
def test_another_port_scheme_or_host_is_not_the_named_endpoint(listed: str, url: str) -> None:
    with pytest.raises(errors.FailedPrecondition, match="not one of the shard endpoints"):
        rules(LOCAL, token=False).follow(LOCAL, Redirect(url, named(listed)))


def test_without_named_endpoints_only_the_configured_targets_host_is_followed() -> None:
    """A reference server (or an older one) names no endpoints: only another port of the configured
    target's host is followed, unless redirect_allow says more."""
    home = Endpoint("Cronoq.Internal:7070", secure=True)
    assert rules(home).follow(home, Redirect("https://cronoq.internal:7171", None)).address == (
        "cronoq.internal:7171"
    )
    with pytest.raises(errors.FailedPrecondition, match=r"named no shard endpoints.*redirect_allow=\["):
        rules(home).follow(home, Redirect("https://b.internal:7070", None))
    allowed = rules(home, allow=["b.internal"])
    assert allowed.follow(home, Redirect("https://b.internal:7070", None)).address == "b.internal:7070"


# ----------------------------------------------------------------------------- redirect_allow


@pytest.mark.parametrize(
    ("allow", "url"),
    [
        (["*.shards.example"], "https://b.shards.example:7070"),
        (["*.shards.example"], "https://b-1.b.Shards.Example"),
        (["b.shards.example"], "https://b.shards.example:9999"),  # a host alone: any port
        (["https://b.shards.example:7070"], "https://b.shards.example:7070"),
        (["https://b.shards.example"], "https://b.shards.example:443"),
        (["https://*.shards.example:7070"], "https://b.shards.example:7070"),
        (["10.0.0.9"], "https://10.0.0.9:7070"),
        (["[::1]"], "http://[::1]:7070"),
        (["nothing.example", "*.shards.example"], "https://b.shards.example"),
    ],
)
def test_redirect_allow_admits_what_it_names(allow: list[str], url: str) -> None:
    rules(LOCAL, allow=allow).follow(LOCAL, Redirect(url, None))


@pytest.mark.parametrize(
    ("allow", "url"),
    [
        (["*.shards.example"], "https://shards.example"),  # the suffix itself is not under it
        (["*.shards.example"], "https://evilshards.example"),
        (["https://b.shards.example:7070"], "https://b.shards.example:7071"),
        (["https://b.shards.example:7070"], "http://b.shards.example:7070"),
        (["https://b.shards.example"], "https://b.shards.example:7070"),  # the default port only
        ([], "https://b.shards.example"),  # an empty list follows no redirect
    ],
)
def test_redirect_allow_refuses_what_it_does_not_name(allow: list[str], url: str) -> None:
    with pytest.raises(errors.FailedPrecondition, match="redirect_allow does not admit it"):
        rules(LOCAL, token=False, allow=allow).follow(LOCAL, Redirect(url, None))


def test_redirect_allow_alone_decides() -> None:
    """With redirect_allow, the endpoints servers name neither widen nor narrow where a worker goes."""
    redirect = Redirect("https://b.shards.example", named("https://b.shards.example"))
    with pytest.raises(errors.FailedPrecondition, match="redirect_allow does not admit it"):
        rules(LOCAL, allow=["c.shards.example"]).follow(LOCAL, redirect)
    listed_elsewhere = Redirect("https://c.shards.example", named("https://b.shards.example"))
    rules(LOCAL, allow=["c.shards.example"]).follow(LOCAL, listed_elsewhere)


def test_redirect_allow_keeps_the_transport_rules() -> None:
    with pytest.raises(errors.FailedPrecondition, match="token over plain http to another host"):
        rules(PLAIN, allow=["*.shards.example"]).follow(PLAIN, Redirect("http://b.shards.example", None))
    with pytest.raises(errors.FailedPrecondition, match="downgrade"):
        rules(TLS, allow=["b.shards.example"]).follow(TLS, Redirect("http://b.shards.example", None))


@pytest.mark.parametrize(
    ("allow", "why"),
    [
        ("b.shards.example", r"redirect_allow: expected a list of URLs or host names, not a string"),
        (["ok.example", "*"], r"redirect_allow\[1\]: expected an http:// or https:// URL, a host name"),
        (["b.example:7070"], r"redirect_allow\[0\]: expected an http:// or https:// URL"),
        (["*.*.example"], r"redirect_allow\[0\]: expected"),
        (["b.*.example"], r"redirect_allow\[0\]: expected"),
        ([""], r"redirect_allow\[0\]: expected"),
        (["https://b.example/path"], r"redirect_allow\[0\]: a URL here names a scheme, host and port"),
        (["https://user@b.example"], r"redirect_allow\[0\]: a URL here names"),
        (["grpc://b.example"], r"redirect_allow\[0\]: it is not an http:// or https:// URL"),
        (["https://b.example:99999"], r"redirect_allow\[0\]: it is not a valid URL"),
        ([7070], r"redirect_allow\[0\]: expected a string \(got 7070\)"),
    ],
)
def test_a_bad_redirect_allow_entry_is_named(allow: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Worker("127.0.0.1:7070", "p", print, redirect_allow=allow)


# ------------------------------------------------------------------------------- the metadata


class Refused:
    """What ``shard_redirect`` reads of an ``AioRpcError``."""

    def __init__(self, trailing: Any = (), initial: Any = ()) -> None:
        self._trailing, self._initial = trailing, initial

    def trailing_metadata(self) -> Any:
        return self._trailing

    def initial_metadata(self) -> Any:
        return self._initial


def test_the_redirect_and_the_shard_endpoints_are_read_from_the_metadata() -> None:
    listed = "https://b.internal:7070, https://b-1.internal:7070,not a url,ftp://x"
    err = Refused((("cronoq-shard", "b"), ("cronoq-shard-endpoint", "https://b-1.internal:7070")))
    assert shard_redirect(err) == Redirect("https://b-1.internal:7070", None)
    err = Refused(
        initial=(("cronoq-shard-endpoint", "https://b.internal"), ("cronoq-shard-endpoints", listed))
    )
    assert shard_redirect(err) == Redirect(
        "https://b.internal", named("https://b.internal:7070", "https://b-1.internal:7070")
    )
    assert shard_redirect(Refused((("cronoq-shard-endpoints", listed),))) is None  # no redirect
