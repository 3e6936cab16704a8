"""A restart's loading window (docs/reattach.md, "The first cell after a restart"): what a kernel process does
after a quick start while the daytona SDK loads in the background.

Each test drives the backend as the kernel does, through its public calls (``start``, ``sdk_sandbox``,
``toolbox.create_context``, ``take_next_context``, ``detach``, ``shutdown``), from a handoff file on disk as the old
process leaves it, and judges what can be seen from outside: what a call returned or raised, the event loop's
tasks, the log, and (where a sandbox is needed) the requests and sandboxes the Daytona emulator saw. A broken
SDK install (``sdk_broken``) makes every load fail at once, with no request sent."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import ssl
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from daytona_kernel.backends.daytona.restart_handoff import (
    Handoff,
    handoff_path,
    interpreter_headers,
    settings_fingerprint,
    write_handoff,
)
from daytona_kernel.backends.daytona.restart_socket import HandedOverToolbox
from daytona_kernel.backends.daytona.sandbox import DaytonaSandbox
from daytona_kernel.config import DEFAULT_MOUNT_PATH, SANDBOX_WORKDIR, DaytonaKernelConfig, DaytonaSettings, settings_from
from daytona_kernel.errors import BackendError

KERNEL = "k1"
SID, CID = "7d1f0b52-aaaa-bbbb-cccc-0123456789ab", "5e1c7a3d-1111-2222-3333-444455556666"
DAYTONA_TOOLBOX = "https://proxy.app.daytona.io/toolbox"  # under the default API's domain (app.daytona.io)


def quiet(text: str) -> None:
    """A progress callback that shows nothing."""


def settings() -> DaytonaSettings:
    return settings_from(DaytonaSettings, DaytonaKernelConfig(backend="daytona"))


def sandbox(key: str = "key") -> DaytonaSandbox:
    return DaytonaSandbox(settings(), key, KERNEL)


def hand_over(
    box: DaytonaSandbox, key: str = "key", sandbox_id: str = SID, toolbox_url: str = DAYTONA_TOOLBOX, **fields: Any
) -> Handoff:
    """The handoff file the old process of this kernel leaves at a restart (``leave_next_context``), for ``box``'s
    settings and API."""
    target = os.environ.get("DAYTONA_TARGET", "")
    fingerprint = settings_fingerprint(settings(), key, box.api_url, target)
    handoff = Handoff(KERNEL, sandbox_id, toolbox_url, CID, fingerprint, time.time(), DEFAULT_MOUNT_PATH)
    handoff = dataclasses.replace(handoff, **fields)
    write_handoff(handoff)
    return handoff


def handoff_left() -> bool:
    path = handoff_path(KERNEL)
    assert path is not None
    return path.exists()


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """A kernel process's environment: its own data folder (the handoff's and the fingerprint key's), the API key,
    no proxy and no ~/.netrc."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DAYTONA_API_KEY", "key")
    return monkeypatch


@pytest.fixture
def sdk_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's client cannot be imported (a broken install): the SDK's load fails at once, before any request,
    with the kernel's "Could not load the daytona SDK" (the quick start's own path needs no SDK)."""
    import daytona

    monkeypatch.delattr(daytona, "AsyncDaytona", raising=False)  # the package imports it lazily from here
    monkeypatch.setitem(sys.modules, "daytona._async.daytona", None)  # the SDK's module, not the kernel's state


async def test_a_failed_load_reaches_every_later_caller(env: pytest.MonkeyPatch, sdk_broken: None) -> None:
    """Not 'The sandbox is not ready yet.' from the second caller on: the first caller after a quick start is
    the supervisor's install in the left context, which falls back quietly, so the cell would show that."""
    box = sandbox()
    hand_over(box)
    await box.start(quiet)  # the quick start: it returns while the SDK loads
    assert box.loading and not handoff_left()
    for _ in range(3):
        with pytest.raises(BackendError, match="Could not load the daytona SDK"):
            await box.sdk_sandbox()
    with pytest.raises(BackendError, match="Could not load the daytona SDK"):
        await box.toolbox.create_context()
    await box.detach()


@pytest.mark.parametrize(
    ("name", "quick"),
    [("HTTP_PROXY", False), ("https_proxy", False), ("WSS_PROXY", False), ("WS_PROXY", False), ("ALL_PROXY", True), (None, True)],
)
async def test_a_proxy_in_the_environment_gives_the_normal_start(
    env: pytest.MonkeyPatch, sdk_broken: None, name: str | None, quick: bool
) -> None:
    """The SDK's sessions honour the environment's proxies (aiohttp's trust_env: http, https, ws and wss; not
    ALL_PROXY); tornado's client, which the quick start uses, cannot go through one. Where only the proxy reaches
    Daytona, a quick start that connected directly would hang or fail on every restart: with a proxy, the normal
    start, which loads the SDK before it returns (here it fails saying so); the left context is deleted once it
    has the sandbox (``test_a_context_a_proxy_kept_from_the_quick_start_is_deleted``)."""
    if name is not None:
        env.setenv(name, "http://127.0.0.1:9")
    box = sandbox()
    hand_over(box)
    if quick:
        await box.start(quiet)
        assert box.loading and box.without_sdk() is not None  # the first cell goes without the SDK
        await box.detach()
    else:
        with pytest.raises(BackendError, match="Could not load the daytona SDK"):
            await box.start(quiet)
        assert box.without_sdk() is None
    assert not handoff_left()  # read once, whatever came of it


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_a_proxy_set_in_the_systems_settings_counts_where_urllib_reads_them(env: pytest.MonkeyPatch, platform: str) -> None:
    """On macOS and Windows urllib's getproxies(), which aiohttp's trust_env reads, falls back to the system's
    proxy settings when the environment names none: the SDK then goes through that proxy, so the quick start
    (which cannot) must not take the environment's silence for "no proxy"."""
    import urllib.request

    from daytona_kernel.backends.daytona.restart_handoff import proxied

    env.setattr(sys, "platform", platform)
    env.setattr(urllib.request, "getproxies", lambda: {"https": "http://proxy.corp:3128"})
    env.setattr(urllib.request, "proxy_bypass", lambda host: False)
    assert "HTTPS_PROXY" in proxied("wss://proxy.app.daytona.io/toolbox/x")


async def test_a_proxy_the_toolbox_host_bypasses_keeps_the_quick_start(env: pytest.MonkeyPatch, sdk_broken: None) -> None:
    env.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    env.setenv("NO_PROXY", ".daytona.io")
    box = sandbox()
    hand_over(box)
    await box.start(quiet)  # with the SDK's path it would raise: its load fails
    assert box.loading and box.without_sdk() is not None
    await box.detach()


class Proxy:
    """An HTTP server on loopback (a proxy, or the toolbox itself) that answers every request with ``status`` and
    ``body``: the request lines and headers it got."""

    def __init__(self, status: bytes = b"200 OK", body: bytes = b'{"id": "c1"}') -> None:
        self.requests: list[bytes] = []
        self.status, self.body = status, body
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.requests.append(head)
        length = int(
            next((line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), b"0")
        )
        await reader.readexactly(length)
        head = b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
            self.status,
            len(self.body),
        )
        writer.write(head + self.body)
        await writer.drain()
        writer.close()


async def test_a_netrc_entry_for_the_toolbox_host_is_never_sent(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The request carries the key's Authorization and nothing from ~/.netrc (the SDK's aiohttp would refuse the
    pair; tornado's client never reads it)."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password netrc-secret\n")
    netrc.chmod(0o600)
    env.setenv("NETRC", str(netrc))
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
    env: pytest.MonkeyPatch, self_signed: tuple[Path, Path]
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


async def test_deleting_a_context_the_daemon_no_longer_has_is_done(env: pytest.MonkeyPatch) -> None:
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


async def test_a_quick_start_installs_with_the_volume_folder_the_old_process_had(env: pytest.MonkeyPatch) -> None:
    """A sandbox whose volume is not at the configured mount path (an older layout, or drift) has no volume
    folder on the normal path; the quick start, which installs the runtime before the sandbox is fetched,
    takes the old process's (else the first cell says "the volume is not mounted at ...")."""
    box = sandbox()
    assert box.volume_dir == DEFAULT_MOUNT_PATH  # the configured one
    hand_over(box, volume_dir="")
    await box.start(quiet)
    assert (box.id, box.volume_dir) == (SID, "")
    await box.detach()  # a restart before the SDK's load has run: nothing of it is left


async def test_a_process_that_leaves_while_the_sdk_loads_cancels_the_load(env: pytest.MonkeyPatch, sdk_broken: None) -> None:
    """A restart while the SDK loads: the process exits right after detach; a load left pending would be
    destroyed at exit ('Task was destroyed but it is pending!' in the kernel's log)."""
    box = sandbox()
    hand_over(box)
    before = asyncio.all_tasks()
    await box.start(quiet)
    (load,) = asyncio.all_tasks() - before  # the SDK's load, in the background
    await box.detach()
    await asyncio.wait({load})
    assert load.cancelled()  # left to run, it would have failed (the SDK is broken here)


async def test_a_quick_start_checks_the_handed_over_url_against_the_configured_api(
    env: pytest.MonkeyPatch, sdk_broken: None
) -> None:
    """The slow test's 'foreign origin' case would pass even without the check (the foreign host does not
    resolve, so the handshake fails and the normal start follows); here the start itself refuses it and takes the
    SDK's path (which fails here, saying so)."""
    env.setenv("DAYTONA_API_URL", "http://127.0.0.1:9/api")  # nothing listens: the early path gives up at once
    box = sandbox()
    hand_over(box, toolbox_url="https://toolbox.example.com/toolbox")
    with pytest.raises(BackendError, match="Could not load the daytona SDK"):
        await box.start(quiet)
    assert box.without_sdk() is None and not handoff_left()


async def test_a_failed_background_journal_look_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """After a quick start the journal's look runs in the background (not needed for the first result); its
    failure (the load's, which can be anything) is logged, not lost as an unretrieved task exception."""
    from fakes import FakeSandbox

    from daytona_kernel.config import SessionSettings
    from daytona_kernel.journal import KernelIdentity, SessionJournal
    from daytona_kernel.outputs import OutputPolicy
    from daytona_kernel.runtime.calls import RuntimeOptions
    from daytona_kernel.supervisor import ContextSupervisor

    class FailingJournal(SessionJournal):
        looks: list[asyncio.Task[Any]] = []

        async def look(self, mine: str, scanned: dict[str, Any]) -> str:
            task = asyncio.current_task()
            assert task is not None
            self.looks.append(task)
            raise RuntimeError("the load failed")

    log = logging.getLogger("test-supervisor")
    box = FakeSandbox()
    box.loading = True  # a quick start's: the SDK still loads
    journal = FailingJournal(box, SessionSettings(), KernelIdentity("k", "nb.ipynb"), OutputPolicy(trusted=True), log)
    supervisor = ContextSupervisor(box, SessionSettings(), log, RuntimeOptions(), journal)
    with caplog.at_level(logging.WARNING, "test-supervisor"):
        await supervisor.ready()  # the first cell's context: not held up by the look
        (looking,) = journal.looks
        await asyncio.wait({looking})
    assert "the session journal could not be read after the restart: the load failed" in caplog.text


# -- against the emulator: the sandbox a restart hands over ----------------------------------------------------------


@pytest.fixture
def emu(daytona_env: Any, env: pytest.MonkeyPatch) -> Any:
    """The emulator, its volume ready, this test's data folder and the emulator's API key."""
    for key, value in daytona_env.env().items():
        env.setenv(key, value)
    env.delenv("NETRC")  # aiohttp's sessions read ~/.netrc (and warn about a NETRC that names no file)
    if not any(v.name == "daytona-kernel" and v.state == "ready" for v in daytona_env.volumes.values()):
        daytona_env.add_volume("daytona-kernel")
    return daytona_env


async def first_process(key: str) -> str:
    """A kernel's first process in a new workspace: its sandbox created and started, and let go at a restart
    (``detach``: the sandbox keeps running). Its id."""
    box = sandbox(key)
    await box.start(quiet)
    await box.take_next_context()  # made by an early first start: ours, so detach deletes it
    await box.sdk_sandbox()
    await box.detach()
    return box.id


async def test_a_handed_over_sandbox_gone_at_the_start_is_a_new_generation(emu: Any) -> None:
    """The quick start counted sandbox A (its first cell and the mirror's first push went there); if A turns
    out gone at the start and B is created, B has none of A's files: the mirror sends them again and the
    repository is staged again, as for any new sandbox."""
    key = f"window-{uuid.uuid4().hex[:8]}"
    a = await first_process(key)
    box = sandbox(key)
    hand_over(box, key, sandbox_id=a, toolbox_url=emu.toolbox_url)
    stopping = emu.transition_s["stopping"]
    emu.transition_s["stopping"] = 3600.0
    try:
        emu.stop_sandbox(a)  # stopping until it is deleted: the start waits for it
    finally:
        emu.transition_s["stopping"] = stopping  # for the other sandboxes (B's stop at shutdown)
    emu.reset_counts()
    await box.start(quiet)
    assert (box.id, box.generation) == (a, 1)  # the quick start's
    while emu.sequence.count("GET /api/sandbox/{sid}") < 2:  # found A by its id, then looked again: it waits
        await asyncio.sleep(0.01)
    emu.delete_sandbox_now(a)  # gone while the start waits for it
    await box.sdk_sandbox()
    try:
        assert box.id != a and emu.sandboxes[box.id].state == "started"
        assert box.generation == 2
    finally:
        await box.shutdown()


async def test_a_map_engine_waits_for_the_main_sandboxs_sdk_load(emu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``%%daytona map`` as the first cell after a quick restart: the engines borrow the main sandbox's client,
    which is still loading in its thread; an engine waits for that load instead of making the SDK's client again
    on the event loop (about 1 s with the loop blocked: no status, no control messages)."""
    import daytona
    from daytona import AsyncDaytona

    key = f"window-{uuid.uuid4().hex[:8]}"
    a = await first_process(key)
    made_on: list[threading.Thread] = []

    class Recorded(AsyncDaytona):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made_on.append(threading.current_thread())
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(daytona, "AsyncDaytona", Recorded)  # what the kernel imports to make its client
    main = sandbox(key)
    hand_over(main, key, sandbox_id=a, toolbox_url=emu.toolbox_url)
    await main.start(quiet)
    assert main.loading  # the quick start: the SDK's client is made meanwhile
    engine = DaytonaSandbox(settings(), key, KERNEL, worker=1, main=main)
    try:
        await engine.start(quiet)
        await main.sdk_sandbox()
        assert engine.id != main.id == a
        assert len(made_on) == 1 and made_on[0] is not threading.main_thread()
    finally:
        await engine.shutdown()
        await main.shutdown()


async def test_a_context_a_proxy_kept_from_the_quick_start_is_deleted(emu: Any, env: pytest.MonkeyPatch) -> None:
    """A restart whose handoff a proxy keeps from the quick start: the normal start, and the context the old
    process left for it (named by no label: that process restarted before its SDK had loaded) is deleted once the
    start has the sandbox; else it would stay alive and count as another kernel's at shutdown."""
    key = f"window-{uuid.uuid4().hex[:8]}"
    a = await first_process(key)
    box = sandbox(key)
    headers = interpreter_headers()
    assert headers is not None
    left = Handoff(KERNEL, a, emu.toolbox_url, "", "", 0.0)
    toolbox = HandedOverToolbox(left.sandbox_url, left.interpreter_url, headers)
    try:
        context_id = await toolbox.create_context(SANDBOX_WORKDIR)  # what the old process left, without the SDK
    finally:
        await toolbox.close()
    # the handoff names the toolbox as "localhost", which the proxy covers; the API's 127.0.0.1 it does not
    hand_over(box, key, sandbox_id=a, toolbox_url=emu.toolbox_url.replace("127.0.0.1", "localhost"), context_id=context_id)
    env.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    env.setenv("NO_PROXY", "127.0.0.1")
    assert context_id in emu.sandboxes[a].contexts
    try:
        await box.start(quiet)
        assert not box.loading and box.id == a  # the normal start, through the SDK
        assert await box.take_next_context() is None
        assert context_id not in emu.sandboxes[a].contexts
    finally:
        await box.shutdown()
