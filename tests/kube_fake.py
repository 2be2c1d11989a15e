"""A fake Kubernetes API server for the operator's tests, run as its own process:

    python -m tests.kube_fake --port PORT [--cert PEM --key PEM] [--page-size N]

with the bearer token it accepts in ``KUBE_FAKE_TOKEN``. It keeps ``CronoqWorkerScaler`` resources and
Deployments in memory and serves what the operator uses, the way the API server does: lists (cluster-wide
and per namespace, paged with ``limit``/``continue``) and watches of scalers (``?watch=1`` from a
``resourceVersion``: one JSON line per ``ADDED``, ``MODIFIED`` or ``DELETED``, an ``ERROR`` with a 410
``Status`` when the version is older than what the fake still remembers, ended after ``timeoutSeconds``),
the ``status`` subresource of scalers (only the status changes; merge patches only), the ``scale``
subresource of Deployments (``autoscaling/v1``, ``replicas`` omitted when 0, a ``resourceVersion`` in a
patch is a precondition: 409 when stale), ``coordination.k8s.io/v1`` Leases (create, get, replace with
the ``resourceVersion`` as precondition) and ``core/v1`` Events (create, list). Tests create and change
objects through the same API. Every request with a valid token is recorded, and ``GET /_fake/requests``
returns them (method, path, user agent), so a test can tell what the operator did and did not do;
``POST /_fake/compact`` forgets the change history (a watch resumed from before gets 410) and
``POST /_fake/close-watches`` ends every open watch, as an API server restart does. ``GET /_fake/ready``
needs no token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.ports import free_port

SCALERS = "/apis/cronoq.io/v1alpha1"
APPS = "/apis/apps/v1"
LEASES = "/apis/coordination.k8s.io/v1"
MERGE_PATCH = "application/merge-patch+json"
# What the API server's query parameters take as true (Go's strconv.ParseBool).
GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")

Objects = dict[tuple[str, str], dict[str, Any]]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def status(code: int, message: str) -> web.Response:
    """A ``Status`` object, as the API server explains a refusal."""
    reason = {
        401: "Unauthorized",
        404: "NotFound",
        409: "Conflict",
        410: "Expired",
        415: "UnsupportedMediaType",
    }.get(code, "")
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


class FakeApi:
    def __init__(self, token: str, page_size: int) -> None:
        self.token = token
        self.page_size = page_size
        self.scalers: Objects = {}
        self.deployments: Objects = {}
        self.leases: Objects = {}
        self.events: Objects = {}
        self.requests: list[dict[str, str]] = []
        self._versions = itertools.count(1)
        self.latest = 0
        # The scalers' changes, as (version, type, object); a watch from before ``forgotten`` gets 410.
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.forgotten = 0
        self.changes = asyncio.Condition()
        self.closing = 0  # bumped to end every open watch

    def version(self) -> str:
        self.latest = next(self._versions)
        return str(self.latest)

    async def changed(self, kind: str, obj: dict[str, Any]) -> None:
        """Records a change to a scaler (whose resourceVersion was just set) for the watches."""
        self.history.append((int(obj["metadata"]["resourceVersion"]), kind, json.loads(json.dumps(obj))))
        async with self.changes:
            self.changes.notify_all()

    @web.middleware
    async def authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path == "/_fake/ready":
            return await handler(request)
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return status(401, "Unauthorized")
        if not request.path.startswith("/_fake/"):
            agent = request.headers.get("User-Agent", "")
            self.requests.append({"method": request.method, "path": request.path, "agent": agent})
        return await handler(request)

    # ------------------------------------------------------------------------------------- scalers

    async def list_scalers(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info.get("ns")
        if request.query.get("watch") in GO_TRUE:
            return await self.watch_scalers(request, namespace)
        items = [obj for (ns, _), obj in sorted(self.scalers.items()) if namespace in (None, ns)]
        limit = int(request.query.get("limit", "0")) or len(items)
        limit = min(limit, self.page_size) if self.page_size else limit
        start = int(request.query.get("continue", "0"))
        page = items[start : start + limit]
        more = str(start + limit) if start + limit < len(items) else ""
        return web.json_response(
            {
                "kind": "CronoqWorkerScalerList",
                "apiVersion": "cronoq.io/v1alpha1",
                "metadata": {"resourceVersion": str(self.latest), "continue": more},
                "items": page,
            }
        )

    async def watch_scalers(self, request: web.Request, namespace: str | None) -> web.StreamResponse:
        """Streams the changes after ``resourceVersion`` (in ``namespace``, or all), then waits for more
        until ``timeoutSeconds`` or until the test closes the watches."""
        since = int(request.query.get("resourceVersion") or self.latest)
        deadline = time.monotonic() + float(request.query.get("timeoutSeconds", "300"))
        closing = self.closing
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if since < self.forgotten:
            gone = {
                "kind": "Status",
                "code": 410,
                "reason": "Expired",
                "message": f"too old resource version: {since}",
            }
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        while closing == self.closing and time.monotonic() < deadline:
            for version, kind, obj in [entry for entry in self.history if entry[0] > since]:
                since = version
                if namespace in (None, obj["metadata"]["namespace"]):
                    await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
            async with self.changes:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changes.wait(), max(deadline - time.monotonic(), 0))
        return response

    async def create_scaler(self, request: web.Request) -> web.Response:
        response = await self._create(request, self.scalers)
        if response.status == 201:
            await self.changed("ADDED", self.scalers[_key(request, json.loads(response.text or "{}"))])
        return response

    async def get_scaler(self, request: web.Request) -> web.Response:
        obj = self.scalers.get(_key(request))
        return web.json_response(obj) if obj else status(404, "scaler not found")

    async def patch_scaler(self, request: web.Request) -> web.Response:
        """A merge patch of the main resource changes the spec (and metadata), never the status, and a
        spec change bumps the generation."""
        obj = self.scalers.get(_key(request))
        if obj is None:
            return status(404, "scaler not found")
        patch = await _merge_patch_body(request)
        if isinstance(patch, web.Response):
            return patch
        patch.pop("status", None)
        updated = merge_patch(obj, patch)
        if updated.get("spec") != obj.get("spec"):
            updated["metadata"]["generation"] = obj["metadata"]["generation"] + 1
        updated["metadata"]["resourceVersion"] = self.version()
        self.scalers[_key(request)] = updated
        await self.changed("MODIFIED", updated)
        return web.json_response(updated)

    async def delete_scaler(self, request: web.Request) -> web.Response:
        obj = self.scalers.pop(_key(request), None)
        if obj is None:
            return status(404, "scaler not found")
        obj["metadata"]["resourceVersion"] = self.version()
        await self.changed("DELETED", obj)
        return web.json_response(obj)

    async def patch_scaler_status(self, request: web.Request) -> web.Response:
        obj = self.scalers.get(_key(request))
        if obj is None:
            return status(404, "scaler not found")
        patch = await _merge_patch_body(request)
        if isinstance(patch, web.Response):
            return patch
        obj["status"] = merge_patch(obj.get("status", {}), patch.get("status", {}))
        obj["metadata"]["resourceVersion"] = self.version()
        await self.changed("MODIFIED", obj)
        return web.json_response(obj)

    # -------------------------------------------------------------------------------- leases, events

    async def create_lease(self, request: web.Request) -> web.Response:
        return await self._create(request, self.leases)

    async def get_lease(self, request: web.Request) -> web.Response:
        obj = self.leases.get(_key(request))
        return web.json_response(obj) if obj else status(404, "lease not found")

    async def replace_lease(self, request: web.Request) -> web.Response:
        """A PUT: the body's ``metadata.resourceVersion`` must be the stored one (409 otherwise)."""
        obj = self.leases.get(_key(request))
        if obj is None:
            return status(404, "lease not found")
        body = await request.json()
        if body.get("metadata", {}).get("resourceVersion") != obj["metadata"]["resourceVersion"]:
            return status(
                409, "the object has been modified; please apply your changes to the latest version"
            )
        obj["spec"] = body.get("spec", {})
        obj["metadata"]["resourceVersion"] = self.version()
        return web.json_response(obj)

    async def create_event(self, request: web.Request) -> web.Response:
        obj = await request.json()
        obj["metadata"]["name"] = obj["metadata"].pop("generateName", "event.") + self.version()
        self.events[(request.match_info["ns"], obj["metadata"]["name"])] = obj
        obj["metadata"]["namespace"] = request.match_info["ns"]
        return web.json_response(obj, status=201)

    async def list_events(self, request: web.Request) -> web.Response:
        items = [obj for (ns, _), obj in sorted(self.events.items()) if ns == request.match_info["ns"]]
        return web.json_response({"kind": "EventList", "apiVersion": "v1", "items": items})

    # --------------------------------------------------------------------------------- deployments

    async def create_deployment(self, request: web.Request) -> web.Response:
        return await self._create(request, self.deployments)

    async def get_deployment(self, request: web.Request) -> web.Response:
        obj = self.deployments.get(_key(request))
        return web.json_response(obj) if obj else status(404, "deployment not found")

    async def get_scale(self, request: web.Request) -> web.Response:
        obj = self.deployments.get(_key(request))
        return web.json_response(self._scale(obj)) if obj else status(404, "deployment not found")

    async def patch_scale(self, request: web.Request) -> web.Response:
        obj = self.deployments.get(_key(request))
        if obj is None:
            return status(404, "deployment not found")
        patch = await _merge_patch_body(request)
        if isinstance(patch, web.Response):
            return patch
        wanted_version = patch.get("metadata", {}).get("resourceVersion")
        if wanted_version is not None and wanted_version != obj["metadata"]["resourceVersion"]:
            return status(
                409, "the object has been modified; please apply your changes to the latest version"
            )
        replicas = merge_patch(self._scale(obj), patch).get("spec", {}).get("replicas", 0)
        if replicas != obj["spec"].get("replicas"):
            obj["spec"]["replicas"] = replicas
            obj["metadata"]["generation"] += 1
            obj["metadata"]["resourceVersion"] = self.version()
        return web.json_response(self._scale(obj))

    @staticmethod
    def _scale(deployment: dict[str, Any]) -> dict[str, Any]:
        meta = deployment["metadata"]
        replicas = deployment["spec"].get("replicas", 1)
        spec = {"replicas": replicas} if replicas else {}  # omitempty, as autoscaling/v1 does
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion")},
            "spec": spec,
            "status": {"replicas": replicas, "selector": f"app={meta['name']}"},
        }

    async def _create(self, request: web.Request, objects: Objects) -> web.Response:
        """Stores the posted object with the metadata the API server fills in."""
        obj = await request.json()
        namespace = request.match_info["ns"]
        name = obj["metadata"]["name"]
        if (namespace, name) in objects:
            return status(409, f"{name} already exists")
        obj["metadata"].update(
            namespace=namespace,
            uid=f"uid-{namespace}-{name}-{self.version()}",
            generation=1,
            resourceVersion=self.version(),
            creationTimestamp="2026-01-01T00:00:00Z",
        )
        obj.setdefault("spec", {})
        objects[(namespace, name)] = obj
        return web.json_response(obj, status=201)

    # ------------------------------------------------------------------------------------- fake's own

    async def recorded(self, request: web.Request) -> web.Response:
        return web.json_response(self.requests)

    async def compact(self, request: web.Request) -> web.Response:
        self.history.clear()
        self.forgotten = int(self.version())  # every version given out so far is now too old
        return web.json_response({"forgotten": self.forgotten})

    async def close_watches(self, request: web.Request) -> web.Response:
        await self.end_watches()
        return web.json_response({"ok": True})

    async def end_watches(self, app: web.Application | None = None) -> None:
        """Ends every open watch: on request, and when the fake stops (which waits for open requests)."""
        self.closing += 1
        async with self.changes:
            self.changes.notify_all()

    async def ready(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})


def _key(request: web.Request, created: dict[str, Any] | None = None) -> tuple[str, str]:
    """The object a request names, or (for a create) the object it created."""
    if created is not None:
        return request.match_info["ns"], created["metadata"]["name"]
    return request.match_info["ns"], request.match_info["name"]


async def _merge_patch_body(request: web.Request) -> dict[str, Any] | web.Response:
    if request.content_type != MERGE_PATCH:
        return status(415, f"the fake accepts only {MERGE_PATCH} patches (got {request.content_type})")
    body = json.loads(await request.read())
    return body if isinstance(body, dict) else status(400, "a patch must be a JSON object")


def make_app(token: str, page_size: int = 0) -> web.Application:
    """The fake as an aiohttp application; ``page_size`` caps list pages (0: no cap) so that the
    operator has to follow ``continue``."""
    api = FakeApi(token, page_size)
    app = web.Application(middlewares=[api.authenticate])
    app.on_shutdown.append(api.end_watches)
    scalers = f"{SCALERS}/namespaces/{{ns}}/cronoqworkerscalers"
    deployments = f"{APPS}/namespaces/{{ns}}/deployments"
    app.router.add_get(f"{SCALERS}/cronoqworkerscalers", api.list_scalers)
    app.router.add_get(scalers, api.list_scalers)
    app.router.add_post(scalers, api.create_scaler)
    app.router.add_get(f"{scalers}/{{name}}", api.get_scaler)
    app.router.add_patch(f"{scalers}/{{name}}", api.patch_scaler)
    app.router.add_delete(f"{scalers}/{{name}}", api.delete_scaler)
    app.router.add_patch(f"{scalers}/{{name}}/status", api.patch_scaler_status)
    app.router.add_post(deployments, api.create_deployment)
    app.router.add_get(f"{deployments}/{{name}}", api.get_deployment)
    app.router.add_get(f"{deployments}/{{name}}/scale", api.get_scale)
    app.router.add_patch(f"{deployments}/{{name}}/scale", api.patch_scale)
    leases = f"{LEASES}/namespaces/{{ns}}/leases"
    app.router.add_post(leases, api.create_lease)
    app.router.add_get(f"{leases}/{{name}}", api.get_lease)
    app.router.add_put(f"{leases}/{{name}}", api.replace_lease)
    app.router.add_post("/api/v1/namespaces/{ns}/events", api.create_event)
    app.router.add_get("/api/v1/namespaces/{ns}/events", api.list_events)
    app.router.add_post("/_fake/compact", api.compact)
    app.router.add_post("/_fake/close-watches", api.close_watches)
    app.router.add_get("/_fake/requests", api.recorded)
    app.router.add_get("/_fake/ready", api.ready)
    return app


@dataclass
class FakeKube:
    """The fake API server process; :meth:`start` runs it, the other methods talk to it."""

    directory: Path
    token: str
    page_size: int = 0
    cert: tuple[Path, Path] | None = None  # (certificate, key): serve https
    ca: Path | None = None  # trusted by the test's own calls over https
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.cert else 'http'}://127.0.0.1:{self.port}"

    @property
    def token_file(self) -> Path:
        return self.directory / "kube-token"

    def start(self, timeout: float = 10.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.token_file.write_text(self.token + "\n")
        command = [sys.executable, "-m", "tests.kube_fake", "--port", str(self.port)]
        command += ["--page-size", str(self.page_size)]
        if self.cert is not None:
            command += ["--cert", str(self.cert[0]), "--key", str(self.cert[1])]
        log = (self.directory / "kube.log").open("ab")
        self.proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "KUBE_FAKE_TOKEN": self.token}
        )
        context = ssl.create_default_context(cafile=str(self.ca)) if self.ca else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the fake Kubernetes API exited with {self.proc.returncode}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.url}/_fake/ready", timeout=1, context=context) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.05)
        self.proc.kill()  # a failed start has no cleanup to stop it
        self.proc.wait(10)
        raise TimeoutError(f"the fake Kubernetes API did not start within {timeout} s")

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    async def call(self, method: str, path: str, body: object = None, *, patch: bool = False) -> Any:
        if self._session is None:
            ssl_option: ssl.SSLContext | bool = (
                ssl.create_default_context(cafile=str(self.ca)) if self.ca else True
            )
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_option))
        headers = {"Authorization": f"Bearer {self.token}"}
        if patch:
            headers["Content-Type"] = "application/merge-patch+json"
        async with self._session.request(
            method, self.url + path, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=5)
        ) as response:
            answer = await response.json()
            assert response.status < 400, (method, path, response.status, answer)
            return answer

    async def create_deployment(self, namespace: str, name: str, replicas: int) -> None:
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {"replicas": replicas},
        }
        await self.call("POST", f"{APPS}/namespaces/{namespace}/deployments", body)

    async def create_scaler(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        body = {
            "apiVersion": "cronoq.io/v1alpha1",
            "kind": "CronoqWorkerScaler",
            "metadata": {"name": name},
            "spec": spec,
        }
        await self.call("POST", f"{SCALERS}/namespaces/{namespace}/cronoqworkerscalers", body)

    async def patch_scaler(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self.call(
            "PATCH", f"{SCALERS}/namespaces/{namespace}/cronoqworkerscalers/{name}", patch, patch=True
        )

    async def scaler_status(self, namespace: str, name: str) -> dict[str, Any]:
        obj = await self.call("GET", f"{SCALERS}/namespaces/{namespace}/cronoqworkerscalers/{name}")
        return dict(obj.get("status", {}))

    async def replicas(self, namespace: str, deployment: str) -> int:
        obj = await self.call("GET", f"{APPS}/namespaces/{namespace}/deployments/{deployment}")
        return int(obj["spec"]["replicas"])

    async def events(self, namespace: str) -> list[dict[str, Any]]:
        return list((await self.call("GET", f"/api/v1/namespaces/{namespace}/events"))["items"])

    async def lease(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(await self.call("GET", f"{LEASES}/namespaces/{namespace}/leases/{name}"))

    async def operator_requests(self) -> list[tuple[str, str]]:
        """Every request the operator made so far (told from the test's own by its user agent), in order."""
        return [
            (entry["method"], entry["path"])
            for entry in await self.call("GET", "/_fake/requests")
            if entry["agent"].startswith("cronoq-operator/")
        ]


def main() -> None:
    p = argparse.ArgumentParser(description="a fake Kubernetes API server for the operator's tests")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cert", help="serve https with this certificate (PEM)")
    p.add_argument("--key", help="the certificate's private key (PEM)")
    p.add_argument("--page-size", type=int, default=0)
    args = p.parse_args()
    context = None
    if args.cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.cert, args.key)
    app = make_app(os.environ["KUBE_FAKE_TOKEN"], args.page_size)
    web.run_app(app, host="127.0.0.1", port=args.port, ssl_context=context, print=None, access_log=None)


if __name__ == "__main__":
    main()
