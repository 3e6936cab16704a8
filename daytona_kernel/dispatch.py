"""The shell channel's order: ipykernel's, with frontend comm messages that wait for the sandbox.

ipykernel handles shell messages one at a time, each with its busy, its output and its idle under
its own parent, and dispatches a comm message beside whatever holds the shell (with no status at
all), since a running cell may wait for it. Its comm handlers return at once. Here a comm message's
handler waits until the sandbox handled it (its idle follows the handler's output, which JupyterLab's
Output widget needs), and that changes two things, both seen in JupyterLab's opening burst (issue 36):

- a comm message arriving while another one is in the sandbox went beside it, without a status;
- ipykernel's side path sets the shell's parent back, when the comm is done, to what it was when the
  comm arrived; after a wait in the sandbox that was another request's, so the cell running by then
  published its output and its idle under the comm_open, and never got an idle of its own.

So a comm message goes beside only a running cell (which may wait for it: the cell's inbox), and
no parent is set back; otherwise it waits its turn like any request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ipykernel.kernelbase import Kernel

COMM_TYPES = frozenset({"comm_open", "comm_msg", "comm_close"})


class ShellDispatch(Kernel):
    """The kernel's shell dispatch (see the module docstring). ``_to_sandbox`` hands a frontend comm
    message on and returns what resolves once the sandbox handled it."""

    _holding = ""  # the type of the shell message being handled

    async def shell_main(self, subshell_id: str | None, msg: Any) -> None:
        if subshell_id is not None:  # this kernel offers no subshells; a client that made one gets ipykernel's way
            await super().shell_main(subshell_id, msg)
            return
        msg_type = self._msg_type(msg)
        if msg_type in COMM_TYPES and self._holding == "execute_request":
            self._beside_cell(msg)
            return
        async with self._main_asyncio_lock:
            self._holding = msg_type
            try:
                await self.dispatch_shell(msg)
            finally:
                self._holding = ""

    def _msg_type(self, msg: Any) -> str:
        assert self.session is not None
        try:
            _, frames = self.session.feed_identities(msg, copy=False)
            return str(self.session.deserialize(frames, content=False, copy=False)["header"]["msg_type"])
        except Exception:  # dispatch_shell logs the message as invalid and drops it, as ipykernel does
            return ""

    def _beside_cell(self, msg: Any) -> None:
        """A comm message while a cell runs: to the sandbox at once, without a status, as ipykernel does."""
        assert self.session is not None
        try:
            _, frames = self.session.feed_identities(msg, copy=False)
            parent = self.session.deserialize(frames, content=True, copy=False)
        except Exception:
            self.log.exception("Invalid Message: dropped")
            return
        self._to_sandbox(parent)

    def _to_sandbox(self, parent: dict[str, Any]) -> asyncio.Future[None] | None:
        raise NotImplementedError
