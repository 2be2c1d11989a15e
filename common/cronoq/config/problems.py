"""How configuration mistakes are reported.

An operator fixing a config file wants every mistake at once, each pointing at the key to change, so
reading and validation never stop at the first problem: they add :class:`Problem` entries (a key path
such as ``pools[1].lease_ttl_s`` and a message) to a :class:`Problems` collector, and one
:class:`ConfigError` carries them all at the end. Key paths are written the same way whatever the
file's syntax (TOML or YAML). A YAML parser tells where each key is, so a problem in a YAML file also
carries the line of its key (or of the nearest enclosing key the file has); TOML's parser does not.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from cronoq.errors import CronoqError

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
# The last step of a key path: ``.name``, ``."quoted name"`` or ``[index]``.
_LAST_STEP = re.compile(r'(\.[A-Za-z0-9_-]+|\."(?:[^"\\]|\\.)*"|\[[0-9]+\])$')


def key_path(parent: str, key: str) -> str:
    """``parent.key``, quoting the key the TOML way when it is not a bare key (tenant names, typos)."""
    name = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
    return f"{parent}.{name}" if parent else name


def _parent_path(path: str) -> str | None:
    """The path of the table or array holding ``path`` ("" for a top-level key); None for ""."""
    if not path:
        return None
    parent = _LAST_STEP.sub("", path, count=1)
    return "" if parent == path else parent


def type_name(value: object) -> str:
    """The name of a parsed value's type, for "expected X (got Y)" messages. TOML's names, whatever the
    syntax (a YAML mapping is a table, a sequence an array), so one message reads the same for both;
    ``null`` exists in YAML only."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    for kind, name in (
        (float, "float"),
        (str, "string"),
        (list, "array"),
        (dict, "table"),
        (datetime.datetime, "datetime"),
        (datetime.date, "date"),
        (datetime.time, "time"),
    ):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def show(value: object) -> str:
    """A value as a message quotes it: numbers plainly (``-1``, not ``-1.0``), strings quoted and cut."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if isinstance(value, int | float):
        text = str(value)
        return text if len(text) <= 30 else f"{text[:12]}...({len(text)} digits)"
    if isinstance(value, str):
        return repr(value if len(value) <= 80 else value[:77] + "...")
    return type_name(value)


@dataclass(frozen=True, slots=True)
class Problem:
    """One mistake: the key path it is about ("" for the file as a whole), what is wrong, and the line
    of the file the key is on, when the parser said (YAML only)."""

    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        if not self.path:
            return self.message
        where = self.path if self.line is None else f"{self.path} (line {self.line})"
        return f"{where}: {self.message}"


class ConfigError(CronoqError):
    """The configuration cannot be used; ``problems`` lists every mistake found."""

    def __init__(self, problems: Iterable[Problem], source: str = "<string>") -> None:
        self.problems = tuple(problems)
        self.source = source
        lines = "".join(f"\n  {problem}" for problem in self.problems)
        super().__init__(f"invalid configuration in {source}:{lines}")


class Problems:
    """Collects problems and remembers which key paths already failed.

    Checks that run later (ranges after types, cross-references after ranges) ask :meth:`failed` first,
    so a key reported once does not also produce a derived complaint ("min > max" about a ``max`` that
    was not even a number).
    """

    def __init__(self) -> None:
        self._items: list[Problem] = []
        self._paths: set[str] = set()
        self._lines: dict[str, int] = {}

    def locate(self, lines: dict[str, int]) -> None:
        """Where each key path is in the file (1-based lines), for the problems added from now on."""
        self._lines = lines

    def add(self, path: str, message: str) -> None:
        self._items.append(Problem(path, message, self._line(path)))
        self._paths.add(path)

    def _line(self, path: str) -> int | None:
        """The line of ``path``, or of the nearest table or array holding it that the file has: a key
        left out (``required``) or a rule about a whole entry still points into the file."""
        here: str | None = path
        while here:
            if here in self._lines:
                return self._lines[here]
            here = _parent_path(here)
        return None

    def mark(self, path: str) -> None:
        """Record that ``path`` holds a stand-in value, whose problem was reported under a sub-key."""
        self._paths.add(path)

    def failed(self, *paths: str) -> bool:
        """True when any of these paths, or a table or array that contains one, has a problem."""
        return any(
            path == bad or path.startswith((bad + ".", bad + "[")) for path in paths for bad in self._paths
        )

    def __bool__(self) -> bool:
        return bool(self._items)

    def error(self, source: str) -> ConfigError:
        """All problems, sorted by key path so the ones about one table or entry sit together."""
        return ConfigError(sorted(self._items, key=_path_order), source)


def _path_order(problem: Problem) -> tuple[str | int, ...]:
    """``pools[2]`` before ``pools[10]``: digit runs compare as numbers."""
    parts = re.split(r"([0-9]+)", problem.path)
    return tuple(int(part) if i % 2 else part for i, part in enumerate(parts))
