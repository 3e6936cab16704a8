"""A new kernel's first sandbox without the daytona SDK: the lookup and the create sent as soon as the kernel
starts, while the SDK loads in its thread (docs/benchmarks.md, "Start").

The SDK's import and client take about 1 s of CPU; a kernel that waited for them sent its first request to
Daytona 0.8 s after it answered Jupyter. This client sends the same few requests the SDK sends for a new
sandbox from the default snapshot, with the same headers: the volume by name (``VolumesApi.get_volume_by_name``),
the workspace's sandbox by its labels (``AsyncDaytona.list``), the create (``AsyncDaytona._create``: the same
``CreateSandbox`` body, under the name the SDK path would retry with) and the sandbox by id until it is started.
``tests/test_early_start.py`` checks each request against what the installed SDK itself sends.

Anything else (a volume still being made or not there yet, a sandbox found, an image or a snapshot of one's
own, a proxy, credentials only in a ``.env`` file, any error) is ``NotEarly``: the start goes on through the SDK,
which repeats the request and reports as it always does, so an error reads the same either way. A create sent
here keeps its name for the SDK's retry (``WorkspaceSandboxes.retry_name``): a lost answer never bills twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ..base import ProgressCallback
from .api import API_REQUEST_TIMEOUT_S, GONE_STATES

if TYPE_CHECKING:
    from .workspace import WorkspaceSandboxes

log = logging.getLogger("daytona_kernel.daytona")

LANGUAGE_LABEL = "code-toolbox-language"  # the SDK's CODE_TOOLBOX_LANGUAGE_LABEL, which _create adds to every sandbox
STARTED_POLL_S = 0.05  # how often the new sandbox's state is read while it starts
STARTED_WAIT_S = 60.0  # then the SDK's start takes over (it waits, and reports, as always)


class NotEarly(Exception):
    """The early path stops here; the SDK's path goes on (and reports what is wrong, if anything is)."""


@dataclass(frozen=True)
class EarlySandbox:
    """What the API answered about a sandbox: enough to reach its toolbox."""

    id: str
    state: str
    toolbox_url: str


@dataclass(frozen=True)
class Request:
    """One request as it goes out: compared with the SDK's in the tests."""

    method: str
    url: str
    headers: dict[str, str]
    body: dict[str, Any] | None = None


def api_headers(toolbox_headers: dict[str, str], body: bool) -> dict[str, str]:
    """The API client's headers: the toolbox client's (``interpreter_headers``, a copy of the same defaults in the
    SDK), with ``Content-Type`` when a JSON body goes."""
    return dict(toolbox_headers, **({"Content-Type": "application/json"} if body else {}))


def create_body(
    *,
    name: str,
    labels: dict[str, str],
    env: dict[str, str],
    target: str,
    auto_stop_interval: int | None,
    auto_archive_interval: int,
    auto_delete_interval: int,
    volume: tuple[str, str, str] | None,
    network_block_all: bool,
) -> dict[str, Any]:
    """``CreateSandbox`` as the SDK's ``_create`` fills it from ``CreateSandboxFromSnapshotParams`` without a snapshot
    (the organisation's default), in the API's field names; ``volume`` is (id, mount path, sub-path). Unset
    fields are left out, as the SDK's ``to_dict`` leaves them."""
    body: dict[str, Any] = {
        "name": name,
        "env": dict(env),
        "labels": dict(labels, **{LANGUAGE_LABEL: "python"}),
        "volumes": [{"volumeId": volume[0], "mountPath": volume[1], "subpath": volume[2]}] if volume else [],
        "autoArchiveInterval": auto_archive_interval,
        "autoDeleteInterval": auto_delete_interval,
    }
    if target:
        body["target"] = target
    if auto_stop_interval is not None:
        body["autoStopInterval"] = auto_stop_interval
    if network_block_all:
        body["networkBlockAll"] = True
    return body


class EarlyApi:
    """Daytona's API through tornado's client (loaded with ipykernel), as ``HandedOverToolbox`` reaches the toolbox:
    TLS verified, no redirect followed, no proxy (the caller checked), the SDK's headers."""

    def __init__(self, api_url: str, headers: dict[str, str]) -> None:
        self._api_url = api_url.rstrip("/")
        self._headers = headers
        self._client: AsyncHTTPClient | None = None

    def volume_request(self, name: str) -> Request:
        return Request("GET", f"{self._api_url}/volumes/by-name/{quote(name, safe='')}", api_headers(self._headers, False))

    def find_request(self, labels: dict[str, str]) -> Request:
        return Request(
            "GET", f"{self._api_url}/sandbox?labels={quote(json.dumps(labels), safe='')}", api_headers(self._headers, False)
        )

    def create_request(self, body: dict[str, Any]) -> Request:
        return Request("POST", f"{self._api_url}/sandbox", api_headers(self._headers, True), body)

    def get_request(self, sandbox_id: str) -> Request:
        return Request("GET", f"{self._api_url}/sandbox/{quote(sandbox_id, safe='')}", api_headers(self._headers, False))

    async def _send(self, request: Request) -> Any:
        """The reply's JSON; ``NotEarly`` for anything but a 200 with a JSON object (the SDK's path then asks again)."""
        if self._client is None:
            self._client = AsyncHTTPClient(force_instance=True)
        outgoing = HTTPRequest(
            request.url,
            method=request.method,
            headers=request.headers,
            body=json.dumps(request.body) if request.body is not None else None,
            connect_timeout=API_REQUEST_TIMEOUT_S,
            request_timeout=API_REQUEST_TIMEOUT_S,
            follow_redirects=False,
        )
        try:
            response = await self._client.fetch(outgoing, raise_error=False)
        except (HTTPClientError, OSError, asyncio.TimeoutError) as exc:
            raise NotEarly(f"{request.method} {request.url}: {type(exc).__name__}: {exc}") from exc
        if response.code != 200:
            raise NotEarly(f"{request.method} {request.url}: {response.code}")
        try:
            data = json.loads(response.body or b"")
        except ValueError as exc:
            raise NotEarly(f"{request.method} {request.url}: not JSON") from exc
        if not isinstance(data, dict):
            raise NotEarly(f"{request.method} {request.url}: not a JSON object")
        return data

    async def volume_id(self, name: str) -> str:
        """The volume's id, once it is ready (a volume still being made, or not there: the SDK makes or waits)."""
        data = await self._send(self.volume_request(name))
        if data.get("state") != "ready" or not isinstance(data.get("id"), str):
            raise NotEarly(f"the volume {name!r} is {data.get('state')!r}")
        return str(data["id"])

    async def nothing_found(self, labels: dict[str, str]) -> None:
        """``NotEarly`` when the workspace already has a sandbox (the SDK's path checks and starts it)."""
        data = await self._send(self.find_request(labels))
        items = data.get("items")
        if not isinstance(items, list) or any(not isinstance(i, dict) or i.get("state") not in GONE_STATES for i in items):
            raise NotEarly("the workspace has a sandbox")

    async def create(self, body: dict[str, Any]) -> EarlySandbox:
        return self._sandbox(await self._send(self.create_request(body)))

    async def started(self, sandbox_id: str) -> EarlySandbox:
        """The sandbox once it is started; ``NotEarly`` if it goes elsewhere or takes longer than ``STARTED_WAIT_S``."""
        deadline = time.monotonic() + STARTED_WAIT_S
        while True:
            sandbox = self._sandbox(await self._send(self.get_request(sandbox_id)))
            if sandbox.state == "started":
                return sandbox
            if sandbox.state not in (
                "creating",
                "starting",
                "pending_build",
                "building_snapshot",
                "pulling_snapshot",
                "restoring",
            ):
                raise NotEarly(f"the new sandbox is {sandbox.state}")
            if time.monotonic() > deadline:
                raise NotEarly(f"the new sandbox is still {sandbox.state}")
            await asyncio.sleep(STARTED_POLL_S)

    @staticmethod
    def _sandbox(data: dict[str, Any]) -> EarlySandbox:
        sid, state, toolbox = data.get("id"), data.get("state"), data.get("toolboxProxyUrl")
        if not (isinstance(sid, str) and isinstance(state, str) and isinstance(toolbox, str) and toolbox):
            raise NotEarly("the API's sandbox has no id, state or toolbox URL")
        return EarlySandbox(sid, state, toolbox)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


async def create_early(api: EarlyApi, workspace: WorkspaceSandboxes, progress: ProgressCallback) -> EarlySandbox:
    """The workspace's new sandbox, started: the volume and the lookup at once, then the create under a name kept
    for the SDK's retry. ``NotEarly`` when the SDK's path must take over."""
    volume_name = workspace.volume_name
    volume_id, _ = await asyncio.gather(api.volume_id(volume_name), api.nothing_found(workspace.identity()))
    name = workspace.new_name()
    body = workspace.early_create_body(volume_id, name)
    if body is None:
        raise NotEarly("this configuration needs the SDK")
    progress("creating sandbox… (snapshot default)")
    workspace.unsettled.append(name)  # until its answer comes: a shutdown, or the SDK's retry, looks it up by name
    try:
        made = await api.create(body)
    except NotEarly:
        workspace.retry_name = name
        raise
    workspace.unsettled.remove(name)
    workspace.created_early = made.id
    log.info("created sandbox %s (%s) without the SDK", made.id, name)
    return await api.started(made.id)
