"""From a file's text (TOML or YAML) to :class:`~cronoq.config.model.Config`, checking keys and types only.

The dataclasses of :mod:`cronoq.config.model` are the schema, so this module has no per-key code: it
walks the field annotations. Ranges and cross-references are left to :mod:`cronoq.config.validate`,
because command-line overrides (``--shard``, ``--insecure-no-auth``) must be applied in between, as the
reference server does (read, override, validate).

A key with a wrong type is reported and replaced by a placeholder, and an array entry that is not a table
by a placeholder entry, so reading carries on, later checks see the same indices as the file, and one
run reports every mistake. Checks skip paths that already failed (:meth:`Problems.failed`), and so does
reading: a YAML value that :mod:`cronoq.config.syntax` already reported (an unsupported tag, a bad alias)
is not reported again, nor as a missing key.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Mapping
from dataclasses import MISSING, Field, fields, is_dataclass
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from .problems import Problems, key_path, show, type_name
from .rules import RESOLVED_KEY
from .syntax import Syntax, parse_document

T = TypeVar("T")

_BAD = object()  # returned by a conversion that reported a problem

# Scalar annotation -> (what a message says is expected, the parsed types accepted for it).
_SCALARS: dict[object, tuple[str, type | tuple[type, ...]]] = {
    bool: ("true or false", bool),
    int: ("an integer", int),
    float: ("a number", (int, float)),
    str: ("a string", str),
}


def read_text(cls: type[T], text: str, syntax: Syntax, problems: Problems) -> T | None:
    """The file ``text`` as the dataclass ``cls`` (a whole configuration file), or None when it is not
    ``syntax`` at all (the problem is then in ``problems``)."""
    document = parse_document(text, syntax, problems)
    return None if document is None else read_table(cls, document, "", problems)


def read_table(cls: type[T], table: Mapping[str, object], path: str, problems: Problems, kind: str = "") -> T:
    """An instance of the dataclass ``cls`` from a table; ``kind`` names the variant in messages."""
    schema = file_keys(cls)
    values: dict[str, object] = {}
    for key, value in table.items():
        here = key_path(path, key)
        if key not in schema:
            problems.add(here, _unknown_key(key, schema, kind))
            continue
        converted = _convert(schema[key][1], value, here, problems)
        if converted is _BAD:
            problems.mark(here)
        else:
            values[key] = converted
    for name, (spec, annotation) in schema.items():
        if name not in values and required(spec):
            if name not in table:
                problems.add(key_path(path, name), "required")
            values[name] = _placeholder(annotation)
    return cls(**values)


def file_keys(cls: type[Any]) -> dict[str, tuple[Field[Any], Any]]:
    """Key -> (dataclass field, resolved annotation) for the keys a file may set in this table."""
    hints = get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in fields(cls) if not f.metadata.get(RESOLVED_KEY)}


def required(spec: Field[Any]) -> bool:
    return spec.default is MISSING and spec.default_factory is MISSING


def _unknown_key(key: str, schema: Mapping[str, object], kind: str) -> str:
    message = f"unknown key for {kind}" if kind else "unknown key"
    close = difflib.get_close_matches(key, list(schema), n=1)
    return f"{message} (did you mean {close[0]}?)" if close else message


def _convert(annotation: Any, value: object, path: str, problems: Problems) -> object:
    """``value`` as the annotation's Python type, or ``_BAD`` after reporting why it is not one (or
    when that was reported already)."""
    if problems.failed(path):
        return _BAD
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        if len(options) == 1:
            return _convert(options[0], value, path, problems)
        return _read_variant(options, value, path, problems)
    if origin is tuple:
        return _read_array(get_args(annotation)[0], value, path, problems)
    if origin is Mapping:
        return _read_mapping(get_args(annotation)[1], value, path, problems)
    if isinstance(annotation, type) and is_dataclass(annotation):
        if not isinstance(value, dict):
            problems.add(path, f"expected a table (got {type_name(value)})")
            return _BAD
        return read_table(annotation, value, path, problems)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _read_enum(annotation, value, path, problems)
    return _read_scalar(annotation, value, path, problems)


def _read_scalar(annotation: object, value: object, path: str, problems: Problems) -> object:
    expected, accepted = _SCALARS[annotation]
    if isinstance(value, bool) != (annotation is bool) or not isinstance(value, accepted):
        problems.add(path, f"expected {expected} (got {type_name(value)})")
        return _BAD
    if annotation is float and isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # tomllib integers are unbounded; left as is for the range check
            return value
    return value


def _read_enum(annotation: type[enum.Enum], value: object, path: str, problems: Problems) -> object:
    allowed = [member.value for member in annotation]
    if not isinstance(value, str) or value not in allowed:
        problems.add(path, f"must be one of {', '.join(allowed)} (got {show(value)})")
        return _BAD
    return annotation(value)


def _read_array(item: Any, value: object, path: str, problems: Problems) -> object:
    if not isinstance(value, list):
        what = "an array of tables" if _is_table(item) else "an array"
        problems.add(path, f"expected {what} (got {type_name(value)})")
        return _BAD
    items = []
    for index, entry in enumerate(value):
        here = f"{path}[{index}]"
        converted = _convert(item, entry, here, problems)
        if converted is _BAD:
            problems.mark(here)
            converted = _placeholder(item)
        items.append(converted)
    return tuple(items)


def _read_mapping(item: Any, value: object, path: str, problems: Problems) -> object:
    if not isinstance(value, dict):
        problems.add(path, f"expected a table (got {type_name(value)})")
        return _BAD
    entries = {}
    for key, entry in value.items():
        converted = _convert(item, entry, key_path(path, key), problems)
        if converted is not _BAD:
            entries[key] = converted
    return entries


def _read_variant(variants: list[Any], value: object, path: str, problems: Problems) -> object:
    """A table whose ``kind`` key picks the dataclass that reads the rest of it."""
    if not isinstance(value, dict):
        problems.add(path, f"expected a table (got {type_name(value)})")
        return _BAD
    by_kind = {variant.KIND: variant for variant in variants}
    kind = value.get("kind")
    chosen = by_kind.get(kind) if isinstance(kind, str) else None
    if chosen is None and problems.failed(key_path(path, "kind")):
        return _BAD
    if chosen is None:
        allowed = ", ".join(by_kind)
        message = (
            f"required: one of {allowed}" if kind is None else f"must be one of {allowed} (got {show(kind)})"
        )
        problems.add(key_path(path, "kind"), message)
        return _BAD
    rest = {key: entry for key, entry in value.items() if key != "kind"}
    return read_table(chosen, rest, path, problems, kind=f'kind = "{kind}"')


def _is_table(annotation: Any) -> bool:
    return is_dataclass(annotation) or get_origin(annotation) in (Union, UnionType)


def _placeholder(annotation: Any) -> object:
    """A stand-in of the right type for a value that was missing or wrong (never seen by callers)."""
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        return _placeholder(get_args(annotation)[0])
    if origin is tuple:
        return ()
    if isinstance(annotation, type) and is_dataclass(annotation):
        return annotation(
            **{
                name: _placeholder(hint)
                for name, (spec, hint) in file_keys(annotation).items()
                if required(spec)
            }
        )
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return next(iter(annotation))
    return annotation()
