"""The container image as the repository declares it, read without a Docker engine.

:class:`Image` parses the ``Dockerfile`` (its stages and the instructions the tests rely on: ``COPY``,
``ENV``, ``ENTRYPOINT``, ``VOLUME``, ``EXPOSE``, ``USER``, ``LABEL``, ``WORKDIR``) and
:class:`DockerIgnore` applies ``.dockerignore`` with Docker's own matching rules, so the tests can
check the image statically, rebuild its build context exactly (:func:`stage_context`), and run its
programs on this machine (:func:`local_program`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = PurePosixPath("/opt/cronoq/bin")  # where the image installs every program (the contract)


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str  # upper case
    args: str  # continuation lines joined, comments inside them dropped
    line: int  # where it starts, 1-based


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions; comment lines (``#``, parser directives included) are skipped,
    also between continuation lines, as Docker does."""
    found: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not parts:
            start = number
        continued = stripped.endswith("\\")
        parts.append(stripped[:-1].strip() if continued else stripped)
        if not continued:
            keyword, _, args = " ".join(parts).partition(" ")
            found.append(Instruction(keyword.upper(), args.strip(), start))
            parts = []
    assert not parts, "the Dockerfile ends inside a continued instruction"
    return found


def _pairs(args: str) -> dict[str, str]:
    """``KEY=value`` pairs of ENV and LABEL (values may be quoted)."""
    pairs: dict[str, str] = {}
    for word in shlex.split(args):
        key, sep, value = word.partition("=")
        assert sep, f"only the KEY=value form is used, not {args!r}"
        pairs[key] = value
    return pairs


def _exec_form(args: str) -> list[str]:
    words = json.loads(args)
    assert isinstance(words, list) and all(isinstance(w, str) for w in words), args
    return words


@dataclass(frozen=True, slots=True)
class Copy:
    """One COPY: ``sources`` from the build context, or from stage ``source_stage``."""

    sources: tuple[str, ...]
    destination: str
    source_stage: str | None
    chown: str | None
    workdir: PurePosixPath  # the stage's working directory, which a relative destination is under

    def target(self, source: str) -> PurePosixPath:
        """Where ``source`` lands: a file into a destination ending in ``/`` by its name, else at the
        destination itself (a directory's contents go into it)."""
        dest = self.workdir / self.destination
        if self.destination.endswith("/") and not (REPO / source).is_dir():
            return dest / PurePosixPath(source).name
        return dest


@dataclass(slots=True)
class Stage:
    base: str
    name: str | None
    body: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.body if i.keyword == keyword]

    @property
    def env(self) -> dict[str, str]:
        """What the stage's ENV instructions set (a stage starts from its base image's environment)."""
        return {k: v for ins in self.all("ENV") for k, v in _pairs(ins.args).items()}

    def copies(self) -> list[Copy]:
        found: list[Copy] = []
        workdir = PurePosixPath("/")
        for ins in self.body:
            if ins.keyword == "WORKDIR":
                workdir = workdir / ins.args
            if ins.keyword != "COPY":
                continue
            words = shlex.split(ins.args)
            flags = {k: v for k, _, v in (w[2:].partition("=") for w in words if w.startswith("--"))}
            *sources, destination = [w for w in words if not w.startswith("--")]
            found.append(Copy(tuple(sources), destination, flags.get("from"), flags.get("chown"), workdir))
        return found

    def workdir(self) -> PurePosixPath:
        path = PurePosixPath("/")
        for ins in self.all("WORKDIR"):
            path = path / ins.args
        return path


@dataclass(slots=True)
class Image:
    """The Dockerfile's stages; the last one is the image."""

    stages: list[Stage]

    @classmethod
    def read(cls, path: Path = REPO / "Dockerfile") -> Image:
        stages: list[Stage] = []
        for ins in instructions(path.read_text()):
            if ins.keyword == "FROM":
                base, _, name = ins.args.partition(" AS ")
                stages.append(Stage(base.strip(), name.strip() or None))
            else:
                assert stages, f"line {ins.line}: {ins.keyword} before FROM"
                stages[-1].body.append(ins)
        return cls(stages)

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    @property
    def entrypoint(self) -> list[str]:
        (ins,) = self.final.all("ENTRYPOINT")
        return _exec_form(ins.args)

    @property
    def env(self) -> dict[str, str]:
        return self.final.env

    @property
    def labels(self) -> dict[str, str]:
        return {k: v for ins in self.final.all("LABEL") for k, v in _pairs(ins.args).items()}

    @property
    def volumes(self) -> list[str]:
        return [v for ins in self.final.all("VOLUME") for v in _exec_form(ins.args)]

    @property
    def exposed(self) -> list[int]:
        return [int(p) for ins in self.final.all("EXPOSE") for p in ins.args.split()]

    @property
    def user(self) -> str:
        return self.final.all("USER")[-1].args

    @property
    def workdir(self) -> PurePosixPath:
        return self.final.workdir()


def local_program(path: str) -> str:
    """The program on this machine that ``path`` in the image is: the image installs the project in a
    venv at ``/opt/cronoq``, this checkout in ``.venv``, with the same console scripts and interpreter."""
    program = PurePosixPath(path)
    assert program.parent == VENV_BIN, f"{path} is not a program of the image's venv ({VENV_BIN})"
    local = Path(sys.executable).parent / program.name
    assert local.exists(), f"{path}: no {program.name} in {local.parent}"
    return str(local)


# --- .dockerignore -------------------------------------------------------------------------------------


def _pattern(text: str) -> re.Pattern[str]:
    """Docker's translation of one pattern (moby/patternmatcher): ``*`` and ``?`` stay within one path
    element, ``**`` spans any number of them, ``[...]`` is a character class."""
    pattern = str(PurePosixPath(text.lstrip("/")))
    out = ""
    in_class = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        i += 1
        if in_class:
            in_class = ch != "]"
            out += ch
        elif ch == "[":
            in_class = True
            out += "["
            if pattern.startswith("!", i):  # [!abc]: none of them
                out += "^"
                i += 1
        elif ch == "*" and pattern.startswith("*", i):  # "**", and "**/": any number of path elements
            i += 2 if pattern.startswith("*/", i) else 1
            out += ".*" if i >= len(pattern) else "(.*/)?"
        elif ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        else:
            out += re.escape(ch)
    return re.compile(f"^{out}$")


@dataclass(slots=True)
class DockerIgnore:
    """``.dockerignore``'s patterns, in order; ``!pattern`` re-includes."""

    patterns: list[tuple[bool, re.Pattern[str]]]

    @classmethod
    def read(cls, path: Path = REPO / ".dockerignore") -> DockerIgnore:
        patterns: list[tuple[bool, re.Pattern[str]]] = []
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            patterns.append((negated, _pattern(line[1:].strip() if negated else line)))
        return cls(patterns)

    def excludes(self, path: str) -> bool:
        """Whether ``path`` (relative to the context) stays out of it: the last pattern matching the
        path or one of its parent directories decides, as Docker decides."""
        parts = PurePosixPath(path).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        excluded = False
        for negated, regex in self.patterns:
            if any(regex.match(p) for p in prefixes):
                excluded = not negated
        return excluded

    def context(self, root: Path = REPO) -> Iterator[str]:
        """Every file of the build context ``docker build`` would send, relative to ``root``."""
        can_reinclude = any(negated for negated, _ in self.patterns)
        for directory, dirs, files in os.walk(root):
            rel = Path(directory).relative_to(root)
            if not can_reinclude:
                dirs[:] = [d for d in dirs if not self.excludes((rel / d).as_posix())]
            for name in files:
                path = (rel / name).as_posix()
                if not self.excludes(path):
                    yield path


def stage_context(image: Image, stage: Stage, into: Path) -> None:
    """Lay out under ``into`` (standing for ``/``) what ``stage``'s COPY instructions take from the
    build context, as Docker would: only context files, each where its COPY puts it."""
    context = sorted(DockerIgnore.read().context())
    for copy in stage.copies():
        assert copy.source_stage is None, "a build stage that copies from another stage"
        for source in copy.sources:
            target = into / copy.target(source).relative_to("/")
            if (REPO / source).is_dir():
                for path in (p for p in context if p.startswith(f"{source}/")):
                    (target / path[len(source) + 1 :]).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(REPO / path, target / path[len(source) + 1 :])
            else:
                assert source in context, f"COPY {source}: not in the build context"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / source, target)
