"""The restart's handoff record (daytona_kernel/backends/daytona/restart_handoff.py): what the old kernel process tells
the next one, and every reason the next one refuses it. Pure: no kernel, no emulator."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from daytona_kernel.backends.daytona.restart_handoff import (
    HANDOFF_MAX_AGE_S,
    Handoff,
    acceptable_url,
    handoff_path,
    interpreter_headers,
    settings_fingerprint,
    take_handoff,
    write_handoff,
)
from daytona_kernel.config import DaytonaKernelConfig, DaytonaSettings, settings_from

KERNEL = "0c9b5f5e-3e8a-4b7e-9a57-9f3c7d8a1b2c"
API = "http://127.0.0.1:4000/api"


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def settings(**changes: Any) -> DaytonaSettings:
    return settings_from(DaytonaSettings, DaytonaKernelConfig(**changes))


def record(**changes: Any) -> Handoff:
    fields: dict[str, Any] = {
        "kernel_id": KERNEL,
        "sandbox_id": "7d1f0b52-aaaa-bbbb-cccc-0123456789ab",
        "toolbox_url": "http://127.0.0.1:4000/toolbox",
        "context_id": "5e1c7a3d-1111-2222-3333-444455556666",
        "fingerprint": settings_fingerprint(settings(), "ws-1", API, "us"),
        "written_at": time.time(),
    }
    fields.update(changes)
    return Handoff(**fields)


def take(**changes: Any) -> Handoff | None:
    args: dict[str, Any] = {
        "kernel_id": KERNEL,
        "fingerprint": settings_fingerprint(settings(), "ws-1", API, "us"),
        "api_url": API,
    }
    args.update(changes)
    return take_handoff(**args)


def test_a_handoff_is_read_once_and_is_private() -> None:
    handoff = record()
    write_handoff(handoff)
    path = handoff_path(KERNEL)
    assert path is not None and path.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert take() == handoff
    assert not path.exists()  # consumed
    assert take() is None


def test_the_interpreter_url_is_the_sdks() -> None:
    assert (
        record().interpreter_url == "ws://127.0.0.1:4000/toolbox/7d1f0b52-aaaa-bbbb-cccc-0123456789ab/process/interpreter/execute"
    )
    assert record(toolbox_url="https://proxy.app.daytona.io/toolbox/").interpreter_url.startswith(
        "wss://proxy.app.daytona.io/toolbox/7d1f"
    )


def test_a_handoff_holds_no_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAYTONA_API_KEY", "dtn_secret_key_123")
    write_handoff(record())
    path = handoff_path(KERNEL)
    assert path is not None
    text = path.read_text()
    assert "dtn_secret_key_123" not in text and "Bearer" not in text and "Authorization" not in text


@pytest.mark.parametrize(
    "changes",
    [
        {"written_at": -HANDOFF_MAX_AGE_S - 1},  # stale (seconds from now)
        {"written_at": 60},  # from the future
        {"kernel_id": "another-kernel"},  # another kernel's (a copied file)
        {"fingerprint": settings_fingerprint(settings(image="python:3.12"), "ws-1", API, "us")},  # other settings
        {"sandbox_id": "../../etc"},
        {"context_id": "a/b"},
        {"toolbox_url": "http://evil.example.com/toolbox"},  # a foreign origin
        {"volume_dir": "relative/folder"},
    ],
)
def test_a_handoff_that_does_not_fit_is_refused_and_deleted(changes: dict[str, Any]) -> None:
    if "written_at" in changes:
        changes = {"written_at": time.time() + changes["written_at"]}
    handoff = record(**changes)
    path = handoff_path(KERNEL)
    assert path is not None
    write_handoff(handoff)
    if handoff.kernel_id != KERNEL:  # a file of another kernel's, under this kernel's name
        write_handoff(record())
        path.write_text(json.dumps({**json.loads(path.read_text()), "kernel_id": handoff.kernel_id}))
    refused: list[Handoff] = []
    assert take(refused=refused) is None
    assert not path.exists()
    # its context is one this kernel left (deleted by the next start, through the SDK at the API's toolbox URL, never the
    # record's) only when the record is otherwise sound
    mine = "written_at" in changes or "fingerprint" in changes or "toolbox_url" in changes
    assert refused == ([handoff] if mine else [])


def test_the_fingerprint_follows_what_chooses_the_sandbox() -> None:
    base = settings_fingerprint(settings(), "ws-1", API, "us")
    assert base == settings_fingerprint(settings(), "ws-1", API, "us")
    for other in (
        settings_fingerprint(settings(snapshot="other"), "ws-1", API, "us"),
        settings_fingerprint(settings(sandbox_policy="ephemeral"), "ws-1", API, "us"),
        settings_fingerprint(settings(), "ws-2", API, "us"),
        settings_fingerprint(settings(), "ws-1", "https://app.daytona.io/api", "us"),
        settings_fingerprint(settings(), "ws-1", API, "eu"),
    ):
        assert other != base


def test_a_handoff_others_can_write_or_a_link_is_ignored(data_dir: Path) -> None:
    write_handoff(record())
    path = handoff_path(KERNEL)
    assert path is not None
    os.chmod(path, 0o622)
    assert take() is None and not path.exists()
    target = data_dir / "elsewhere.json"
    write_handoff(record())
    os.replace(path, target)
    os.symlink(target, path)
    assert take() is None


@pytest.mark.parametrize("raw", [b"", b"not json", b"[]", b'{"kernel_id": 1}', b"x" * 10000])
def test_a_damaged_handoff_is_ignored(raw: bytes) -> None:
    path = handoff_path(KERNEL)
    assert path is not None
    path.parent.mkdir(parents=True, mode=0o700)
    path.write_bytes(raw)
    path.chmod(0o600)
    assert take() is None


def test_a_kernel_id_that_cannot_name_a_file_has_no_handoff() -> None:
    assert handoff_path("../x") is None and handoff_path("") is None
    write_handoff(record(kernel_id="../x"))  # nothing written, nothing raised
    assert take(kernel_id="../x") is None


@pytest.mark.parametrize(
    ("url", "api_url", "ok"),
    [
        ("http://127.0.0.1:4000/toolbox", "http://127.0.0.1:4000/api", True),
        ("http://localhost:4000/toolbox", "http://127.0.0.1:4000/api", True),
        ("https://proxy.app.daytona.io/toolbox", "https://app.daytona.io/api", True),
        ("https://app.daytona.io/toolbox", "https://app.daytona.io/api", True),
        ("http://proxy.app.daytona.io/toolbox", "https://app.daytona.io/api", False),  # the key in clear text
        ("https://proxy.evil.io/toolbox", "https://app.daytona.io/api", False),
        ("https://127.0.0.1/toolbox", "https://app.daytona.io/api", False),
        ("http://127.0.0.1:4000/toolbox", "https://app.daytona.io/api", False),
        ("https://proxy.app.daytona.io/toolbox", "http://127.0.0.1:4000/api", False),
        ("ftp://app.daytona.io/toolbox", "https://app.daytona.io/api", False),
        ("https://user:pw@proxy.app.daytona.io/toolbox", "https://app.daytona.io/api", False),
        ("https://proxy.app.daytona.io:notaport/toolbox", "https://app.daytona.io/api", False),
        ("https:///toolbox", "https://app.daytona.io/api", False),
    ],
)
def test_the_toolbox_url_must_be_one_the_api_would_send_the_key_to(url: str, api_url: str, ok: bool) -> None:
    assert (acceptable_url(url, api_url) == "") is ok


def test_the_headers_are_the_sdks_and_come_from_this_process() -> None:
    from importlib.metadata import version

    sdk = version("daytona")
    assert interpreter_headers({"DAYTONA_API_KEY": "k1"}) == {
        "Accept": "application/json",
        "User-Agent": f"sdk-python-async/{sdk}",
        "Authorization": "Bearer k1",
        "X-Daytona-Source": "sdk-python-async",
        "X-Daytona-SDK-Version": sdk,
    }
    jwt = interpreter_headers({"DAYTONA_JWT_TOKEN": "j", "DAYTONA_ORGANIZATION_ID": "org"})
    assert jwt is not None and jwt["Authorization"] == "Bearer j" and jwt["X-Daytona-Organization-ID"] == "org"
    assert interpreter_headers({"DAYTONA_JWT_TOKEN": "j"}) is None  # the SDK needs the organization too
    assert interpreter_headers({}) is None  # perhaps in a .env file: the SDK's own path


def test_the_fingerprint_is_keyed_with_this_machines_private_key(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings include the env passed into the sandbox (tokens, perhaps): nothing in the file may let
    someone who guesses a value confirm it, so the hash is keyed with a random key that never leaves here."""
    chosen = settings(env={"TOKEN": "guessable"})
    mine = settings_fingerprint(chosen, "ws-1", API, "us")
    plain = {"settings": dataclasses.asdict(chosen), "workspace": "ws-1", "api_url": API, "target": "us"}
    assert mine != hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(data_dir.parent / "another-machine"))
    assert settings_fingerprint(chosen, "ws-1", API, "us") != mine


async def test_the_headers_and_url_match_what_the_installed_sdk_would_send(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-written twin checked against the SDK itself (no network): a header the SDK adds, or a URL it
    builds differently, fails here rather than costing every quick restart a fallback."""
    for name in ("DAYTONA_JWT_TOKEN", "DAYTONA_ORGANIZATION_ID", "DAYTONA_API_URL", "DAYTONA_TARGET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DAYTONA_API_KEY", "k1")
    from daytona import AsyncDaytona, DaytonaConfig
    from daytona.internal.toolbox_api_client_proxy import ToolboxApiClientProxy
    from daytona_toolbox_api_client_async import InterpreterApi

    client = AsyncDaytona(DaytonaConfig(api_key="k1", api_url=API))
    try:
        handoff = record(toolbox_url="http://127.0.0.1:4000/toolbox")
        proxy = ToolboxApiClientProxy(client._toolbox_api_client, handoff.sandbox_id, handoff.toolbox_url, None)
        _, url, headers, *_ = InterpreterApi(proxy)._execute_interpreter_code_serialize(
            _request_auth=None, _content_type=None, _headers=None, _host_index=None
        )
    finally:
        await client.close()
    assert dict(headers) == interpreter_headers()
    assert url.replace("http", "ws", 1) == handoff.interpreter_url
