"""The operator's Kubernetes calls, as an API server sees them: paths, verbs, content types, bodies,
the bearer token (read again for every request), list paging, and errors that carry the API server's
message but never the token."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kube_operator.kube import KubeApi, KubeError, KubeTarget, Scale, WatchEvent, in_cluster

TOKEN = "first-token-0123456789"


@dataclass
class Recorder:
    """Answers each request with the next scripted (status, body) and records what it got."""

    answers: list[tuple[int, Any]] = field(default_factory=list)
    seen: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "authorization": request.headers.get("Authorization"),
                "content_type": request.headers.get("Content-Type"),
                "agent": request.headers.get("User-Agent", ""),
                "body": json.loads(raw) if raw else None,
            }
        )
        status, body = self.answers.pop(0)
        if isinstance(body, str):
            return web.Response(status=status, text=body)
        return web.json_response(body, status=status)


@dataclass
class Api:
    kube: KubeApi
    recorder: Recorder
    token_file: Path


@pytest.fixture
async def served() -> AsyncIterator[tuple[Recorder, str]]:
    """A recording API server on a loopback port, and its URL."""
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield recorder, str(server.make_url(""))
    finally:
        await server.close()


@pytest.fixture
async def api(served: tuple[Recorder, str], tmp_path: Path) -> AsyncIterator[Api]:
    recorder, url = served
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    async with KubeApi(KubeTarget(url, token_file, None)) as kube:
        yield Api(kube, recorder, token_file)


async def test_listing_follows_continue_tokens(api: Api) -> None:
    api.recorder.answers = [
        (
            200,
            {
                "items": [{"metadata": {"name": "a"}}],
                "metadata": {"continue": "next-page", "resourceVersion": "7"},
            },
        ),
        (200, {"items": [{"metadata": {"name": "b"}}], "metadata": {"continue": "", "resourceVersion": "7"}}),
    ]
    found = await api.kube.list_scalers()
    assert [item["metadata"]["name"] for item in found.items] == ["a", "b"]
    assert found.resource_version == "7"  # where a watch starts from
    first, second = api.recorder.seen
    assert first["method"] == "GET" and first["path"] == "/apis/cronoq.io/v1alpha1/cronoqworkerscalers"
    assert first["query"] == {"limit": "500"}
    assert second["query"] == {"limit": "500", "continue": "next-page"}
    assert first["authorization"] == f"Bearer {TOKEN}"
    assert first["agent"].startswith("cronoq-operator/")


async def test_listing_one_namespace(api: Api) -> None:
    api.recorder.answers = [(200, {"items": []})]
    assert (await api.kube.list_scalers("team-a")).items == []
    assert api.recorder.seen[0]["path"] == "/apis/cronoq.io/v1alpha1/namespaces/team-a/cronoqworkerscalers"


async def test_a_watch_streams_events_from_a_version_and_ends_with_an_error_status(api: Api) -> None:
    lines = [
        {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "8"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "code": 410,
                "reason": "Expired",
                "message": "too old resource version",
            },
        },
    ]
    api.recorder.answers = [(200, "".join(json.dumps(line) + "\n" for line in lines))]
    seen: list[WatchEvent] = []
    with pytest.raises(KubeError) as gone:
        async for event in api.kube.watch_scalers("team-a", "7"):
            seen.append(event)
    assert [event.kind for event in seen] == ["ADDED", "BOOKMARK"]
    # kubernetes_asyncio gives a watch's ERROR as "reason: message".
    assert gone.value.status == 410 and gone.value.message == "Expired: too old resource version"
    request = api.recorder.seen[0]
    assert request["path"] == "/apis/cronoq.io/v1alpha1/namespaces/team-a/cronoqworkerscalers"
    assert request["query"] == {  # the library writes booleans as Python does; Go's ParseBool takes them
        "watch": "True",
        "resourceVersion": "7",
        "allowWatchBookmarks": "True",
        "timeoutSeconds": "300",
    }
    assert request["authorization"] == f"Bearer {TOKEN}"


async def test_a_refused_watch_carries_the_api_servers_message(api: Api) -> None:
    refusal = {"kind": "Status", "code": 403, "reason": "Forbidden", "message": "cannot watch here"}
    api.recorder.answers = [(403, refusal)]
    with pytest.raises(KubeError) as refused:
        async for _ in api.kube.watch_scalers(None, "1"):
            pass
    assert (refused.value.status, refused.value.message) == (403, "Forbidden: cannot watch here")


@pytest.mark.parametrize(
    "line", ['{"kind": "Status"}', "not json", '{"type": "ERROR", "object": {"code": 500}}']
)
async def test_a_watch_line_that_is_not_an_event_ends_the_watch(api: Api, line: str) -> None:
    """The library tells of such a line with a bare Exception, a KeyError or by handing the text back."""
    api.recorder.answers = [(200, line + "\n")]
    with pytest.raises(KubeError, match="sent a line that is not a watch event") as broken:
        async for _ in api.kube.watch_scalers(None, "1"):
            pass
    assert broken.value.status == 0


async def test_the_token_file_is_read_for_every_request(api: Api) -> None:
    api.recorder.answers = [(200, {"items": []}), (200, {"items": []})]
    await api.kube.list_scalers()
    api.token_file.write_text("rotated-token-0123456789")
    await api.kube.list_scalers()
    assert [seen["authorization"] for seen in api.recorder.seen] == [
        f"Bearer {TOKEN}",
        "Bearer rotated-token-0123456789",
    ]


async def test_reading_a_scale_whose_replicas_are_zero(api: Api) -> None:
    """autoscaling/v1 leaves ``replicas`` out when it is 0."""
    api.recorder.answers = [
        (200, {"kind": "Scale", "metadata": {"resourceVersion": "41"}, "spec": {}}),
        (200, {"kind": "Scale", "metadata": {"resourceVersion": "42"}, "spec": {"replicas": 3}}),
    ]
    assert await api.kube.get_scale("team-a", "workers") == Scale(0, "41")
    assert await api.kube.get_scale("team-a", "workers") == Scale(3, "42")
    assert api.recorder.seen[0]["path"] == "/apis/apps/v1/namespaces/team-a/deployments/workers/scale"


async def test_a_scale_that_cannot_be_used_is_an_error(api: Api) -> None:
    """Replicas that are not a number, or no version to set them at (which would drop the precondition)."""
    api.recorder.answers = [
        (200, {"kind": "Scale", "metadata": {"resourceVersion": "41"}, "spec": {"replicas": "many"}}),
        (200, {"kind": "Scale", "spec": {"replicas": 3}}),
    ]
    with pytest.raises(KubeError, match="unexpected answer"):
        await api.kube.get_scale("team-a", "workers")
    with pytest.raises(KubeError, match=r"no metadata\.resourceVersion"):
        await api.kube.get_scale("team-a", "workers")


async def test_setting_a_scale_is_a_merge_patch_at_the_version_read(api: Api) -> None:
    api.recorder.answers = [(200, {"kind": "Scale"})]
    await api.kube.set_scale("team-a", "workers", 4, "42")
    [seen] = api.recorder.seen
    assert (seen["method"], seen["path"]) == (
        "PATCH",
        "/apis/apps/v1/namespaces/team-a/deployments/workers/scale",
    )
    assert seen["content_type"] == "application/merge-patch+json"
    assert seen["body"] == {"spec": {"replicas": 4}, "metadata": {"resourceVersion": "42"}}


async def test_writing_a_status_patches_the_status_subresource(api: Api) -> None:
    api.recorder.answers = [(200, {})]
    await api.kube.patch_status("team-a", "jobs", {"reason": "Scaled", "desiredSlots": None})
    [seen] = api.recorder.seen
    assert (seen["method"], seen["path"]) == (
        "PATCH",
        "/apis/cronoq.io/v1alpha1/namespaces/team-a/cronoqworkerscalers/jobs/status",
    )
    assert seen["content_type"] == "application/merge-patch+json"
    assert seen["body"] == {"status": {"reason": "Scaled", "desiredSlots": None}}  # null removes the field


async def test_a_refusal_carries_the_api_servers_message(api: Api) -> None:
    api.recorder.answers = [
        (404, {"kind": "Status", "message": 'deployments.apps "workers" not found', "code": 404}),
        (500, "<html>oops</html>"),
        (200, "not json"),
    ]
    with pytest.raises(KubeError) as missing:
        await api.kube.get_scale("team-a", "workers")
    assert (missing.value.status, missing.value.message) == (404, 'deployments.apps "workers" not found')
    with pytest.raises(KubeError) as broken:
        await api.kube.list_scalers()
    assert broken.value.status == 500 and "list scalers in all namespaces" in broken.value.message
    with pytest.raises(KubeError) as garbled:
        await api.kube.list_scalers()
    assert "not a JSON object" in garbled.value.message


async def test_an_unreachable_api_server_or_unreadable_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    async with KubeApi(KubeTarget("http://127.0.0.1:9", token_file, None), timeout=2) as kube:
        with pytest.raises(KubeError) as caught:
            await kube.list_scalers()
        assert caught.value.status == 0 and "cannot reach the Kubernetes API" in str(caught.value)
        assert TOKEN not in str(caught.value)
        token_file.unlink()
        with pytest.raises(KubeError) as unreadable:
            await kube.list_scalers()
        assert "cannot read the Kubernetes token file" in str(unreadable.value)
        with pytest.raises(KubeError) as unreadable:
            async for _ in kube.watch_scalers(None, "1"):
                pass
        assert str(unreadable.value).startswith("cannot read the Kubernetes token file")


async def test_without_a_token_file_no_token_is_sent(served: tuple[Recorder, str]) -> None:
    recorder, url = served
    recorder.answers = [(200, {"items": []})]
    async with KubeApi(KubeTarget(url, None, None)) as kube:
        await kube.list_scalers()
    assert recorder.seen[0]["authorization"] is None


def test_in_cluster_uses_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "ca.crt").write_text("")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster(env, tmp_path) == KubeTarget(
        "https://10.96.0.1:443", tmp_path / "token", tmp_path / "ca.crt"
    )
    ipv6 = in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)
    assert ipv6.url == "https://[fd00::1]:443"


def test_outside_a_cluster_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--kube-api"):
        in_cluster({}, tmp_path)
    with pytest.raises(ValueError, match="automountServiceAccountToken"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)
