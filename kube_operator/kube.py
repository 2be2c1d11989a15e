"""The few Kubernetes API calls the operator makes, over HTTP with aiohttp.

It lists ``CronoqWorkerScaler`` resources, reads and changes Deployments through their ``scale``
subresource, and writes scalers' ``status`` subresource: exactly what its ClusterRole allows, nothing
else (no Secrets, no Deployments themselves).

Inside a cluster it uses the pod's service account (``KUBERNETES_SERVICE_HOST``/``PORT``, the token and
CA under ``/var/run/secrets/kubernetes.io/serviceaccount``); elsewhere an explicit API URL, token file and
CA. The token file is read again for every request: projected service-account tokens are rotated by the
kubelet while the pod runs. The token only ever goes into the ``Authorization`` header, never into a log
or an error message.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp

from cronoq import __version__

from .scaler import GROUP, PLURAL, VERSION

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = f"cronoq-operator/{__version__}"
PAGE_SIZE = 500


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

    async def list_scalers(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every scaler (in ``namespace``, or in all), following the list's pages."""
        items: list[dict[str, Any]] = []
        params = {"limit": str(PAGE_SIZE)}
        while True:
            page = await self._request("GET", scalers_path(namespace), params=params)
            found = page.get("items")
            items += [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []
            meta = page.get("metadata")
            token = meta.get("continue") if isinstance(meta, dict) else None
            if not token:
                return items
            params = {"limit": str(PAGE_SIZE), "continue": str(token)}

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

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merges ``status`` into the scaler's status (a None field removes it)."""
        await self._request(
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
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self._target.token_file is not None:
            headers["Authorization"] = f"Bearer {self._token()}"
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


def _message(answer: object, fallback: str) -> str:
    """The ``message`` of a ``Status`` object, which is how the API server explains a refusal."""
    if isinstance(answer, dict) and isinstance(answer.get("message"), str):
        return str(answer["message"])
    return fallback
