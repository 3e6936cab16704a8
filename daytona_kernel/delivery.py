"""Widgets: frontend comm messages into the sandbox, the comm bridge's transport (``comms.Transport``).

While a cell runs, a batch is one file upload to the cell's inbox (not queued behind the cell);
while no cell runs, a short call of its own (``Deliver``), whose output goes under the messages.
"""

from __future__ import annotations

import json
import posixpath
from typing import TYPE_CHECKING, Any

from .backends.base import RunError
from .context_client import ContextClient
from .errors import SandboxPaused
from .outputs import OutputBudget
from .request import Request
from .runtime import call_source
from .runtime.calls import CommOptions, Deliver
from .supervisor import Live, runtime_missing

if TYPE_CHECKING:
    from .comms import CommBridge


def comm_options(comms: CommBridge | None, live: Live, temp_dir: str) -> CommOptions | None:
    """What the runtime's comm bridge needs for a call: the request's message id, and the inbox
    (named after the interpreter's pid, as input()'s inbox, so ``daytona-kernel gc`` knows it)."""
    if comms is None:
        return None
    comms.runtime_is(live.token)
    parent = comms.request_parent.get("header", {}).get("msg_id", "")
    inbox = posixpath.join(temp_dir, f"daytona-kernel-inbox-{live.pid}-comms-{live.token[:12]}")
    return CommOptions(parent=parent, inbox=inbox)


class CommDelivery:
    """See the module docstring. It reaches the context through the ``ContextClient`` it shares with the debugger."""

    def __init__(self, client: ContextClient) -> None:
        self._client = client
        self._closed = False  # the session shut down: nothing goes into the sandbox any more

    def close(self) -> None:
        self._closed = True

    @property
    def in_cell(self) -> bool:
        return self._client.inflight.in_cell

    async def deliver_comms(self, batch: list[dict[str, Any]], bridge: CommBridge) -> None:
        """Frontend comm messages into the sandbox: while a cell runs, one file upload to its inbox
        (not queued behind the cell); while idle, a short call of their own, whose output goes under
        the messages. An empty batch while idle fetches what the sandbox holds (a background thread's updates)."""
        client = self._client
        inbox = await client.cell_inbox()
        if inbox is not None:
            if batch:
                bridge.seq += 1
                await client.upload(inbox, f"comms-{bridge.seq}.json", json.dumps(batch).encode())
                bridge.uploaded(bridge.seq, batch)
            return
        live = client.supervisor.live
        if live is None or self._closed:  # no interpreter (yet): no comm target is registered there
            bridge.unreachable(batch)
            return
        async with client.inflight.lock:
            try:
                try:
                    error = await self._deliver_once(live, batch, bridge)
                except SandboxPaused:  # a widget moved after the sandbox paused itself: resume it, as a cell would
                    await client.supervisor.resume(None)
                    error = await self._deliver_once(live, batch, bridge)
            finally:
                bridge.handled([m["header"]["msg_id"] for m in batch])
        if runtime_missing(error):
            bridge.closed_all()  # the interpreter was replaced: its widgets are gone
        elif error is not None:
            client.log.warning("widget messages failed in the sandbox: %s: %s", error.name, error.value)

    async def _deliver_once(self, live: Live, batch: list[dict[str, Any]], bridge: CommBridge) -> RunError | None:
        """One ``Deliver`` call; a callback may run as long as a cell may (an interrupt stops it)."""
        client = self._client
        parent = bridge.request_parent
        budget = OutputBudget(client.settings.output_limit_chars)
        request = Request(
            live.token, lambda msg_type, content: bridge.output(msg_type, content, parent), None, client.outputs, budget, bridge
        )
        code = call_source(Deliver(messages=batch, comms=comm_options(bridge, live, client.sandbox.temp_dir)))
        return await client.call(live, code, request)
