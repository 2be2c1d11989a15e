"""The TypeScript SDK (``sdk/typescript``) built for the tests and the benchmarks, and its generated stubs.

``make sdk-typescript`` (which ``make test`` runs first) and the tests build it the same way, here:
``npm ci`` from the committed lockfile when ``node_modules`` is missing or older than the lockfile,
then ``tsc`` when a source is newer than the last build. Where node or npm is missing nothing is built
and :func:`sdk_dist` skips the test, saying why, so the summary shows it (``make test`` runs pytest
with ``-rs``).

``python -m tests.typescript`` builds; ``python -m tests.typescript proto`` regenerates the committed
stubs (``make sdk-typescript-proto``), which :func:`generate_stubs` also makes for the test that checks
them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SDK = REPO / "sdk" / "typescript"
DIST = SDK / "dist"
STUBS = Path("src") / "gen" / "cronoq" / "v1" / "cronoq.ts"  # in SDK
# ts-proto's options: grpc-js service definitions, uint64/int64 as bigint (task ids use all 64 bits), ESM
# imports with their .js suffix, and no JSON methods (the wire is binary).
TS_PROTO_OPTIONS = "outputServices=grpc-js,forceLong=bigint,esModuleInterop=true,importSuffix=.js,outputJsonMethods=false,env=node"
SOURCES = ("src", "test", "bench", "package.json", "tsconfig.json")


def missing_toolchain() -> str | None:
    """Why the SDK cannot be built here, or None when node (20 or later) and npm are installed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return "node and npm are not installed: the TypeScript SDK's tests need Node.js 20 or later"
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    major = int(version.lstrip("v").split(".")[0])
    if major < 20:
        return f"node {version} is installed: the TypeScript SDK needs Node.js 20 or later"
    return None


def _newest(paths: list[Path]) -> float:
    newest = 0.0
    for path in paths:
        files = path.rglob("*") if path.is_dir() else [path]
        newest = max([newest, *(f.stat().st_mtime for f in files if f.is_file())])
    return newest


def build() -> Path:
    """Installs the SDK's packages and compiles it when out of date; the ``dist`` folder."""
    installed = SDK / "node_modules" / ".package-lock.json"  # npm writes it on every install
    lockfile = SDK / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lockfile.stat().st_mtime:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--silent"], cwd=SDK, check=True)
    stamp = DIST / ".tsbuildinfo"
    if not stamp.exists() or stamp.stat().st_mtime < _newest([SDK / name for name in SOURCES]):
        subprocess.run(["npx", "--no-install", "tsc", "-p", "."], cwd=SDK, check=True)
        stamp.touch()  # tsc leaves it alone when nothing changed
    return DIST


def sdk_dist() -> Path:
    """The built SDK for a test, or ``pytest.skip`` with the reason it cannot be built here."""
    import pytest  # only the tests call this; make and the benchmarks do not load pytest

    reason = missing_toolchain()
    if reason is not None:
        pytest.skip(reason)
    return build()


def generate_stubs(out: Path) -> Path:
    """Generates the stubs from ``proto/cronoq/v1/cronoq.proto`` under ``out`` with protoc (the one
    grpcio-tools bundles) and ts-proto's plugin (installed by :func:`build`); the file written."""
    build()
    plugin = SDK / "node_modules" / ".bin" / "protoc-gen-ts_proto"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO / 'proto'}",
            f"--plugin=protoc-gen-ts_proto={plugin}",
            f"--ts_proto_out={out}",
            f"--ts_proto_opt={TS_PROTO_OPTIONS}",
            str(REPO / "proto" / "cronoq" / "v1" / "cronoq.proto"),
        ],
        check=True,
    )
    return out / STUBS.relative_to("src/gen")


def main(argv: list[str]) -> None:
    if argv == ["proto"]:
        generate_stubs(SDK / "src" / "gen")
        build()
    elif not argv:
        build()
    else:
        sys.exit("usage: python -m tests.typescript [proto]")


if __name__ == "__main__":
    main(sys.argv[1:])
