"""The agent API's requests to one kernel (``agent.AsyncAgentKernel`` uses them).

``Call`` sends one execute request at a time on the shell channel and reads iopub in one task,
handing each message to the request it belongs to. A kernel notice under a request that is no
longer followed (the kernel sent it late) is kept for the next result rather than lost. A run that
passes its timeout is interrupted through the kernel (its variables stay) and followed to its end.

Everything the sandbox sends is untrusted: the variables listing is parsed from bounded JSON,
checked field by field.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable

from jupyter_client.asynchronous.client import AsyncKernelClient

from .agent_results import NOTICE_METADATA_KEY, CellError, Outputs, RunResult, Variable, redact

__all__ = ["Call", "Execution", "parse_status", "parse_variables", "variables_code"]

log = logging.getLogger(__name__)

ALIVE_CHECK_S = 5.0  # while a run is quiet: is the kernel process still there?
INTERRUPT_WAIT_S = 120.0  # after a timeout's interrupt: the kernel's own interrupt_grace (60 s) ends a stuck run first
INTERRUPT_RETRY_S = 10.0  # then again, for an interrupt that reached the kernel before the cell started
REPLY_WAIT_S = 60.0  # the execute_reply after the request's idle
MAX_VARIABLES = 500
VARIABLE_MARK = "\x1edaytona-kernel-variables:"
TRUNCATED = "\n... [output cut: {shown} of {total} characters shown; the full text is in {path}] ...\n"
KERNEL_DIED = "The kernel process ended during the run; its variables are lost. Call restart to start it again."
NO_INPUT = "input() cannot be answered through this API (nobody is there to type): pass the value in the code instead."


class Execution:
    """One execute request as it was followed: its outputs, reply, and how it ended."""

    def __init__(self, code: str, timeout: float | None, on_output: Callable[[str], None] | None = None) -> None:
        self.code = code
        self.timeout = timeout
        self.outputs = Outputs(on_output)
        self.reply: dict[str, Any] = {}
        self.timed_out = False
        self.abandoned = False  # the kernel did not end the run even after the interrupt
        self.died = False  # the kernel process ended while the run was followed

    def result(self, output_chars: int, overflow: Callable[[str], str]) -> RunResult:
        out = self.outputs
        error = out.error
        if self.died:
            error = CellError("KernelDied", KERNEL_DIED, [])
        elif error is None and self.reply.get("status") == "error":  # a magic's UsageError: a line on stderr, no error output
            error = CellError(str(self.reply.get("ename", "")), redact(str(self.reply.get("evalue", ""))), [])
        notices = list(out.notices)
        if self.timed_out:
            notices.append(
                f"The run passed its timeout of {self.timeout:g} s and was interrupted; the variables are kept.\n"
                if not self.abandoned
                else f"The run passed its timeout of {self.timeout:g} s and did not stop when interrupted; "
                "restart the kernel (restart) to go on.\n"
            )
        if error is not None and error.name == "StdinNotImplementedError":
            notices.append(NO_INPUT + "\n")
        text = out.text()
        truncated = len(text) > output_chars > 0
        if truncated:
            head, tail = text[: output_chars * 2 // 3], text[len(text) - output_chars // 3 :]
            text = head + TRUNCATED.format(shown=len(head) + len(tail), total=len(text), path=overflow(text)) + tail
        count = self.reply.get("execution_count")
        return RunResult(
            execution_count=count if isinstance(count, int) else None,
            text=text,
            images=out.images(),
            error=error,
            notices=notices,
            outputs=out.notebook_outputs(),
            interrupted=error is not None and error.name == "KeyboardInterrupt",
            timed_out=self.timed_out,
            truncated=truncated,
        )

    def stdout(self) -> str:
        return "".join(i["text"] for i in self.outputs.items if i["output_type"] == "stream" and i["name"] == "stdout")


class Call:
    """See the module docstring."""

    def __init__(
        self, kc: AsyncKernelClient, interrupt: Callable[[], Awaitable[None]], alive: Callable[[], Awaitable[bool]]
    ) -> None:
        self._kc = kc
        self._interrupt = interrupt
        self._alive = alive
        self._lock = asyncio.Lock()
        self._inboxes: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._late_notices: list[str] = []
        self.running: asyncio.Event | None = None  # set when the run in flight ends
        self._reader = asyncio.ensure_future(self._read_iopub())

    async def _read_iopub(self) -> None:
        while True:
            msg = await self._kc.get_iopub_msg()
            inbox = self._inboxes.get(msg.get("parent_header", {}).get("msg_id", ""))
            if inbox is not None:
                inbox.put_nowait(msg)
            elif msg["msg_type"] == "stream" and msg.get("metadata", {}).get(NOTICE_METADATA_KEY):
                self._late_notices.append(redact(str(msg["content"].get("text", ""))))

    async def execute(
        self, code: str, timeout: float | None = None, silent: bool = False, on_output: Callable[[str], None] | None = None
    ) -> Execution:
        """Run one request to its end (see the module docstring for a timeout); ``on_output`` gets the stream text
        as it comes."""
        if self._reader.done():
            raise RuntimeError(f"the connection to the kernel is closed ({self._reader_problem()}); restart the kernel")
        async with self._lock:
            self.running = running = asyncio.Event()
            execution = Execution(code, timeout, on_output)
            msg_id = self._kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False, stop_on_error=False)
            inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
            self._inboxes[msg_id] = inbox
            execution.outputs.notices.extend(self._late_notices)
            self._late_notices.clear()
            try:
                await self._follow(inbox, execution)
                if not (execution.abandoned or execution.died):
                    execution.reply = await self._reply(msg_id)
            finally:
                del self._inboxes[msg_id]
                running.set()
                self.running = None
            return execution

    async def _follow(self, inbox: asyncio.Queue[dict[str, Any]], execution: Execution) -> None:
        """Feed the request's iopub messages to its outputs until the kernel is idle again. Past the timeout
        the run is interrupted, again every INTERRUPT_RETRY_S (one that reaches the kernel before the cell
        starts stops nothing), until it ends or INTERRUPT_WAIT_S have passed."""
        loop = asyncio.get_running_loop()
        deadline = None if execution.timeout is None else loop.time() + execution.timeout
        give_up = 0.0
        while True:
            try:
                wait = ALIVE_CHECK_S if deadline is None else min(ALIVE_CHECK_S, max(0.0, deadline - loop.time()))
                msg = await asyncio.wait_for(inbox.get(), wait)
            except asyncio.TimeoutError:
                if not await self._alive():
                    execution.died = True
                    return
                if deadline is None or loop.time() < deadline:
                    continue
                if not execution.timed_out:
                    execution.timed_out, give_up = True, loop.time() + INTERRUPT_WAIT_S
                elif loop.time() >= give_up:
                    execution.abandoned = True
                    return
                await self._interrupt()
                deadline = loop.time() + INTERRUPT_RETRY_S
                continue
            if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                return
            execution.outputs.add(msg)

    async def _reply(self, msg_id: str) -> dict[str, Any]:
        while True:
            reply = await self._kc.get_shell_msg(timeout=REPLY_WAIT_S)
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                return dict(reply["content"])

    def _reader_problem(self) -> str:
        exc = self._reader.exception() if not self._reader.cancelled() else None
        return f"{type(exc).__name__}: {exc}" if exc else "closed"

    async def close(self) -> None:
        self._reader.cancel()
        try:
            await self._reader
        except asyncio.CancelledError:
            log.debug("the iopub reader stopped")
        except Exception as exc:  # the channel broke earlier: said here, nothing more to read
            log.info("the iopub reader had stopped: %s", exc)


# -- variables: a short function run silently in the interpreter ------------------------------------

_VARIABLES_SOURCE = r"""
def _daytona_kernel_variables():
    import json, types
    ns = globals()
    hidden = {}
    try:
        ip = get_ipython()
        ns, hidden = ip.user_ns, ip.user_ns_hidden
    except NameError:  # the basic shell (no IPython in the sandbox): its globals are the namespace
        ns = globals()
    skip = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)
    found = []
    for name, value in list(ns.items()):
        if name.startswith('_') or name in hidden or name in ('In', 'Out', 'exit', 'quit', 'get_ipython') or isinstance(value, skip):
            continue
        try:
            text = repr(value)
        except Exception as exc:
            text = '<repr failed: %s>' % type(exc).__name__
        size = getattr(value, 'shape', None)
        if size is None:
            try:
                size = len(value)
            except Exception:
                size = ''
        found.append({'name': name, 'type': type(value).__name__, 'repr': text[:200], 'size': str(size)[:40]})
        if len(found) > LIMIT:
            break
    print(MARK + json.dumps(found))
_daytona_kernel_variables()
del _daytona_kernel_variables
"""


def variables_code() -> str:
    return _VARIABLES_SOURCE.replace("LIMIT", str(MAX_VARIABLES)).replace("MARK", repr(VARIABLE_MARK))


def parse_variables(execution: Execution) -> list[Variable]:
    """The listing the sandbox printed, checked: anything that does not fit is an error, never a crash."""
    error = execution.outputs.error
    if error is not None:
        raise RuntimeError(f"could not list the variables: {error.name}: {error.value}")
    text = execution.stdout()
    _, mark, listing = text.rpartition(VARIABLE_MARK)
    try:
        items = json.loads(listing) if mark else None
    except ValueError:
        items = None
    if not isinstance(items, list):
        raise RuntimeError("could not list the variables: the interpreter's answer was not readable")
    found = []
    for item in items[:MAX_VARIABLES]:
        if isinstance(item, dict) and all(isinstance(item.get(k), str) for k in ("name", "type", "repr", "size")):
            found.append(Variable(item["name"], item["type"][:100], redact(item["repr"][:200]), item["size"][:40]))
    return found


def parse_status(execution: Execution) -> dict[str, str]:
    """``%daytona status``'s ``name: value`` lines."""
    if execution.outputs.error is not None:
        return {"status": f"unavailable: {execution.outputs.error.value}"}
    info = {}
    for line in execution.stdout().splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip():
            info[name.strip()] = value.strip()
    return info
