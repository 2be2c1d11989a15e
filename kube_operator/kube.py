"""The few Kubernetes API calls the operator makes, as a thin adapter over ``kubernetes_asyncio``.

It lists and watches ``CronoqWorkerScaler`` resources, reads and changes Deployments through their
``scale`` subresource, writes scalers' ``status`` subresource, records Events about scalers, and holds
its leader-election Lease: exactly what its RBAC allows, nothing else (no Secrets, no Deployments
themselves). The library builds the requests; this module keeps the operator's own terms (plain dicts
for objects, :class:`Scale`, :class:`KubeError` with the HTTP status for every failure) so that the
election, the inventory and the reconciler never see the library's models or exceptions.

Inside a cluster it uses the pod's service account (``KUBERNETES_SERVICE_HOST``/``PORT``, the token and
CA under ``/var/run/secrets/kubernetes.io/serviceaccount``); elsewhere an explicit API URL, token file and
CA. The token file is read again for every request (the library's ``refresh_api_key_hook``): projected
service-account tokens are rotated by the kubelet while the pod runs. The token only ever goes into the
``Authorization`` header, never into a log or an error message.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio.client import (
    ApiClient,
    AppsV1Api,
    Configuration,
    CoordinationV1Api,
    CoreV1Api,
    CustomObjectsApi,
    V1Lease,
)
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

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
# The library's name for the bearer token in its Configuration.api_key.
_BEARER = "BearerToken"

T = TypeVar("T")


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


class KubeApi:
    """A connection pool to one API server; use it as an async context manager (or :meth:`close`)."""

    def __init__(self, target: KubeTarget, *, timeout: float = 10.0) -> None:
        self._target = target
        self._timeout = timeout
        # Options for every call, and for a patch: the library would send a dict as a strategic merge
        # patch, which custom resources do not take; its stubs leave ``_content_type`` out, so it is
        # passed through this Any-typed mapping.
        self._opts: dict[str, Any] = {"_request_timeout": timeout}
        self._merge_patch: dict[str, Any] = {**self._opts, "_content_type": MERGE_PATCH}
        config = Configuration(host=target.url.rstrip("/"))
        config.ssl_ca_cert = str(target.ca_file) if target.ca_file is not None else None
        if target.token_file is not None:
            # The library asks for the key only when one is set, so the hook has a slot to fill.
            config.api_key = {_BEARER: ""}
            config.api_key_prefix = {_BEARER: "Bearer"}
            config.refresh_api_key_hook = self._read_token
        self._client = ApiClient(config)
        self._client.user_agent = USER_AGENT
        self._custom = CustomObjectsApi(self._client)
        self._apps = AppsV1Api(self._client)
        self._leases = CoordinationV1Api(self._client)
        self._core = CoreV1Api(self._client)

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    async def list_scalers(self, namespace: str | None = None) -> Listed:
        """Every scaler (in ``namespace``, or in all), following the list's pages, and the version of
        the list (its first page's: the pages are one consistent snapshot)."""
        items: list[dict[str, Any]] = []
        version, token = "", ""
        while True:
            page = _object(
                await self._call(
                    f"list {_scope(namespace)}",
                    self._lister(namespace)(limit=PAGE_SIZE, _continue=token or None, **self._opts),
                ),
                f"list {_scope(namespace)}",
            )
            found = page.get("items")
            items += [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []
            meta = page.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            version = version or str(meta.get("resourceVersion") or "")
            token = str(meta.get("continue") or "")
            if not token:
                return Listed(items, version)

    async def watch_scalers(self, namespace: str | None, resource_version: str) -> AsyncIterator[WatchEvent]:
        """The changes to scalers after ``resource_version``, as the API server streams them, until it
        ends the watch (after :data:`WATCH_TIMEOUT_S`). An ``ERROR`` event ends it with a
        :class:`KubeError` of the status it carries: 410 when ``resource_version`` is too old to watch
        from (the caller lists again)."""
        what = f"the watch of {_scope(namespace)} at {self._target.url}"
        silence = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout, sock_read=WATCH_SILENCE_S)
        async with Watch() as watch:
            stream = watch.stream(
                self._lister(namespace),
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_TIMEOUT_S,
                _request_timeout=silence,
            )
            while True:
                try:
                    event = await anext(stream)
                except StopAsyncIteration:
                    return
                except (ApiException, aiohttp.ClientError, TimeoutError) as err:
                    raise _failure(what, err) from None
                except Exception as err:
                    # The library tells of a line that is not a watch event with a bare Exception (a
                    # KeyError for an ERROR without a reason, a ValueError for an over-long line);
                    # anything else (our own KubeError from reading the token, a bug) goes on as it is.
                    if type(err) is not Exception and not isinstance(err, KeyError | ValueError):
                        raise
                    raise KubeError(0, f"{what} sent a line that is not a watch event: {err}") from None
                kind = event.get("type") if isinstance(event, dict) else None
                obj = event.get("raw_object") if isinstance(event, dict) else None
                if not isinstance(kind, str) or not isinstance(obj, dict):
                    raise KubeError(0, f"{what} sent a line that is not a watch event")
                yield WatchEvent(kind, obj)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._lease("get", self._leases.read_namespaced_lease(name, namespace, **self._opts))

    async def create_lease(self, namespace: str, lease: Mapping[str, Any]) -> dict[str, Any]:
        call = self._leases.create_namespaced_lease(namespace, _body(lease), **self._opts)
        return await self._lease("create", call)

    async def replace_lease(self, namespace: str, name: str, lease: Mapping[str, Any]) -> dict[str, Any]:
        """Replaces the Lease; its ``metadata.resourceVersion`` is a precondition (409 when someone
        else wrote it since), which is what makes two operators' claims exclusive."""
        call = self._leases.replace_namespaced_lease(name, namespace, _body(lease), **self._opts)
        return await self._lease("replace", call)

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        await self._call(
            "create event", self._core.create_namespaced_event(namespace, _body(event), **self._opts)
        )

    async def get_scale(self, namespace: str, deployment: str) -> Scale:
        what = f"get the scale of deployment {deployment!r}"
        scale = await self._call(
            what, self._apps.read_namespaced_deployment_scale(deployment, namespace, **self._opts)
        )
        version = scale.metadata.resource_version if scale.metadata else None
        if not version:  # without it, setting the scale would have no precondition
            raise KubeError(0, f"{what}: the answer has no metadata.resourceVersion")
        # autoscaling/v1 omits replicas when they are 0 (omitempty).
        return Scale(scale.spec.replicas if scale.spec and scale.spec.replicas else 0, version)

    async def set_scale(self, namespace: str, deployment: str, replicas: int, resource_version: str) -> None:
        """Sets the replicas as ``kubectl scale`` does (a merge patch of the scale subresource), at the
        version read: if someone changed the scale since, the API server answers 409 and nothing is
        written (the next round reads again)."""
        patch = {"spec": {"replicas": replicas}, "metadata": {"resourceVersion": resource_version}}
        await self._call(
            f"scale deployment {deployment!r}",
            self._apps.patch_namespaced_deployment_scale(deployment, namespace, patch, **self._merge_patch),
        )

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        """Merges ``status`` into the scaler's status (a None field removes it); the scaler as written."""
        what = f"patch the status of scaler {namespace}/{name}"
        written = await self._call(
            what,
            self._custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": dict(status)},
                **self._merge_patch,
            ),
        )
        return _object(written, what)

    def _lister(self, namespace: str | None) -> Callable[..., Awaitable[Any]]:
        """The call that lists (or, given to :class:`Watch`, watches) the scalers in ``namespace`` or in
        all namespaces."""
        if namespace:
            return partial(self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL)
        return partial(self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)

    async def _call(self, what: str, call: Awaitable[T]) -> T:
        """Awaits one API call, turning the library's and aiohttp's failures into :class:`KubeError`."""
        try:
            return await call
        except (ApiException, aiohttp.ClientError, TimeoutError) as err:
            raise _failure(f"{what} at {self._target.url}", err) from None
        except ValueError as err:  # the library could not read the answer as the model it expects
            raise KubeError(0, f"{what} at {self._target.url}: unexpected answer: {err}") from None

    async def _lease(self, verb: str, call: Awaitable[V1Lease]) -> dict[str, Any]:
        """The Lease the call answers, as the JSON object the API server sent (camelCase keys), which is
        what the election reads and writes back."""
        lease = await self._call(f"{verb} the lease", call)
        return _object(self._client.sanitize_for_serialization(lease), f"{verb} the lease")

    async def _read_token(self, config: Configuration) -> None:
        assert self._target.token_file is not None
        try:
            token = self._target.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise KubeError(
                0, f"cannot read the Kubernetes token file {self._target.token_file}: {err}"
            ) from None
        config.api_key[_BEARER] = token


def _scope(namespace: str | None) -> str:
    return f"scalers in namespace {namespace!r}" if namespace else "scalers in all namespaces"


def _body(obj: Mapping[str, Any]) -> Any:
    """An object to send as JSON as it is: the library's stubs ask for its model classes, but it sends a
    dict unchanged, which keeps every field the election and the reconciler write."""
    return dict(obj)


def _object(answer: object, what: str) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise KubeError(0, f"{what}: the answer is not a JSON object")
    return answer


def _failure(what: str, err: BaseException) -> KubeError:
    """The API server's refusal (the ``message`` of its ``Status``), or why no answer came."""
    if isinstance(err, TimeoutError):  # before ClientError: aiohttp's read timeouts are both
        return KubeError(0, f"no answer in time for {what}")
    if isinstance(err, aiohttp.ClientError):
        return KubeError(0, f"cannot reach the Kubernetes API for {what}: {err}")
    assert isinstance(err, ApiException)
    status = err.status if isinstance(err.status, int) else 0
    try:
        answer = json.loads(err.body) if err.body else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("message"), str):
        return KubeError(status, answer["message"])
    if err.headers is None and err.reason:
        # A watch's ERROR event: no response of its own; the library puts the Status's "reason: message"
        # in the exception's reason.
        return KubeError(status, str(err.reason))
    return KubeError(status, f"{what}: {err.reason or 'failed'}")
