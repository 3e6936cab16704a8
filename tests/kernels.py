"""Drive real kernels through jupyter_client and collect what a client sees."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import TYPE_CHECKING, Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

TIMEOUT_S = 60
IPC_ROOT = tempfile.mkdtemp(prefix="dk-ipc-")  # short: a unix socket's path is limited to about 100 bytes
atexit.register(shutil.rmtree, IPC_ROOT, True)
UNDER_PYTEST = "pytest" in sys.modules


@dataclass
class Run:
    """One execute_request: the reply and the iopub messages it caused."""

    reply: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    stdin_requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def outputs(self) -> list[dict[str, Any]]:
        skip = ("status", "execute_input")
        return [m for m in self.messages if m["msg_type"] not in skip]

    @property
    def status(self) -> str:
        return self.reply["content"]["status"]

    def text(self, name: str = "stdout") -> str:
        return "".join(m["content"]["text"] for m in self.outputs if m["msg_type"] == "stream" and m["content"]["name"] == name)

    @property
    def status_lines(self) -> list[str]:
        """The kernel's in-place status line (provisioning, waiting, retrying), every version of it."""
        kinds = ("display_data", "update_display_data")
        return [m["content"]["data"]["text/plain"] for m in self.outputs if m["msg_type"] in kinds]

    def of_type(self, msg_type: str) -> list[dict[str, Any]]:
        return [m["content"] for m in self.outputs if m["msg_type"] == msg_type]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return self.of_type("error")


class Kernel:
    """A started kernel with a blocking client."""

    def __init__(self, name: str = "daytona-local", env: dict[str, str] | None = None, cwd: str | None = None, **launch: Any):
        # Unix sockets, not TCP ports: a free port picked here can be taken by another test's kernel (xdist
        # runs two side by side) before this one binds it, and the kernel dies with "Address already in use".
        # (The benchmarks measure what clients use: TCP.)
        self._ipc_dir = tempfile.mkdtemp(prefix="k", dir=IPC_ROOT)
        if UNDER_PYTEST:
            self.km = KernelManager(kernel_name=name, transport="ipc", ip=str(Path(self._ipc_dir) / "k"))
        else:
            self.km = KernelManager(kernel_name=name)
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.km.start_kernel(env=full_env, cwd=cwd or os.getcwd(), **launch)
        self.stray: list[dict[str, Any]] = []  # iopub messages of other parents (widget callbacks), for wait_for
        self.kc: BlockingKernelClient = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=TIMEOUT_S)

    def execute(
        self,
        code: str,
        timeout: float = TIMEOUT_S,
        stdin_answer: Any = None,
        on_message: Any = None,
        **kwargs: Any,
    ) -> Run:
        """Run code and collect until idle. ``stdin_answer(content) -> str`` answers input()."""
        if stdin_answer is not None:
            kwargs.setdefault("allow_stdin", True)
        # A failed cell makes ipykernel abort requests that arrive in the next moments; tests run
        # cells back to back, so they opt out unless a test is about that.
        kwargs.setdefault("stop_on_error", False)
        msg_id = self.kc.execute(code, **kwargs)
        run = Run(reply={})
        start = time.monotonic()
        deadline = start + timeout
        while True:
            if stdin_answer is not None:
                try:
                    req = self.kc.get_stdin_msg(timeout=0.01)
                    run.stdin_requests.append(req["content"])
                    self.kc.input(stdin_answer(req["content"]))
                except Empty:
                    pass  # no input request pending
            try:
                msg = self.kc.get_iopub_msg(timeout=0.05)
            except Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no idle within {timeout}s for {code!r}") from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                self.stray.append(msg)
                continue
            run.messages.append(msg)
            run.arrivals.append(time.monotonic() - start)
            if on_message is not None:
                on_message(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                run.reply = reply
                return run

    def request(self, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """A shell request (complete, inspect, history, is_complete, kernel_info) and its reply content."""
        msg_id = getattr(self.kc, method)(*args, **kwargs)
        while True:
            reply = self.kc.get_shell_msg(timeout=TIMEOUT_S)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]

    def comm(
        self, msg_type: str, content: dict[str, Any], buffers: list[bytes] | None = None, metadata: dict[str, Any] | None = None
    ) -> str:
        """Send comm_open, comm_msg or comm_close as a frontend does; returns its msg_id."""
        msg = self.kc.session.msg(msg_type, content, metadata=metadata)
        self.kc.shell_channel.send(msg) if not buffers else self.kc.session.send(
            self.kc.shell_channel.socket, msg, buffers=buffers
        )
        return str(msg["header"]["msg_id"])

    def wait_for(self, match: Any, timeout: float = TIMEOUT_S) -> dict[str, Any]:
        """The first iopub message (kept from earlier runs, or new) for which ``match(msg)`` is true."""
        for i, msg in enumerate(self.stray):
            if match(msg):
                return self.stray.pop(i)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.05)
            except Empty:
                continue
            if match(msg):
                return msg
            self.stray.append(msg)
        raise TimeoutError(f"no matching iopub message within {timeout}s")

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def restart(self) -> None:
        self.km.restart_kernel(now=False)
        self.kc.wait_for_ready(timeout=TIMEOUT_S)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)
        shutil.rmtree(self._ipc_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def result_text(run: Run) -> str:
    """The text/plain of a cell's execute_result."""
    return run.of_type("execute_result")[0]["data"]["text/plain"]
