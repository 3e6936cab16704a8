"""The one way code runs in a context (``request.run_in``) and the client of the calls beside the cells
(``context_client.ContextClient``), against the fake sandbox."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from fakes import FakeSandbox, Run

from daytona_kernel.config import SessionSettings
from daytona_kernel.context_client import ContextClient
from daytona_kernel.errors import ContextDied
from daytona_kernel.outputs import OutputPolicy
from daytona_kernel.request import InFlight, Request, run_in
from daytona_kernel.runtime.calls import RuntimeOptions
from daytona_kernel.supervisor import ContextSupervisor, Live


def shown_by(request_output: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(content.get("text", "") for kind, content in request_output if kind == "stream")


async def test_a_run_is_read_by_its_request_and_finished_whatever_happened() -> None:
    sandbox = FakeSandbox([Run(["half a line"]), Run(["cut "], raises=ContextDied("gone")), Run(["kept"])])
    context = await sandbox.create_context()
    shown: list[tuple[str, dict[str, Any]]] = []

    request = Request("t", lambda kind, content: shown.append((kind, content)))
    assert await run_in(context, "a", request, 5.0) is None
    assert request.done.is_set() and shown_by(shown) == "half a line"

    request = Request("t", lambda kind, content: shown.append((kind, content)))
    with pytest.raises(ContextDied):
        await run_in(context, "b", request, 5.0)
    assert request.done.is_set() and shown_by(shown).endswith("cut ")

    request = Request("t", lambda kind, content: shown.append((kind, content)))
    heard: list[str] = []

    def noting(callback: Any) -> Any:
        def note(text: str) -> None:
            heard.append(text)
            callback(text)

        return note

    assert await run_in(context, "c", request, 5.0, heard=noting, finish=False) is None
    assert heard == ["kept"] and not request.done.is_set()  # a cell's run: finished once settled
    request.finish()
    assert shown_by(shown).endswith("kept")


async def test_the_client_waits_for_the_cell_inbox_or_for_the_context_to_be_free() -> None:
    sandbox = FakeSandbox([Run(["out"])])
    settings = SessionSettings()
    supervisor = ContextSupervisor(sandbox, settings, logging.getLogger("t"), RuntimeOptions())
    inflight = InFlight()
    client = ContextClient(sandbox, supervisor, settings, OutputPolicy(trusted=False), inflight, logging.getLogger("t"))
    assert await client.cell_inbox() is None and client.idle  # nothing runs: a call of its own goes in

    inflight.in_cell = True
    waiting = asyncio.ensure_future(client.cell_inbox())
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the cell's inbox is not there yet
    inflight.cell_inbox = "/tmp/inbox"
    assert await asyncio.wait_for(waiting, 10) == "/tmp/inbox"
    await client.upload("/tmp/inbox", "m-1.json", b"[]")
    assert sandbox.files["/tmp/inbox/m-1.json"] == b"[]"
    inflight.in_cell, inflight.cell_inbox = False, None

    context = await sandbox.create_context()
    live = Live(context, "t", 1, "3.12")
    request = Request("t", lambda kind, content: None)
    seen: list[Request | None] = []
    original = request.on_stdout

    def during(text: str) -> None:
        seen.append(inflight.request)
        original(text)

    request.on_stdout = during  # type: ignore[method-assign]
    async with inflight.lock:
        assert await client.call(live, "x", request) is None
    assert seen == [request] and inflight.request is None and request.done.is_set()
