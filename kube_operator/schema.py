"""``python -m cronoq.operator.schema``: the JSON Schema of the operator's configuration file, made by the
server configuration's generator (:mod:`cronoq.config.schema`) from :class:`.config.OperatorConfig`;
``docs/cronoq-operator.schema.json`` is its output with ``--docs docs/operator.md``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cronoq.config.schema import Schema, cli, doc_descriptions, model_schema

from .config import OperatorConfig


def operator_schema(docs: str | None = None) -> Schema:
    """The schema of ``operator.toml`` / ``operator.yaml``, described from ``docs`` (the text of
    ``docs/operator.md``) when given."""
    return model_schema(
        OperatorConfig,
        title="cronoq-operator configuration",
        command="python -m cronoq.operator.schema --docs docs/operator.md",
        descriptions=doc_descriptions(docs) if docs is not None else {},
    )


def main(argv: Sequence[str] | None = None) -> int:
    return cli(argv, operator_schema, "python -m cronoq.operator.schema", "the operator's configuration")


if __name__ == "__main__":
    sys.exit(main())
