"""The JSON Schema (draft 2020-12) of a configuration file, generated from its model.

The dataclasses of :mod:`cronoq.config.model` are what the reader checks a file against, and their
rules (:mod:`cronoq.config.rules`) what validation checks each value against; this module says the same
in JSON Schema, so that an editor can check a ``cronoq.yaml`` or ``cronoq.toml`` as it is typed. Nothing
is written twice: a key added to the model is in the schema, a range changed is changed there too, and
``docs/cronoq-config.schema.json`` is this module's output (a test fails when it is not).

Each table is an object of its keys, none other allowed (``additionalProperties: false``), with its
required keys; each key has its type, its allowed values or range, the pattern its check publishes, and
its default. Tables with a ``kind`` key are one ``$defs`` entry per kind, chosen by ``if``/``then`` on
``kind`` so that an editor reports the keys of the kind written rather than of every kind. What
involves more than one key (``min`` not above ``max``, every pool in one shard, exactly one of ``token``
and ``token_env``, the secrets set) is beyond the schema: ``--check`` says it.

Descriptions come from the reference documentation's tables of keys (``--docs``): its "meaning" column
for a key, and the paragraph under a table's heading for the table (and for a key holding that table
when no row describes it), so the editor shows what the documentation says, and the schema says
nothing the documentation does not.

``python -m cronoq.config.schema [--docs docs/configuration.md] [--output FILE]`` prints or writes it.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, Field, is_dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from .model import Config
from .reader import file_keys, required
from .rules import RULE, Check, Range

DIALECT = "https://json-schema.org/draft/2020-12/schema"
Schema = dict[str, Any]
# (table path, key) -> what the documentation says of it; (table path, "") -> of the table. A table path
# has no indices: "pools.retry" is the retry table of every [[pools]] entry.
Descriptions = Mapping[tuple[str, str], str]

_JSON_TYPES: dict[object, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


def config_schema(docs: str | None = None) -> Schema:
    """The schema of ``cronoq.toml`` / ``cronoq.yaml`` (servers and routers), described from ``docs``
    (the text of ``docs/configuration.md``) when given."""
    return model_schema(
        Config,
        title="cronoq configuration (cronoq-server, cronoq-router)",
        command="python -m cronoq.config.schema --docs docs/configuration.md",
        descriptions=doc_descriptions(docs) if docs is not None else {},
    )


def model_schema(model: type[Any], *, title: str, command: str, descriptions: Descriptions) -> Schema:
    """The schema of a file whose model is the dataclass ``model`` (read by
    :func:`cronoq.config.reader.read_text`); ``command`` is what makes it, named in the schema."""
    builder = _Builder(descriptions)
    root = builder.table(model, "")
    return {
        "$schema": DIALECT,
        "title": title,
        "$comment": f"Generated from the model by `{command}` (make schema): do not edit.",
        **root,
        "$defs": dict(sorted(builder.defs.items())),
    }


class _Builder:
    """Walks a model's dataclasses as :mod:`cronoq.config.reader` does, writing each as a ``$defs`` entry."""

    def __init__(self, descriptions: Descriptions) -> None:
        self.descriptions = descriptions
        self.defs: dict[str, Schema] = {}

    def table(self, cls: type[Any], where: str) -> Schema:
        """A table: its keys (``kind`` first, for a kind's table), required ones, no others."""
        kind: str | None = getattr(cls, "KIND", None)
        properties: Schema = {} if kind is None else {"kind": {"const": kind}}
        needed = [] if kind is None else ["kind"]
        for key, (spec, annotation) in file_keys(cls).items():
            properties[key] = {
                **(self._described(where, key) or self._described(_path(where, key), "")),
                **self.value(annotation, spec.metadata.get(RULE), _path(where, key)),
                **_default(spec),
            }
            if required(spec):
                needed.append(key)
        schema: Schema = {**self._described(where, ""), "type": "object", "properties": properties}
        if needed:
            schema["required"] = needed
        return {**schema, "additionalProperties": False}

    def value(self, annotation: Any, rule: object, where: str) -> Schema:
        """A value of ``annotation``'s type: ``rule`` applies to it, or to each item or entry of it."""
        origin = get_origin(annotation)
        if origin in (Union, UnionType):
            options = [a for a in get_args(annotation) if a is not type(None)]  # None: the key left out
            return self.value(options[0], rule, where) if len(options) == 1 else self._kinds(options, where)
        if origin is tuple:
            return {"type": "array", "items": self.value(get_args(annotation)[0], rule, where)}
        if origin is Mapping:
            return {
                "type": "object",
                "additionalProperties": self.value(get_args(annotation)[1], rule, where),
            }
        if isinstance(annotation, type) and is_dataclass(annotation):
            return self._ref(annotation, where)
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            return {"enum": [member.value for member in annotation]}
        return {"type": _JSON_TYPES[annotation], **_rule(rule)}

    def _kinds(self, variants: list[Any], where: str) -> Schema:
        """A table whose ``kind`` picks the table of that kind (see the module)."""
        return {
            "type": "object",
            "required": ["kind"],
            "properties": {
                "kind": {**self._described(where, "kind"), "enum": [variant.KIND for variant in variants]}
            },
            "allOf": [
                {
                    "if": {"required": ["kind"], "properties": {"kind": {"const": variant.KIND}}},
                    "then": self._ref(variant, where),
                }
                for variant in variants
            ],
        }

    def _ref(self, cls: type[Any], where: str) -> Schema:
        name = cls.__name__
        if name not in self.defs:
            self.defs[name] = self.table(cls, where)
        return {"$ref": f"#/$defs/{name}"}

    def _described(self, where: str, key: str) -> Schema:
        description = self.descriptions.get((where, key))
        return {} if description is None else {"description": description}


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _rule(rule: object) -> Schema:
    if isinstance(rule, Range):
        low = "exclusiveMinimum" if rule.low_open else "minimum"
        return {low: _number(rule.low), "maximum": _number(rule.high)}
    if isinstance(rule, Check):
        return dict(rule.schema)
    return {}


def _default(spec: Field[Any]) -> Schema:
    """The key's default, when JSON can write it (not None, which means "left out", nor a table)."""
    if spec.default is not MISSING:
        value = spec.default
    elif spec.default_factory is not MISSING:
        value = spec.default_factory()
    else:
        return {}
    written = _json(value)
    return {} if written is None else {"default": written}


def _json(value: object) -> object:
    """``value`` as JSON, or None when a default is not a plain value."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, tuple | list) and all(isinstance(item, str) for item in value):
        return list(value)
    if isinstance(value, Mapping) and not value:
        return {}
    return None


def _number(value: float) -> float:
    """An integral bound or default as an integer (``10``, not ``10.0``)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# ------------------------------------------------------------------------------ the documentation

_HEADING = re.compile(r"^#{1,6}\s")
_TABLE_NAME = re.compile(r"`\[\[?([A-Za-z0-9_.]+)\]\]?`")
_KEYS_OF = re.compile(r"^`([a-z_]+)` keys\b")  # "`retry` keys (all optional):" before a table
_CELL = re.compile(r"(?<!\\)\|")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")


def doc_descriptions(markdown: str) -> dict[tuple[str, str], str]:
    """What a reference page says of each key and table: the "meaning" of every row of its tables of
    keys (a table whose first column is "key"), and the paragraph right under a table's heading
    (``## `[server.tls]```). Rows of a heading name its table; rows under a "`retry` keys" line that
    table within it; a key written ``servers[].name`` is ``name`` of the table ``servers``."""
    found: dict[tuple[str, str], str] = {}
    table = where = ""
    lines = markdown.splitlines()
    code = False
    for index, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            code = not code
        elif code:
            continue
        elif _HEADING.match(line):
            named = _TABLE_NAME.search(line)
            table = where = named.group(1) if named else ""
            intro = _paragraph(lines[index + 1 :])
            if named and intro:
                found[(table, "")] = intro
        elif keys_of := _KEYS_OF.match(line):
            where = _path(table, keys_of.group(1))
        elif line.startswith("|") and _cells(line)[0] == "key" and "meaning" in _cells(line):
            found.update(_rows(lines[index + 2 :], where, _cells(line).index("meaning")))
    return found


def _rows(lines: Sequence[str], where: str, meaning: int) -> Iterator[tuple[tuple[str, str], str]]:
    for line in lines:
        if not line.startswith("|"):
            return
        cells = _cells(line)
        *tables, key = cells[0].strip("`").split("[].")
        if cells[meaning]:
            yield (_path(where, ".".join(tables)) if tables else where, key), _plain(cells[meaning])


def _paragraph(lines: Sequence[str]) -> str:
    """The first paragraph of ``lines`` (after blank lines), unless a table, list or code comes first."""
    text: list[str] = []
    for line in lines:
        if not line.strip():
            if text:
                break
            continue
        if not text and line.startswith(("|", "```", "-", "#")):
            return ""
        text.append(line.strip())
    return _plain(" ".join(text))


def _cells(line: str) -> list[str]:
    return [cell.strip().replace("\\|", "|") for cell in _CELL.split(line.strip())[1:-1]]


def _plain(text: str) -> str:
    """Markdown as an editor's tooltip shows it well: links as their text, no bold."""
    return _LINK.sub(r"\1", text).replace("**", "")


# ----------------------------------------------------------------------------------- command line


def cli(argv: Sequence[str] | None, build: Callable[[str | None], Schema], prog: str, what: str) -> int:
    """``prog [--docs FILE] [--output FILE]``: print (or write) the schema ``build`` makes."""
    parser = argparse.ArgumentParser(prog=prog, description=f"Print the JSON Schema of {what}.")
    parser.add_argument("--docs", type=Path, help="the reference page whose tables describe the keys")
    parser.add_argument("--output", type=Path, help="write the schema to this file instead of stdout")
    args = parser.parse_args(argv)
    docs = args.docs.read_text(encoding="utf-8") if args.docs else None
    text = dumps(build(docs))
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def dumps(schema: Schema) -> str:
    """The schema as the published file has it."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    return cli(argv, config_schema, "python -m cronoq.config.schema", "cronoq.toml / cronoq.yaml")


if __name__ == "__main__":
    sys.exit(main())
