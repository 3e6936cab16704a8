"""A restart's loading window (docs/reattach.md, "The first cell after a restart"): what a kernel process does
after a quick start while the daytona SDK loads in the background. In process: no kernel, no emulator."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from daytona_kernel.backends.daytona.restart_handoff import Handoff, write_handoff
from daytona_kernel.backends.daytona.restart_socket import HandedOverToolbox
from daytona_kernel.backends.daytona.sandbox import DaytonaSandbox
from daytona_kernel.config import DaytonaKernelConfig, DaytonaSettings, settings_from
from daytona_kernel.errors import BackendError, SandboxGone


def sandbox() -> DaytonaSandbox:
    return DaytonaSandbox(settings_from(DaytonaSettings, DaytonaKernelConfig(backend="daytona")), "key", "k1")


async def test_a_failed_load_reaches_every_later_caller() -> None:
    """Not 'The sandbox is not ready yet.' from the second caller on: the first caller after a quick start is
    the supervisor's install in the left context, which falls back quietly, so the cell would show that."""
    box = sandbox()

    async def load() -> None:
        raise BackendError("Could not load the daytona SDK (boom). Reinstall it")

    box._loading = asyncio.ensure_future(load())
    for _ in range(3):
        with pytest.raises(BackendError, match="Could not load the daytona SDK"):
            await box.sdk_sandbox()
    with pytest.raises(BackendError, match="Could not load the daytona SDK"):
        await box.create_context()


class Proxy:
    """An HTTP server on loopback (a proxy, or the toolbox itself) that answers every request with ``status`` and
    ``body``: the request lines and headers it got."""

    def __init__(self, status: bytes = b"200 OK", body: bytes = b'{"id": "c1"}') -> None:
        self.requests: list[bytes] = []
        self._status, self._body = status, body

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.requests.append(head)
        length = int(
            next((line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), b"0")
        )
        await reader.readexactly(length)
        body = self._body
        head = b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
            self._status,
            len(body),
        )
        writer.write(head + body)
        await writer.drain()
        writer.close()


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    return monkeypatch


@pytest.mark.parametrize(
    ("name", "quick"),
    [("HTTP_PROXY", False), ("https_proxy", False), ("WSS_PROXY", False), ("WS_PROXY", False), ("ALL_PROXY", True), (None, True)],
)
async def test_a_proxy_in_the_environment_gives_the_normal_start(
    proxy_env: pytest.MonkeyPatch, tmp_path: Path, name: str | None, quick: bool
) -> None:
    """The SDK's sessions honour the environment's proxies (aiohttp's trust_env: http, https, ws and wss; not
    ALL_PROXY); tornado's client, which the quick start uses, cannot go through one. Where only the proxy reaches
    Daytona, a quick start that connected directly would hang or fail on every restart: with a proxy, the normal
    start (the SDK), and the left context is deleted once it has the sandbox."""
    proxy_env.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    proxy_env.setenv("DAYTONA_API_KEY", "key")
    if name is not None:
        proxy_env.setenv(name, "http://127.0.0.1:9")
    box = sandbox()
    sid, cid = "7d1f0b52-aaaa-bbbb-cccc-0123456789ab", "5e1c7a3d-1111-2222-3333-444455556666"
    write_handoff(Handoff("k1", sid, "https://proxy.app.daytona.io/toolbox", cid, box._fingerprint, time.time()))
    assert box._quick_start() is quick
    if quick:
        assert box._loading is not None
        box._loading.cancel()  # not this test's business: the SDK's load
    else:
        assert box._loading is None and box._handed_over is None
        assert box._unclaimed is not None and box._unclaimed.context_id == cid


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_a_proxy_set_in_the_systems_settings_counts_where_urllib_reads_them(proxy_env: pytest.MonkeyPatch, platform: str) -> None:
    """On macOS and Windows urllib's getproxies(), which aiohttp's trust_env reads, falls back to the system's
    proxy settings when the environment names none: the SDK then goes through that proxy, so the quick start
    (which cannot) must not take the environment's silence for "no proxy"."""
    import urllib.request

    from daytona_kernel.backends.daytona.restart_handoff import proxied

    proxy_env.setattr(sys, "platform", platform)
    proxy_env.setattr(urllib.request, "getproxies", lambda: {"https": "http://proxy.corp:3128"})
    proxy_env.setattr(urllib.request, "proxy_bypass", lambda host: False)
    assert "HTTPS_PROXY" in proxied("wss://proxy.app.daytona.io/toolbox/x")


async def test_a_proxy_the_toolbox_host_bypasses_keeps_the_quick_start(proxy_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    proxy_env.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    proxy_env.setenv("DAYTONA_API_KEY", "key")
    proxy_env.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    proxy_env.setenv("NO_PROXY", ".daytona.io")
    box = sandbox()
    write_handoff(Handoff("k1", "sb1", "https://proxy.app.daytona.io/toolbox", "c1", box._fingerprint, time.time()))
    assert box._quick_start()
    assert box._loading is not None
    box._loading.cancel()


async def test_a_netrc_entry_for_the_toolbox_host_is_never_sent(proxy_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The request carries the key's Authorization and nothing from ~/.netrc (the SDK's aiohttp would refuse the
    pair; tornado's client never reads it)."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password netrc-secret\n")
    netrc.chmod(0o600)
    proxy_env.setenv("NETRC", str(netrc))
    toolbox_server = Proxy()
    async with toolbox_server as url:
        toolbox = HandedOverToolbox(f"{url}/toolbox/sb", "ws://127.0.0.1:9/x", {"Authorization": "Bearer k"})
        try:
            assert await toolbox.create_context("/w") == "c1"
        finally:
            await toolbox.close()
    (request,) = toolbox_server.requests
    assert b"Authorization: Bearer k" in request
    assert b"netrc-secret" not in request and b"c29tZW9uZTpuZXRyYy1zZWNyZXQ" not in request


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_the_handed_over_toolbox_verifies_the_toolboxs_certificate(
    proxy_env: pytest.MonkeyPatch, self_signed: tuple[Path, Path]
) -> None:
    """As the SDK's sessions (ssl.create_default_context()): a certificate the system does not trust ends the
    connection before any request, and so before the key, is sent."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*self_signed)
    got: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            got.append(await reader.read(1024))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    toolbox = HandedOverToolbox(
        f"{url}/toolbox/sb", f"wss{url[5:]}/toolbox/sb/process/interpreter/execute", {"Authorization": "Bearer k"}
    )
    try:
        with pytest.raises(BackendError, match="CERTIFICATE_VERIFY_FAILED"):
            await toolbox.create_context("/w")
        with pytest.raises(ssl.SSLCertVerificationError):
            await toolbox.connect()
    finally:
        await toolbox.close()
        server.close()
        await server.wait_closed()
    assert not any(b"Bearer" in data for data in got)


async def test_deleting_a_context_the_daemon_no_longer_has_is_done(proxy_env: pytest.MonkeyPatch) -> None:
    """The daemon answers 404 for a context that is already gone (apps/daemon/pkg/toolbox/process/interpreter/
    controller.go, lines 199-201): done, not a failure that makes a restart wait for the SDK to delete it again."""
    toolbox_server = Proxy(b"404 Not Found", b'{"message": "context not found"}')
    async with toolbox_server as url:
        toolbox = HandedOverToolbox(f"{url}/toolbox/sb", "ws://127.0.0.1:9/x", {"Authorization": "Bearer k"})
        try:
            await toolbox.delete_context("c1")
        finally:
            await toolbox.close()
    assert [r.split(b"\r\n")[0] for r in toolbox_server.requests] == [
        b"DELETE /toolbox/sb/process/interpreter/context/c1 HTTP/1.1"
    ]


class Stop(Exception):
    """Where the test stops the start: after the sandbox in use is settled."""


class Workspace:
    """The workspace's lookups: the handed-over sandbox ``A`` is found by its id; ``create`` makes ``B``."""

    policy = None
    notices: list[str] = []
    mount_path = "/home/daytona/volume"
    created_early = ""  # no early first start (early)

    async def open_client(self) -> None:
        return None

    async def check_gpu(self) -> str:
        return ""

    async def ready_volume(self, progress: Any) -> str:
        return "volume"

    async def find(self, sandbox_id: str = "") -> Any:
        return SimpleNamespace(id=sandbox_id, auto_pause_interval=0, labels={})

    async def create(self, volume: Any, progress: Any) -> Any:
        return SimpleNamespace(id="B", auto_pause_interval=0, labels={})


async def test_a_handed_over_sandbox_replaced_after_it_is_gone_is_a_new_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The quick start counted sandbox A (its first cell and the mirror's first push went there); if A turns
    out gone at the start and B is created, B has none of A's files: the mirror sends them again and the
    repository is staged again, as for any new sandbox."""
    box = sandbox()
    box._workspace = Workspace()  # type: ignore[assignment]
    box.generation = 1  # the quick start's
    monkeypatch.setattr("daytona_kernel.backends.daytona.sandbox.drift_notice", lambda *args: "")

    async def ensure_started(progress: Any) -> None:
        if box._sandbox.id == "A":
            raise SandboxGone("sandbox A is gone")

    async def prepare_workdir() -> None:
        raise Stop

    box._ensure_started = ensure_started  # type: ignore[method-assign]
    box._prepare_workdir = prepare_workdir  # type: ignore[method-assign]
    with pytest.raises(Stop):
        await box._locate(lambda text: None, prefer="A")
    assert (box.id, box.generation) == ("B", 2)


async def test_a_map_worker_waits_for_the_main_sandboxs_sdk_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """``%%daytona map`` as the first cell after a quick restart: the workers borrow the main sandbox's client,
    which is still loading in its thread; a worker waits for that load instead of importing the SDK again on
    the event loop (about 1 s with the loop blocked: no status, no control messages)."""
    main = sandbox()
    worker = DaytonaSandbox(main._config, "key", "k1", worker=1, main=main)
    made_on: list[threading.Thread] = []
    client = object()

    def new_client() -> Any:
        made_on.append(threading.current_thread())
        time.sleep(0.2)  # the import
        return client

    monkeypatch.setattr(main._workspace, "_new_client", new_client)
    loading = asyncio.ensure_future(main._workspace.open_client())
    await asyncio.sleep(0)
    await worker._workspace.open_client()
    assert worker._workspace._client_or_open() is client
    await loading
    assert len(made_on) == 1 and made_on[0] is not threading.main_thread()


async def test_a_quick_start_installs_with_the_volume_folder_the_old_process_had(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A sandbox whose volume is not at the configured mount path (an older layout, or drift) has no volume
    folder on the normal path; the quick start, which installs the runtime before the sandbox is fetched,
    takes the old process's (else the first cell says "the volume is not mounted at ...")."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DAYTONA_API_KEY", "key")
    box = sandbox()
    sid, cid = "7d1f0b52-aaaa-bbbb-cccc-0123456789ab", "5e1c7a3d-1111-2222-3333-444455556666"
    write_handoff(Handoff("k1", sid, "https://proxy.app.daytona.io/toolbox", cid, box._fingerprint, time.time(), volume_dir=""))
    assert box._quick_start()
    assert box._loading is not None
    box._loading.cancel()  # not this test's business: the SDK's load
    assert (box.id, box.volume_dir) == (sid, "")


async def test_a_failed_background_journal_look_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """After a quick start the journal's look runs in the background (not needed for the first result); its
    failure (the load's, which can be anything) is logged, not lost as an unretrieved task exception."""
    from fakes import FakeSandbox

    from daytona_kernel.config import SessionSettings
    from daytona_kernel.runtime.calls import RuntimeOptions
    from daytona_kernel.supervisor import ContextSupervisor

    supervisor = ContextSupervisor(FakeSandbox(), SessionSettings(), logging.getLogger("test-supervisor"), RuntimeOptions())

    async def look() -> None:
        raise RuntimeError("the load failed")

    looking = asyncio.ensure_future(look())
    supervisor._looking.add(looking)
    await asyncio.wait({looking})
    with caplog.at_level(logging.WARNING, "test-supervisor"):
        supervisor._looked(looking)
    assert not supervisor._looking and "the load failed" in caplog.text


async def test_a_process_that_leaves_while_the_sdk_loads_cancels_the_load() -> None:
    """A restart while the SDK loads: the process exits right after detach; a load left pending would be
    destroyed at exit ('Task was destroyed but it is pending!' in the kernel's log)."""
    box = sandbox()
    box._loading = asyncio.ensure_future(asyncio.sleep(3600))
    loading = box._loading
    await box._close_client()
    await asyncio.wait({loading})
    assert loading.cancelled()


async def test_a_quick_start_checks_the_handed_over_url_against_the_configured_api(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The slow test's 'foreign origin' case would pass even without the check (the foreign host does not
    resolve, so the handshake fails and the normal start follows); here the start itself refuses it."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DAYTONA_API_KEY", "key")
    box = sandbox()
    sid, cid = "7d1f0b52-aaaa-bbbb-cccc-0123456789ab", "5e1c7a3d-1111-2222-3333-444455556666"
    write_handoff(Handoff("k1", sid, "https://toolbox.example.com/toolbox", cid, box._fingerprint, time.time()))
    assert not box._quick_start()
    assert box._loading is None and box._handed_over is None
