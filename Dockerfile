# The cronoq container image: cronoq-server (the entrypoint), cronoq-router, cronoq-operator and the
# cronoq CLI on a distroless Python, running as a non-root user, with no shell and no package manager.
#
#   docker build -t cronoq .
#   docker run --rm -v $PWD/cronoq.toml:/c.toml:ro cronoq --config /c.toml --check
#
# docs/containers.md describes the image: its environment, volume, ports and read-only root.

# --- build: a venv at /opt/cronoq, made by Debian 13's own Python 3.13 ------------------------------
# The final stage is distroless Debian 13, whose interpreter is /usr/bin/python3 (3.13) too: a venv
# made here links to that path, and its scripts' shebangs (#!/opt/cronoq/bin/python3) resolve there.
# (Not Debian 12: distroless stopped building python3-debian12 in 2026, so it gets no security fixes.)
FROM debian:13-slim AS build

# Unpinned on purpose: this stage never ships, Debian 13 keeps these packages on Python 3.13, and a
# pinned point version stops building whenever Debian replaces it with a security update. The C
# compiler, the C library's headers and Python's headers are for mypyc, which compiles the engine.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# The image ships the compiled engine (setup.py): fail the build rather than fall back to the sources.
ENV CRONOQ_COMPILE=1

WORKDIR /src
# What `pip wheel` needs: the project metadata (pyproject.toml names README.md as the long
# description), the build hook that compiles the engine, and every folder [tool.setuptools]
# package-dir maps to a package.
COPY pyproject.toml setup.py README.md ./
COPY common ./common
COPY proto ./proto
COPY shard ./shard
COPY router ./router
COPY kube_operator ./kube_operator

# Build the wheel (pip fetches setuptools and mypy, whose mypyc compiles the engine, into an isolated
# build environment), install it and its dependencies (binary wheels: grpcio, protobuf, psycopg[binary])
# into the venv, drop pip and setuptools (not needed at run time), then compile the byte-code once,
# here: unchecked-hash .pyc files are used as they are, whatever the sources' timestamps, so the running
# server never has to write byte-code (it could not: PYTHONDONTWRITEBYTECODE below, and a read-only
# root filesystem).
RUN python3 -m venv /opt/cronoq \
    && /opt/cronoq/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src \
    && /opt/cronoq/bin/pip install --no-cache-dir --no-compile /wheels/cronoq-*.whl \
    && /opt/cronoq/bin/pip uninstall --yes setuptools pip \
    && /opt/cronoq/bin/python3 -m compileall -q --invalidation-mode unchecked-hash /opt/cronoq/lib \
    && mkdir -p /rootfs/var/lib/cronoq

# --- runtime ----------------------------------------------------------------------------------------
FROM gcr.io/distroless/python3-debian13:nonroot

LABEL org.opencontainers.image.title="cronoq" \
      org.opencontainers.image.description="A task scheduler with remote workers: cronoq-server, cronoq-router, cronoq-operator and the cronoq CLI." \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="gcr.io/distroless/python3-debian13:nonroot"

COPY --from=build /opt/cronoq /opt/cronoq
# The state volume's mount point (made in the build stage: distroless has no mkdir), owned by the
# runtime user so SQLite can create its files there; a fresh named volume takes this ownership.
COPY --from=build --chown=65532:65532 /rootfs/var/lib/cronoq /var/lib/cronoq
COPY deploy/image/cronoq.toml /etc/cronoq/cronoq.toml

# CRONOQ_CONFIG: the configuration cronoq-server and cronoq-router read unless --config names another.
# PYTHONDONTWRITEBYTECODE: never write .pyc at run time (they were compiled at build time).
# PYTHONUNBUFFERED: log lines reach `docker logs` at once.
# SSL_CERT_FILE: the public roots distroless ships, for `sslrootcert=system` in a Postgres URL.
# psycopg-binary brings its own OpenSSL, which otherwise looks for them under /usr/lib/psycopg-openssl/
# (absent here), so verify-full against a database with a publicly signed certificate would fail.
ENV CRONOQ_CONFIG=/etc/cronoq/cronoq.toml \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

# The only place the server writes (SQLite state); everything else may be mounted read-only.
VOLUME ["/var/lib/cronoq"]
WORKDIR /var/lib/cronoq
USER 65532:65532
# gRPC (Tasks, Workers, Admin, health), then HTTP (JSON API, /metrics, /healthz, /readyz).
EXPOSE 7070 7071

# The server by default; another program is `--entrypoint /opt/cronoq/bin/cronoq-router` (Compose:
# entrypoint, Kubernetes: command). Arguments are the server's: --config, --check, --shard, ...
ENTRYPOINT ["/opt/cronoq/bin/cronoq-server"]
