"""Value rules attached to configuration fields.

Each dataclass field in :mod:`cronoq.config.model` may carry one rule in its metadata: a :class:`Range`
for numbers or a :class:`Check` for strings. Validation walks every field and applies its rule, so a
key's default, type and allowed values are declared in one place, next to each other. The JSON Schema of
the file (:mod:`cronoq.config.schema`) is generated from the same rules: a range's bounds, and what a
check declares of itself in JSON Schema words (``Check.schema``: a pattern taken from the very regular
expression the check uses, or a condition every accepted value meets), so an editor flags what it can
and never a value the check accepts.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from cronoq.hosts import is_loopback_name

from .problems import show

YEAR_S = 365 * 86_400  # the longest duration accepted anywhere in the file, as in the reference server
U32_MAX = 4_294_967_295
BILLION = 1_000_000_000
MIN_TOKEN_LEN = 16

RULE = "cronoq.config.rule"
RESOLVED_KEY = "cronoq.config.resolved"


@dataclass(frozen=True, slots=True)
class Range:
    """Inclusive bounds for a number; ``low_open`` makes the lower bound exclusive (durations > 0)."""

    low: float
    high: float
    low_open: bool = False

    def problem(self, value: float) -> str | None:
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        too_low = value <= self.low if self.low_open else value < self.low
        if too_low or value > self.high:
            low = f"> {show(self.low)}" if self.low_open else f"at least {show(self.low)}"
            return f"must be {low} and at most {show(self.high)}"
        return None


@dataclass(frozen=True, slots=True)
class Check:
    """A string rule; ``secret`` values are never quoted back in a message. ``schema`` is what JSON
    Schema can say of the values ``test`` accepts (every value it accepts must pass it)."""

    test: Callable[[str], str | None]
    secret: bool = False
    schema: Mapping[str, object] = field(default_factory=dict)


Rule = Range | Check


def between(low: float, high: float) -> Mapping[str, Rule]:
    return {RULE: Range(low, high)}


def above(low: float, high: float) -> Mapping[str, Rule]:
    return {RULE: Range(low, high, low_open=True)}


def checked(
    test: Callable[[str], str | None], *, secret: bool = False, schema: Mapping[str, object] | None = None
) -> Mapping[str, Rule]:
    return {RULE: Check(test, secret, schema or {})}


def matching(pattern: re.Pattern[str]) -> Mapping[str, object]:
    """The JSON Schema of strings that ``pattern.fullmatch`` accepts (the schema's are searches)."""
    return {"pattern": f"^(?:{pattern.pattern})$"}


# ------------------------------------------------------------------------------------------ checks

_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DNS_LABEL = r"(\*|[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)"
_DNS_NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
# Replaced by a server's shard name in [store] schema (Postgres) and path (SQLite): one file, a store per shard.
SHARD_PLACEHOLDER = "{shard}"
_SCHEMA = re.compile(rf"([A-Za-z0-9_]|{re.escape(SHARD_PLACEHOLDER)})+")
MAX_SCHEMA_LEN = 63  # Postgres truncates longer identifiers, which would silently merge clusters


def check_name(value: str) -> str | None:
    """Pool, resource and shard names: they appear in metrics labels, metadata and URLs unescaped."""
    return None if _NAME.fullmatch(value) else "must be 1 to 64 characters from A-Z a-z 0-9 _ . : -"


def check_address(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    if not (sep and host and port.isascii() and port.isdigit() and len(port) <= 5) or int(port) > 65_535:
        return "expected host:port"
    if host.startswith("[") and host.endswith("]"):
        return None if _is_ip(host[1:-1], version=6) else "expected host:port"
    if ":" in host:
        return "expected host:port (IPv6 addresses go in brackets, e.g. [::1]:7070)"
    return None if _HOST.fullmatch(host) else "expected host:port"


def is_loopback(address: str) -> bool:
    """Whether a listener address only accepts connections from this host (no credentials needed)."""
    return is_loopback_name(address.rpartition(":")[0].strip("[]"))


def check_http_url(value: str) -> str | None:
    try:
        parts = urlsplit(value)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        valid = False
    return None if valid else "expected an http:// or https:// URL"


def check_origin(value: str) -> str | None:
    """A CORS origin is scheme://host[:port] with nothing after it, or ``*`` for any origin."""
    if value == "*":
        return None
    if check_http_url(value) is None:
        parts = urlsplit(value)
        if parts.path in ("", "/") and not (parts.query or parts.fragment or parts.username):
            return None
    return "expected '*' or an origin such as https://app.example.com"


def check_env_name(value: str) -> str | None:
    return None if _ENV_NAME.fullmatch(value) else "expected an environment variable name"


def check_label(value: str) -> str | None:
    name, sep, _ = value.partition("=")
    return None if sep and name and name == name.strip() else "expected name=value"


def check_dns_name(value: str) -> str | None:
    valid = len(value) <= 253 and _DNS_NAME.fullmatch(value) is not None
    return None if valid else "expected a DNS name such as worker-1.internal"


def check_schema(value: str) -> str | None:
    if not _SCHEMA.fullmatch(value):
        return "may contain only letters, digits, _ and the placeholder {shard}"
    return None


def check_schema_name(value: str) -> str | None:
    """The schema after ``{shard}`` was replaced, as Postgres will see it."""
    if not _SCHEMA.fullmatch(value) or SHARD_PLACEHOLDER in value:
        return "may contain only letters, digits and _"
    if len(value) > MAX_SCHEMA_LEN:
        return f"must be at most {MAX_SCHEMA_LEN} characters"
    return None


def check_not_empty(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


def check_token(value: str) -> str | None:
    """Short tokens can be guessed; whitespace or control characters cannot survive an HTTP header."""
    if len(value) < MIN_TOKEN_LEN:
        return f"must be at least {MIN_TOKEN_LEN} characters"
    if value != value.strip() or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "must not contain control characters or start or end with whitespace"
    return None


def _is_ip(text: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(text).version == version
    except ValueError:
        return False


# ------------------------------------------------------------------------- metadata used by model

# What every accepted value meets, where the check is more than one regular expression: a port at the
# end, an http(s) URL's scheme (in any case, and not necessarily first: urlsplit lowers the scheme and
# drops leading spaces), a name before "=", a character that is not a space.
_ENDS_WITH_PORT = {"pattern": ":[0-9]{1,5}$"}
HTTP_SCHEME = {"pattern": "[Hh][Tt][Tt][Pp][Ss]?://"}
_NOT_EMPTY = {"pattern": "\\S"}

NAME = checked(check_name, schema=matching(_NAME))
ADDRESS = checked(check_address, schema=_ENDS_WITH_PORT)
HTTP_URL = checked(check_http_url, schema=HTTP_SCHEME)
ORIGIN = checked(check_origin, schema={"pattern": "^\\*$|[Hh][Tt][Tt][Pp][Ss]?://"})
ENV_NAME = checked(check_env_name, schema=matching(_ENV_NAME))
LABEL = checked(check_label, schema={"pattern": "^[^=]+="})
DNS_NAME = checked(check_dns_name, schema={**matching(_DNS_NAME), "maxLength": 253})
SCHEMA = checked(check_schema, schema=matching(_SCHEMA))
NOT_EMPTY = checked(check_not_empty, schema=_NOT_EMPTY)
TOKEN = checked(check_token, secret=True, schema={"minLength": MIN_TOKEN_LEN})
SECRET_NOT_EMPTY = checked(check_not_empty, secret=True, schema=_NOT_EMPTY)
DURATION = above(0, YEAR_S)
DURATION_OR_ZERO = between(0, YEAR_S)
FRACTION = between(0, 1)
RESOLVED: Mapping[str, bool] = {RESOLVED_KEY: True}  # filled in by validation, not a key of the file
