"""A new kernel's first sandbox without the daytona SDK (daytona_kernel/backends/daytona/early.py): each request the
early path sends is the one the installed SDK sends on the kernel's SDK path (method, URL, headers, body), the
create leaves before the SDK's client exists, and what goes wrong ends as it does through the SDK."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from daytona_kernel.backends.daytona.api import call_api
from daytona_kernel.backends.daytona.early import EarlyApi, Request
from daytona_kernel.backends.daytona.restart_handoff import interpreter_headers
from daytona_kernel.backends.daytona.workspace import WorkspaceSandboxes
from daytona_kernel.config import DaytonaKernelConfig, DaytonaSettings, settings_from

API = "http://127.0.0.1:4000/api"
KERNEL = "0c9b5f5e-3e8a-4b7e-9a57-9f3c7d8a1b2c"


class Sent(Exception):
    """Raised in place of the SDK's HTTP request, once it is captured."""


def settings(**changes: Any) -> DaytonaSettings:
    return settings_from(DaytonaSettings, DaytonaKernelConfig(**changes))


@pytest.fixture
def sdk_requests(monkeypatch: pytest.MonkeyPatch) -> list[Request]:
    """What the SDK's REST client is asked to send (nothing goes out)."""
    from daytona_api_client_async.rest import RESTClientObject

    for name in ("DAYTONA_JWT_TOKEN", "DAYTONA_ORGANIZATION_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DAYTONA_API_KEY", "k1")
    monkeypatch.setenv("DAYTONA_API_URL", API)
    monkeypatch.setenv("DAYTONA_TARGET", "us")
    captured: list[Request] = []

    async def request(self: Any, method: str, url: str, headers: Any = None, body: Any = None, **_: Any) -> Any:
        captured.append(Request(method, url, dict(headers or {}), body))
        raise Sent(url)

    monkeypatch.setattr(RESTClientObject, "request", request)
    return captured


async def no_retry(what: str, fn: Any, *, retry: bool = True) -> Any:
    return await call_api(what, fn, retry=False, api_url=API)


def workspace(config: DaytonaSettings) -> WorkspaceSandboxes:
    return WorkspaceSandboxes(config, "ws-1", KERNEL, no_retry, API)


class Volume:
    id = "vol-1"


async def through_sdk(call: Any) -> None:
    """An SDK call whose request is captured: it ends in the capture's exception, which the SDK may wrap in its own."""
    with pytest.raises(Exception) as info:  # noqa: PT011 - the SDK's wrapper varies; only the capture matters
        await call
    assert "Sent" in repr(info.value) or isinstance(info.value.__cause__, Exception), info.value


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"sandbox_policy": "ephemeral"},
        {"idle_action": "stop", "env": {"A": "1"}, "labels": {"team": "x"}, "network_block_all": True, "target": "eu"},
        {"auto_pause_interval": 0, "auto_archive_interval": 0, "auto_delete_interval": 30},
    ],
)
async def test_every_early_request_is_the_one_the_sdk_sends(sdk_requests: list[Request], changes: dict[str, Any]) -> None:
    config = settings(**changes)
    ws = workspace(config)
    ws.retry_name = "daytona-kernel-0123456789abcdef"  # the SDK's create under the same name as the early one
    await through_sdk(ws.ready_volume(lambda text: None))
    await through_sdk(ws.find())
    await through_sdk(ws.by_id("sb-1"))
    await through_sdk(ws.create(Volume(), lambda text: None))
    await ws.close()
    headers = interpreter_headers()
    assert headers is not None
    early = EarlyApi(API, headers)
    body = ws.early_create_body("vol-1", "daytona-kernel-0123456789abcdef")
    assert body is not None
    ours = [
        early.volume_request(config.volume_name),
        early.find_request(ws.identity()),
        early.get_request("sb-1"),
        early.create_request(body),
    ]
    assert len(sdk_requests) == len(ours)
    for sdk, mine in zip(sdk_requests, ours):
        assert (mine.method, mine.url) == (sdk.method, sdk.url)
        assert mine.headers == sdk.headers
        assert mine.body == sdk.body


@pytest.mark.parametrize("changes", [{"image": "python:3.12"}, {"snapshot": "mine"}, {"gpu": 1, "image": "cuda"}])
def test_an_image_a_snapshot_or_a_gpu_takes_the_sdks_path(changes: dict[str, Any]) -> None:
    assert workspace(settings(**changes)).early_create_body("vol-1", "n") is None


# -- against the emulator ------------------------------------------------------------------------------------------


@pytest.fixture
def volume_ready(daytona_env: Any) -> Any:
    """The kernel's volume exists and is ready (the early path leaves making it to the SDK's)."""
    if not any(v.name == "daytona-kernel" and v.state == "ready" for v in daytona_env.volumes.values()):
        daytona_env.add_volume("daytona-kernel")
    return daytona_env


def start_in_process(folder: Path, **changes: Any) -> tuple[Any, Any]:
    """A kernel's backend started in this process (its first start, as at a kernel's start); the sandbox and what
    the start raised (None when it started)."""
    from daytona_kernel.backends.daytona.sandbox import DaytonaSandbox

    sandbox = DaytonaSandbox(settings(**changes), f"early-{folder.name}", KERNEL)

    async def go() -> Any:
        try:
            await sandbox.start(lambda text: None)
            context = await sandbox.take_next_context()
            if context is None:
                context = await sandbox.toolbox.create_context()
            await sandbox.sdk_sandbox()
            return None
        except Exception as exc:  # what the user would see: compared by the caller
            return exc
        finally:
            await sandbox.shutdown()

    return sandbox, asyncio.run(go())


def test_the_create_leaves_before_the_sdks_client_exists(
    volume_ready: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's client is held back until the create was sent (at most 30 s): with the early path the start
    goes on; the order of the two is what is checked, not a time."""
    daytona_env = volume_ready
    made = WorkspaceSandboxes._new_client
    order: list[str] = []

    def held_back(self: WorkspaceSandboxes) -> Any:
        deadline = threading.Event()
        for _ in range(300):
            if "POST /api/sandbox" in daytona_env.sequence:
                break
            deadline.wait(0.1)
        order.append(f"client after {daytona_env.sequence.count('POST /api/sandbox')} create(s)")
        return made(self)

    monkeypatch.setattr(WorkspaceSandboxes, "_new_client", held_back)
    sandbox, failure = start_in_process(tmp_path, sandbox_policy="ephemeral")
    assert failure is None, failure
    assert order and order[0] != "client after 0 create(s)", order
    assert daytona_env.count("POST /api/sandbox") >= 1


def test_a_wrong_key_ends_in_the_sdk_paths_message(volume_ready: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from daytona_kernel.backends.daytona.sandbox import DaytonaSandbox

    daytona_env = volume_ready
    monkeypatch.setenv("DAYTONA_API_KEY", "dtn_wrong")
    _, early = start_in_process(tmp_path, sandbox_policy="ephemeral")
    sent_early = daytona_env.count("GET /api/volumes/by-name")
    monkeypatch.setattr(DaytonaSandbox, "_early_start", lambda self, progress: asyncio.sleep(0, False))
    _, sdk_only = start_in_process(tmp_path, sandbox_policy="ephemeral")
    assert sent_early >= 2  # the early path asked too, and then the SDK's
    assert type(early) is type(sdk_only) and str(early) == str(sdk_only), (early, sdk_only)
    assert "DAYTONA_API_KEY" in str(early)


def test_a_lost_create_answer_on_the_early_path_bills_one_sandbox(
    volume_ready: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early create is made, its answer lost (503) and the list lags: the SDK's path finds it by its name."""
    daytona_env = volume_ready
    monkeypatch.setattr(daytona_env, "list_lag_s", 120.0)
    before = set(daytona_env.sandboxes)
    daytona_env.fail_after_create(503)
    sandbox, failure = start_in_process(tmp_path, sandbox_policy="reuse", idle_action="stop")
    assert failure is None, failure
    made = [sid for sid in daytona_env.sandboxes if sid not in before]
    assert made == [sandbox.id], made
    for sid in made:
        daytona_env.delete_sandbox_now(sid)
