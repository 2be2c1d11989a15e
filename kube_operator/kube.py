"""The few Kubernetes API calls the operator makes, over HTTP with aiohttp.

It lists and watches ``CronoqWorkerScaler`` resources, reads and changes Deployments through their
``scale`` subresource, writes scalers' ``status`` subresource, records Events about scalers, and holds
its leader-election Lease: exactly what its RBAC allows, nothing else (no Secrets, no Deployments
themselves).

Inside a cluster it uses the pod's service account (``KUBERNETES_SERVICE_HOST``/``PORT``, the token and
CA under ``/var/run/secrets/kubernetes.io/serviceaccount``); elsewhere an explicit API URL, token file and
CA. The token file is read again for every request: projected service-account tokens are rotated by the
kubelet while the pod runs. The token only ever goes into the ``Authorization`` header, never into a log
or an error message.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from cronoq import __version__

from .scaler import GROUP, PLURAL, VERSION

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = f"cronoq-operator/{__version__}"
PAGE_SIZE = 500
# How long the API server keeps one watch open before ending it (the operator then watches again from
# where it was), and how long the stream may stay silent meanwhile: longer means a dead connection.
WATCH_TIMEOUT_S = 300
WATCH_SILENCE_S = WATCH_TIMEOUT_S + 30
# A watch event's line may be long (a scaler with a large status), but not unboundedly.
WATCH_LINE_LIMIT = 1 << 20


class KubeError(Exception):
    """A failed API call: the HTTP status (0 when no answer came) and the API server's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class KubeTarget:
    """Where the API server is and how to authenticate: ``token_file`` None sends no token (a local
    proxy such as ``kubectl proxy``), ``ca_file`` None trusts the system's CAs for https."""

    url: str
    token_file: Path | None
    ca_file: Path | None


@dataclass(frozen=True, slots=True)
class Listed:
    """A list's items and the ``resourceVersion`` to watch from so that no change in between is missed."""

    items: list[dict[str, Any]]
    resource_version: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One line of a watch: ``ADDED``, ``MODIFIED``, ``DELETED`` or ``BOOKMARK``, and the object."""

    kind: str
    obj: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Scale:
    """A Deployment's scale subresource: its wanted replicas and the version they were read at."""

    replicas: int
    resource_version: str


def in_cluster(env: Mapping[str, str], account: Path = SERVICE_ACCOUNT) -> KubeTarget:
    """The API server as a pod sees it; ValueError naming what is missing outside a cluster."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ValueError(
            "not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST/PORT are not set): "
            "give --kube-api, with --kube-token-file and --kube-ca as needed"
        )
    token, ca = account / "token", account / "ca.crt"
    for path in (token, ca):
        if not path.is_file():
            raise ValueError(f"no service-account file {path}: is automountServiceAccountToken off?")
    host = f"[{host}]" if ":" in host else host
    return KubeTarget(f"https://{host}:{port}", token, ca)


def scalers_path(namespace: str | None) -> str:
    where = f"/namespaces/{quote(namespace, safe='')}" if namespace else ""
    return f"/apis/{GROUP}/{VERSION}{where}/{PLURAL}"


def scaler_status_path(namespace: str, name: str) -> str:
    return f"{scalers_path(namespace)}/{quote(name, safe='')}/status"


def lease_path(namespace: str, name: str = "") -> str:
    where = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
    return f"{where}/{quote(name, safe='')}" if name else where


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/events"


def scale_path(namespace: str, deployment: str) -> str:
    return (
        f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/deployments/{quote(deployment, safe='')}/scale"
    )


class KubeApi:
    """A connection pool to one API server; use it as an async context manager (or :meth:`close`)."""

    def __init__(self, target: KubeTarget, *, timeout: float = 10.0) -> None:
        self._target = target
        self._base = target.url.rstrip("/")
        context: ssl.SSLContext | bool = True
        if target.ca_file is not None:
            context = ssl.create_default_context(cafile=str(target.ca_file))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context),
            timeout=aiohttp.ClientTimeout(total=timeout),
        )

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._session.close()

    async def list_scalers(self, namespace: str | None = None) -> Listed:
        """Every scaler (in ``namespace``, or in all), following the list's pages, and the version of
        the list (its first page's: the pages are one consistent snapshot)."""
        items: list[dict[str, Any]] = []
        params = {"limit": str(PAGE_SIZE)}
        version = ""
        while True:
            page = await self._request("GET", scalers_path(namespace), params=params)
            found = page.get("items")
            items += [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []
            meta = page.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            version = version or str(meta.get("resourceVersion") or "")
            token = meta.get("continue")
            if not token:
                return Listed(items, version)
            params = {"limit": str(PAGE_SIZE), "continue": str(token)}

    async def watch_scalers(self, namespace: str | None, resource_version: str) -> AsyncIterator[WatchEvent]:
        """The changes to scalers after ``resource_version``, as the API server streams them, until it
        ends the watch (after :data:`WATCH_TIMEOUT_S`). An ``ERROR`` event ends it with a
        :class:`KubeError` of the status it carries: 410 when ``resource_version`` is too old to watch
        from (the caller lists again)."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_TIMEOUT_S),
        }
        path = scalers_path(namespace)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=WATCH_SILENCE_S)
        try:
            async with self._session.get(
                self._base + path, params=params, headers=self._headers(), timeout=timeout
            ) as response:
                if response.status >= 400:
                    text = await response.text()
                    raise KubeError(
                        response.status, _message(_json(text), f"watch {path}: {response.reason}")
                    )
                while line := await response.content.readline(max_line_length=WATCH_LINE_LIMIT):
                    if line.strip():
                        yield _watch_event(line)
        except (aiohttp.ClientError, HttpProcessingError) as err:
            raise KubeError(0, f"the watch of {path} at {self._base} broke: {err}") from None
        except TimeoutError:
            raise KubeError(0, f"the watch of {path} at {self._base} went silent") from None

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._request("GET", lease_path(namespace, name))

    async def create_lease(self, namespace: str, lease: Mapping[str, Any]) -> dict[str, Any]:
        return await self._request("POST", lease_path(namespace), body=dict(lease))

    async def replace_lease(self, namespace: str, name: str, lease: Mapping[str, Any]) -> dict[str, Any]:
        """Replaces the Lease; its ``metadata.resourceVersion`` is a precondition (409 when someone
        else wrote it since), which is what makes two operators' claims exclusive."""
        return await self._request("PUT", lease_path(namespace, name), body=dict(lease))

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        await self._request("POST", events_path(namespace), body=dict(event))

    async def get_scale(self, namespace: str, deployment: str) -> Scale:
        body = await self._request("GET", scale_path(namespace, deployment))
        spec = body.get("spec")
        meta = body.get("metadata")
        # autoscaling/v1 omits replicas when they are 0 (omitempty).
        replicas = spec.get("replicas", 0) if isinstance(spec, dict) else 0
        version = meta.get("resourceVersion", "") if isinstance(meta, dict) else ""
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise KubeError(0, f"the scale of deployment {deployment!r} has no integer spec.replicas")
        return Scale(replicas, str(version))

    async def set_scale(self, namespace: str, deployment: str, replicas: int, resource_version: str) -> None:
        """Sets the replicas as ``kubectl scale`` does (a merge patch of the scale subresource), at the
        version read: if someone changed the scale since, the API server answers 409 and nothing is
        written (the next round reads again)."""
        patch: dict[str, Any] = {"spec": {"replicas": replicas}}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        await self._request("PATCH", scale_path(namespace, deployment), body=patch, content_type=MERGE_PATCH)

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        """Merges ``status`` into the scaler's status (a None field removes it); the scaler as written."""
        return await self._request(
            "PATCH",
            scaler_status_path(namespace, name),
            body={"status": dict(status)},
            content_type=MERGE_PATCH,
        )

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = self._headers()
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            async with self._session.request(
                method, self._base + path, params=params, json=body, headers=headers
            ) as response:
                status, text = response.status, await response.text()
                fallback = f"{method} {path}: {response.reason or 'failed'}"
        except aiohttp.ClientError as err:
            raise KubeError(0, f"cannot reach the Kubernetes API at {self._base}: {err}") from None
        except TimeoutError:
            raise KubeError(0, f"no answer from the Kubernetes API at {self._base} in time") from None
        answer = _json(text)
        if status >= 400:
            raise KubeError(status, _message(answer, fallback))
        if not isinstance(answer, dict):
            raise KubeError(status, f"{method} {path}: the answer is not a JSON object")
        return answer

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self._target.token_file is not None:
            headers["Authorization"] = f"Bearer {self._token()}"
        return headers

    def _token(self) -> str:
        assert self._target.token_file is not None
        try:
            return self._target.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise KubeError(
                0, f"cannot read the Kubernetes token file {self._target.token_file}: {err}"
            ) from None


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _watch_event(line: bytes) -> WatchEvent:
    event = _json(line.decode("utf-8", errors="replace"))
    kind = event.get("type") if isinstance(event, dict) else None
    obj = event.get("object") if isinstance(event, dict) else None
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise KubeError(0, "the watch sent a line that is not a watch event")
    if kind == "ERROR":
        code = obj.get("code")
        raise KubeError(code if isinstance(code, int) else 0, _message(obj, "the watch ended with an error"))
    return WatchEvent(kind, obj)


def _message(answer: object, fallback: str) -> str:
    """The ``message`` of a ``Status`` object, which is how the API server explains a refusal."""
    if isinstance(answer, dict) and isinstance(answer.get("message"), str):
        return str(answer["message"])
    return fallback
