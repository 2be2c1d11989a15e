"""``compose/compose.yaml`` as Docker Compose reads it, without a Docker engine.

:func:`load_raw` gives the YAML as written (anchors and merge keys resolved, ``${...}`` untouched), for
the schema; :class:`Project` the same with every ``${VAR}`` interpolated from ``compose/.env`` (and
only from it, so the tests do not depend on the shell that runs them), for everything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from .compose_image import REPO

COMPOSE_DIR = REPO / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"

# $$ (a literal $), ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}, $NAME
_VARIABLE = re.compile(
    r"\$(?:(?P<dollar>\$)|\{(?P<braced>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>\w+))"
)


def read_env_file(path: Path = COMPOSE_DIR / ".env") -> dict[str, str]:
    """``KEY=value`` lines; blank lines and ``#`` comments skipped."""
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path}: not KEY=value: {raw!r}"
            values[key.strip()] = value.strip()
    return values


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable substitution; a ``?`` variable that is unset fails, naming it."""

    def one(match: re.Match[str]) -> str:
        if match["dollar"]:
            return "$"
        name = match["braced"] or match["bare"]
        value = env.get(name)
        op, arg = match["op"] or "", match["arg"] or ""
        missing = value is None or (op.startswith(":") and value == "")
        if op.endswith("?") and missing:
            raise KeyError(f"{name}: {arg}")
        if op.endswith("-") and missing:
            return arg
        return value or ""

    return _VARIABLE.sub(one, text)


def _interpolated(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolated(v, env) for v in node]
    if isinstance(node, dict):
        return {k: _interpolated(v, env) for k, v in node.items()}
    return node


def load_raw(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict)
    return document


@dataclass(frozen=True, slots=True)
class Mount:
    """A file or directory a service sees at ``target``: a config, a bind mount (``source`` is a host
    path) or a named volume (``source`` is None)."""

    target: PurePosixPath
    source: Path | None
    volume: str | None = None


@dataclass(slots=True)
class Service:
    name: str
    spec: dict[str, Any]

    @property
    def image(self) -> str | None:
        return self.spec.get("image")

    @property
    def environment(self) -> dict[str, str]:
        env = self.spec.get("environment", {})
        if isinstance(env, list):  # ["KEY=value", ...]
            env = dict(item.partition("=")[::2] for item in env)
        return {str(k): str(v) for k, v in env.items()}

    @property
    def depends_on(self) -> dict[str, str]:
        """Each dependency and the condition Compose waits for."""
        deps = self.spec.get("depends_on", {})
        if isinstance(deps, list):
            return dict.fromkeys(deps, "service_started")
        return {name: spec.get("condition", "service_started") for name, spec in deps.items()}

    @property
    def aliases(self) -> list[str]:
        networks = self.spec.get("networks", {})
        if isinstance(networks, list):
            return []
        return [alias for net in networks.values() for alias in (net or {}).get("aliases", [])]

    @property
    def healthcheck(self) -> list[str] | None:
        check = self.spec.get("healthcheck")
        return None if check is None else list(check["test"])


@dataclass(slots=True)
class Project:
    """The interpolated Compose file; relative paths in it are relative to its folder."""

    document: dict[str, Any]
    directory: Path = COMPOSE_DIR

    @classmethod
    def load(cls, path: Path = COMPOSE_FILE) -> Project:
        return cls(_interpolated(load_raw(path), read_env_file(path.parent / ".env")), path.parent)

    @property
    def services(self) -> dict[str, Service]:
        return {name: Service(name, spec) for name, spec in self.document["services"].items()}

    def path(self, relative: str) -> Path:
        return (self.directory / relative).resolve()

    def mounts(self, service: Service) -> list[Mount]:
        """The service's configs and volumes, with the host path each comes from."""
        found: list[Mount] = []
        for config in service.spec.get("configs", []):
            file = self.document["configs"][config["source"]]["file"]
            found.append(Mount(PurePosixPath(config["target"]), self.path(file)))
        for volume in service.spec.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith((".", "/")):
                found.append(Mount(PurePosixPath(target), self.path(source)))
            else:
                found.append(Mount(PurePosixPath(target), None, volume=source))
        return found
