"""TOML or YAML: from a configuration file's text to the plain document the reader checks.

Both syntaxes describe the same document (tables of keys, arrays, scalars), read by the same code
(:mod:`cronoq.config.reader`) with the same checks and messages. A file's syntax comes from its name
(``.toml``, ``.yaml`` or ``.yml``); any other name is refused rather than guessed, since a guess turns
a YAML file read as TOML into a page of misleading syntax errors.

YAML is read with PyYAML's safe loader, which builds only plain values (never a Python object named
by a tag), and its nodes are turned into the document here rather than by ``yaml.safe_load``, so
that a problem names its key and line: a key that is not a string (``on:``, ``1:``), a key given twice
(PyYAML would silently keep the last), a tag other than the plain types, an alias that contains itself
or expands past :data:`MAX_VALUES`, or nesting past :data:`MAX_DEPTH`. The line of every key and array
entry goes to :meth:`Problems.locate`, so later checks report it too. One departure from YAML 1.1, which
wants a dot and a signed exponent (``1.0e+3``): numbers in exponent notation (``1e3``, ``3.2e7``,
``1e+06`` as Helm writes large numbers) are numbers, as in YAML 1.2, JSON and TOML, not strings.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Literal

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .problems import ConfigError, Problem, Problems, key_path, type_name

Syntax = Literal["toml", "yaml"]
SYNTAXES: dict[str, Syntax] = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}

# Bounds on what a YAML document may make the reader build. A configuration has hundreds of values and
# is four levels deep; aliases can make a short file expand exponentially ("billion laughs").
MAX_VALUES = 1_000_000
MAX_DEPTH = 32

_TAG = "tag:yaml.org,2002:"
_MAP, _SEQ, _STR, _MERGE = _TAG + "map", _TAG + "seq", _TAG + "str", _TAG + "merge"
# The scalar types a configuration value can have (the rest are refused, see _Reader.value).
_SCALARS = frozenset(_TAG + name for name in ("str", "int", "float", "bool", "null", "timestamp"))


def syntax_of(path: str | os.PathLike[str]) -> Syntax:
    """The syntax a configuration file is written in, from its extension (in any case)."""
    syntax = SYNTAXES.get(Path(path).suffix.lower())
    if syntax is None:
        names = (
            f"{' or '.join(ext for ext, of in SYNTAXES.items() if of == known)} ({known.upper()})"
            for known in dict.fromkeys(SYNTAXES.values())
        )
        message = f"cannot tell the syntax from the file name: expected it to end in {', '.join(names)}"
        raise ConfigError([Problem("", message)], os.fspath(path))
    return syntax


def read_file(path: str | os.PathLike[str]) -> tuple[str, Syntax]:
    """A configuration file's text (UTF-8; a byte-order mark left by some editors is ignored) and syntax."""
    syntax = syntax_of(path)
    try:
        return Path(path).read_text(encoding="utf-8-sig"), syntax
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Problem("", f"cannot read the configuration: {exc}")], os.fspath(path)) from exc


def parse_document(text: str, syntax: Syntax, problems: Problems) -> dict[str, object] | None:
    """The document in ``text``, or None when it is not ``syntax`` at all (the problem is then in
    ``problems``). A YAML document's lines are given to ``problems``; its mistakes below the top are
    reported there, and their values left as None under paths :meth:`Problems.failed` knows."""
    if syntax == "toml":
        try:
            return tomllib.loads(text)
        except (tomllib.TOMLDecodeError, ValueError) as exc:  # ValueError: an integer of > 4300 digits
            problems.add("", f"not valid TOML: {exc}")
            return None
    if syntax != "yaml":
        raise ValueError(f"unknown configuration syntax {syntax!r}: expected toml or yaml")
    return _read_yaml(text, problems)


# -------------------------------------------------------------------------------------------- YAML


class _Loader(yaml.SafeLoader):
    """The safe loader, with YAML 1.2's numbers in exponent notation (see the module)."""


_Loader.add_implicit_resolver(
    _TAG + "float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


class _TooLarge(Exception):
    """The document expands to more than MAX_VALUES values; reading stops."""


def _read_yaml(text: str, problems: Problems) -> dict[str, object] | None:
    try:
        loader = _Loader(text)  # refuses characters YAML does not allow at once
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        problems.add("", f"not valid YAML: {_yaml_error(exc)}")
        return None
    except RecursionError:  # PyYAML composes nested collections recursively
        problems.add("", f"not valid YAML: nested more than {MAX_DEPTH} levels deep")
        return None
    if root is None or (isinstance(root, ScalarNode) and root.tag == _TAG + "null"):
        return {}  # an empty file (or only comments), as an empty TOML file: every default
    reader = _Reader(loader, problems)
    problems.locate(reader.lines)  # filled as the document is read, for every problem from here on
    if not (isinstance(root, MappingNode) and root.tag == _MAP):
        problems.add("", f"expected a mapping of keys at the top of the file (got {reader.kind(root)})")
        return None
    try:
        document = reader.mapping(root, "", ())
    except _TooLarge:
        problems.add(
            "", f"more than {MAX_VALUES} values: a YAML alias (*name) repeats its anchor's values each time"
        )
        return None
    return document


Pairs = list[tuple[Node, Node]]
_SHAPES = {MappingNode: "a mapping", SequenceNode: "a sequence", ScalarNode: "a scalar"}


class _Reader:
    """Builds the document from YAML nodes, recording the line of every key path."""

    def __init__(self, loader: _Loader, problems: Problems) -> None:
        self.loader = loader
        self.problems = problems
        self.lines: dict[str, int] = {}
        self.count = 0

    def value(self, node: Node, path: str, within: tuple[Node, ...]) -> object:
        """The value of ``node`` at ``path``, or None after reporting why it has none. ``within`` are
        the collections holding it, so that an alias to one of them is caught."""
        self._spend(1)
        if any(node is outer for outer in within):
            self._fail(path, "an alias (*name) of a mapping or sequence that contains it")
            return None
        if len(within) >= MAX_DEPTH:
            self._fail(path, f"nested more than {MAX_DEPTH} levels deep")
            return None
        if isinstance(node, MappingNode) and node.tag == _MAP:
            return self.mapping(node, path, within)
        if isinstance(node, SequenceNode) and node.tag == _SEQ:
            inside = (*within, node)
            return [
                self.value(item, self._at(f"{path}[{index}]", item), inside)
                for index, item in enumerate(node.value)
            ]
        if isinstance(node, ScalarNode) and node.tag in _SCALARS:
            try:
                return self.loader.construct_object(node)
            except (yaml.YAMLError, ValueError, OverflowError) as exc:  # e.g. the date 2024-02-30
                self._fail(path, f"not a valid {node.tag.removeprefix(_TAG)}: {exc}")
                return None
        tag = node.tag.replace(_TAG, "!!")
        if node.tag in _SCALARS or node.tag in (_MAP, _SEQ):  # a plain type's tag on another shape
            self._fail(path, f"the YAML tag {tag} does not fit {_SHAPES[type(node)]}")
        else:
            self._fail(
                path,
                f"the YAML tag {tag} is not supported: use plain strings, numbers, booleans, mappings "
                "and sequences",
            )
        return None

    def mapping(self, node: MappingNode, path: str, within: tuple[Node, ...]) -> dict[str, object]:
        """A mapping's entries: its own, then those its merge keys (``<<: *base``) bring in that it
        does not set itself. A key written twice in the mapping itself is a mistake (PyYAML would keep
        the last silently; TOML refuses it too)."""
        chosen: dict[str, Node] = {}
        for key_node, value_node in node.value:
            key = None if key_node.tag == _MERGE else self._key(key_node, path)
            if key is None:
                continue
            here = key_path(path, key)
            earlier = self.lines.get(here)
            self.lines[here] = key_node.start_mark.line + 1
            if key in chosen:
                self.problems.add(here, f"duplicate key (also on line {earlier})")
            chosen[key] = value_node
        inside = (*within, node)
        for key_node, value_node in self._merged(node, path, inside):
            key = self._key(key_node, path)
            if key is not None and key not in chosen:
                self._at(key_path(path, key), key_node)
                chosen[key] = value_node
        return {key: self.value(value, key_path(path, key), inside) for key, value in chosen.items()}

    def _merged(self, node: MappingNode, path: str, within: tuple[Node, ...]) -> Pairs:
        """The key and value nodes a mapping's merge keys bring in, those that take precedence first:
        each merged mapping's own, then what its merge keys bring in; an earlier mapping before a later
        one (the order of the YAML merge key)."""
        pairs: Pairs = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE:
                continue
            for source in value_node.value if isinstance(value_node, SequenceNode) else [value_node]:
                if not (isinstance(source, MappingNode) and source.tag == _MAP):
                    self._fail(path, f"<< merges mappings only (got {self.kind(source)})")
                elif any(source is outer for outer in within):
                    self._fail(path, "<< merges a mapping that contains it")
                elif len(within) >= MAX_DEPTH:
                    self._fail(path, f"<< merges mappings nested more than {MAX_DEPTH} levels deep")
                else:
                    self._spend(len(source.value))
                    pairs += [(key, value) for key, value in source.value if key.tag != _MERGE]
                    pairs += self._merged(source, path, (*within, source))
        return pairs

    def _key(self, node: Node, path: str) -> str | None:
        """A key's string, or None for one that is not a string (reported under its text) or ``<<``."""
        if isinstance(node, ScalarNode) and node.tag == _STR:
            return str(node.value)
        if node.tag != _MERGE:
            text = str(node.value) if isinstance(node, ScalarNode) else "?"
            self._fail(
                self._at(key_path(path, text), node),
                f"keys must be strings (got {self.kind(node)}): quote it",
            )
        return None

    def kind(self, node: Node) -> str:
        """What a node holds, as "(got ...)" says it."""
        if isinstance(node, MappingNode):
            return "table"
        if isinstance(node, SequenceNode):
            return "array"
        if node.tag in _SCALARS:
            try:
                return type_name(self.loader.construct_object(node))
            except (yaml.YAMLError, ValueError, OverflowError):
                pass
        return node.tag.replace(_TAG, "!!")

    def _spend(self, values: int) -> None:
        """Count values about to be built (aliases and merges build theirs again at each use)."""
        self.count += values
        if self.count > MAX_VALUES:
            raise _TooLarge

    def _at(self, path: str, node: Node) -> str:
        """``path``, after noting the line its key (or array entry) starts on, if none was noted."""
        self.lines.setdefault(path, node.start_mark.line + 1)
        return path

    def _fail(self, path: str, message: str) -> None:
        """Report ``message`` at ``path`` unless a problem is already there (a value reached twice)."""
        if not self.problems.failed(path):
            self.problems.add(path, message)


def _yaml_error(exc: yaml.YAMLError) -> str:
    """PyYAML's error as tomllib words its own: what is wrong, then where (lines counted from 1)."""
    if isinstance(exc, yaml.reader.ReaderError):
        return f"unacceptable character #x{exc.character:04x}: {exc.reason} (at character {exc.position + 1})"
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc)
    mark = exc.problem_mark or exc.context_mark
    what = ", ".join(part for part in (exc.context, exc.problem) if part) or "invalid document"
    return what if mark is None else f"{what} (at line {mark.line + 1}, column {mark.column + 1})"
