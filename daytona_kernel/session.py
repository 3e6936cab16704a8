"""The session: client of the in-sandbox runtime.

It bootstraps the runtime into a context, wraps each request into one code
string (one interpreter round trip), decodes the framed events out of the
stdout stream, and drives interrupt and recovery. It knows nothing about
Jupyter messages: it hands ``(kind, content)`` events to a callback, where kind
is one of ``stream``, ``display``, ``update``, ``clear``, ``result``, ``error``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import secrets
import shlex
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from .backends.base import Context, RunError, Sandbox
from .config import DaytonaKernelConfig
from .errors import BackendError, ContextDied, ContextTimeout, DaytonaKernelError, SandboxNotRunning
from .runtime import bootstrap_code, call_code
from .runtime.framing import Frame, FrameDecoder, Text
from .sync import SyncReport, WorkdirMirror

EmitCallback = Callable[[str, dict], None]
ProgressCallback = Callable[[str], None]
AskCallback = Callable[[str, bool], Awaitable[str]]

OUTPUT_KINDS = ("display", "update", "clear", "result")
REQUEST_TIMEOUT_S = 30.0
INTERRUPT_EXEC_TIMEOUT_S = 10.0
IDLE_CHECKPOINT_LEAD_S = 60.0
STATE_LOST = "Its variables were lost; files in the working directory are intact."


def error_content(ename: str, message: str) -> dict[str, Any]:
    """An error for the user that comes from the kernel, not from their code."""
    return {"ename": ename, "evalue": message, "traceback": [f"\x1b[0;31m{ename}\x1b[0m: {message}"]}


@dataclass
class CellOutcome:
    """How a cell ended. ``error`` is the content of its one error output, if any."""

    error: dict[str, Any] | None = None
    user_expressions: dict[str, Any] = field(default_factory=dict)
    payload: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Live:
    """A bootstrapped context: where requests go."""

    context: Context
    token: str
    pid: int
    python: str


class _Request:
    """One request in flight: decodes its output and collects what it reports."""

    def __init__(self, token: str, emit: EmitCallback) -> None:
        self._decoder = FrameDecoder(token)
        self._emit = emit
        self.error: dict[str, Any] | None = None
        self.frames: dict[str, Any] = {}
        self.payload: list[dict[str, Any]] = []
        self.done = asyncio.Event()
        self.interrupted = False
        self.restarted_by_watchdog = False
        self.on_input: Callable[[dict[str, Any]], None] | None = None

    def on_stdout(self, text: str) -> None:
        for event in self._decoder.feed(text):
            self._handle(event)

    def on_stderr(self, text: str) -> None:
        self._emit("stream", {"name": "stderr", "text": text})

    def finish(self) -> None:
        for event in self._decoder.flush():
            self._handle(event)
        self.done.set()

    def fail(self, content: dict[str, Any], overrides: bool = False) -> None:
        """Record the cell's error. A cell shows exactly one error output, emitted
        at the end; a later error is shown as text unless it ``overrides``."""
        if self.error is None or overrides:
            self.error = content
        else:
            self._emit("stream", {"name": "stderr", "text": f"{content['ename']}: {content['evalue']}\n"})

    def _handle(self, event: Text | Frame) -> None:
        if isinstance(event, Text):
            self._emit("stream", {"name": "stdout", "text": event.text})
        elif event.kind in OUTPUT_KINDS:
            self._emit(event.kind, event.payload)
        elif event.kind == "error":
            self.fail(event.payload)
        elif event.kind == "payload":
            self.payload.append(event.payload)
        elif event.kind == "input" and self.on_input is not None:
            self.on_input(event.payload)
        else:
            self.frames[event.kind] = event.payload


class RuntimeSession:
    """Runs cells in one sandbox, one context at a time. See the module docstring."""

    def __init__(
        self,
        sandbox: Sandbox,
        config: DaytonaKernelConfig,
        log: logging.Logger,
        mirror: WorkdirMirror | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.mirror = mirror
        self._config = config
        self._log = log
        self._sandbox_started = False
        self._starting: asyncio.Future[_Live] | None = None
        self._live: _Live | None = None
        self._current: _Request | None = None
        self._watchdog: asyncio.Future[None] | None = None
        self._repo_checked = False
        self._shut_down = False
        self._idle_checkpoint: asyncio.Future[None] | None = None
        self._idle_checkpoint_saved = False
        self._startup_notices: list[str] = [mirror.notice] if mirror is not None and mirror.notice else []
        self._progress: ProgressCallback | None = None
        self._last_progress = ""

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        """Begin provisioning in the background, so the first cell rarely waits."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())

    async def ready(self, progress: ProgressCallback | None = None) -> _Live:
        """The live context, once started. Raises DaytonaKernelError if it cannot start.

        While it waits, ``progress`` receives status lines (the latest one at
        once), and an empty line when the wait is over.
        """
        self.start()
        assert self._starting is not None
        waiting = not self._starting.done() and progress is not None
        if waiting:
            self._progress = progress
            if self._last_progress:
                progress(self._last_progress)
        try:
            return await asyncio.shield(self._starting)
        except DaytonaKernelError:
            self._starting = None  # the next request tries again
            raise
        finally:
            self._progress = None
            if waiting:
                progress("")  # type: ignore[misc]  # the wait is over: clear the status line

    def _report(self, text: str) -> None:
        self._last_progress = text
        self._log.info("%s", text)
        if self._progress is not None:
            self._progress(text)

    @property
    def python_version(self) -> str | None:
        return self._live.python if self._live else None

    async def _start(self) -> _Live:
        self._last_progress = ""
        await self.sandbox.start(self._report)
        self._sandbox_started = True
        context = await self.sandbox.create_context()
        token = secrets.token_hex(8)
        request = _Request(token, self._emit_to_log)
        options = dict(self.mirror.runtime_options() if self.mirror else {})
        options["output_limit_chars"] = int(self._config.output_limit_mb * 1024 * 1024)
        error = await context.run_code(bootstrap_code(token, options), request.on_stdout, request.on_stderr, REQUEST_TIMEOUT_S)
        request.finish()
        hello = request.frames.get("hello")
        if error is not None or hello is None:
            await context.close()
            detail = f"{error.name}: {error.value}" if error else "it did not report back"
            raise BackendError(
                f"The runtime could not start in the sandbox ({detail}). "
                "The sandbox needs Python 3.9 or newer as `python3`."
            )
        self._live = _Live(context, token, int(hello["pid"]), str(hello["python"]))
        if self._config.repo_url and not self._repo_checked:
            self._repo_checked = True
            await self._stage_repo()
        self._log.info("runtime ready in %s (pid %s, Python %s)", self.sandbox.description, hello["pid"], hello["python"])
        return self._live

    async def _stage_repo(self) -> None:
        """Clone repo_url into the working directory, unless a clone is already on the volume."""
        url = self._config.repo_url
        dest = posixpath.basename(url.rstrip("/")).removesuffix(".git") or "repo"
        check = await self.sandbox.exec(f"test -d {shlex.quote(dest)}/.git")
        if check.exit_code == 0:
            self._startup_notices.append(f"{dest}/ is already cloned on the volume; left as it is.\n")
            return
        self._report(f"cloning {dest}…")
        await self.sandbox.clone(
            url, self._config.repo_ref or None, dest, os.environ.get("GIT_USERNAME"), os.environ.get("GIT_TOKEN")
        )
        self._startup_notices.append(f"Cloned {dest}/ into the working directory.\n")

    def _emit_to_log(self, kind: str, content: dict) -> None:
        self._log.warning("output outside a cell: %s %s", kind, content)

    def _restart_context(self) -> None:
        """Replace the context in the background; the next request waits for it."""
        live, self._live = self._live, None
        if live is not None:
            asyncio.ensure_future(self._close_quietly(live.context))
        self._starting = asyncio.ensure_future(self._start())

    async def _close_quietly(self, context: Context) -> None:
        try:
            await context.close()
        except DaytonaKernelError as exc:
            self._log.warning("could not delete the old context %s: %s", context.id, exc)

    async def shutdown(self) -> None:
        """Delete the context, then stop or delete the sandbox by policy. Safe to call twice."""
        if self._shut_down:
            return
        self._shut_down = True
        self._disarm_idle_checkpoint()
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        if self._sandbox_started:
            await self.sandbox.shutdown()

    # -- requests --------------------------------------------------------

    async def execute(
        self,
        code: str,
        count: int,
        emit: EmitCallback,
        *,
        silent: bool = False,
        store_history: bool = True,
        allow_stdin: bool = False,
        user_expressions: dict[str, str] | None = None,
        progress: ProgressCallback | None = None,
        ask: AskCallback | None = None,
    ) -> CellOutcome:
        """Run one cell. Every failure becomes the cell's one error output."""
        self._disarm_idle_checkpoint()
        try:
            return await self._execute(code, count, emit, silent, store_history, allow_stdin, user_expressions, progress, ask)
        finally:
            self._arm_idle_checkpoint()

    async def _execute(
        self,
        code: str,
        count: int,
        emit: EmitCallback,
        silent: bool,
        store_history: bool,
        allow_stdin: bool,
        user_expressions: dict[str, str] | None,
        progress: ProgressCallback | None,
        ask: AskCallback | None,
    ) -> CellOutcome:
        try:
            live = await self.ready(progress)
        except DaytonaKernelError as exc:
            emit("error", error_content(exc.ename, str(exc)))
            return CellOutcome(error=error_content(exc.ename, str(exc)))
        while self._startup_notices:
            emit("stream", {"name": "stderr", "text": self._startup_notices.pop(0)})
        synced = await self._push(emit, progress)
        answers: list[asyncio.Future[None]] = []

        def new_request(token: str) -> _Request:
            request = _Request(token, emit)
            if ask is not None:
                request.on_input = lambda payload: answers.append(asyncio.ensure_future(self._answer(payload, ask, emit)))
            self._current = request
            return request

        request = new_request(live.token)
        call = call_code("run_cell", code, count, store_history, silent, allow_stdin, user_expressions or {}, synced)
        timeout = self._config.cell_timeout or None
        run_error: RunError | None = None
        try:
            try:
                run_error = await live.context.run_code(call, request.on_stdout, request.on_stderr, timeout)
            except SandboxNotRunning as exc:  # nothing ran: bring the sandbox back, then run the cell there
                live = await self._recover(exc, emit, progress)
                request = new_request(live.token)
                run_error = await live.context.run_code(call, request.on_stdout, request.on_stderr, timeout)
        except ContextTimeout:
            request.finish()
            if request.interrupted:
                request.fail(error_content("KeyboardInterrupt", "Interrupted by user"))
            else:  # the runtime saw the SIGINT as a KeyboardInterrupt; say what really happened
                request.fail(
                    error_content(
                        "CellTimeoutError",
                        f"The cell exceeded the {self._config.cell_timeout:g} s timeout and was stopped. "
                        "Raise DaytonaKernel.cell_timeout (0 = no limit) if it needs longer.",
                    ),
                    overrides=True,
                )
        except ContextDied as exc:
            request.finish()
            self._restart_context()
            if request.restarted_by_watchdog:
                emit(
                    "stream",
                    {
                        "name": "stderr",
                        "text": f"The cell did not stop within {self._config.interrupt_grace:g} s of the "
                        f"interrupt, so its sandbox context was restarted. {STATE_LOST}\n",
                    },
                )
                request.fail(error_content("KeyboardInterrupt", "Interrupted by user"))
            else:
                request.fail(
                    error_content(
                        exc.ename,
                        f"The sandbox context died while running this cell ({exc}). "
                        f"It was restarted. {STATE_LOST}",
                    )
                )
        except BackendError as exc:  # connection lost, sandbox gone, auth ...
            request.finish()
            request.fail(error_content(exc.ename, str(exc)))
        finally:
            self._current = None
            for answer in answers:
                answer.cancel()
        request.finish()
        if run_error is not None:
            request.fail(_run_error_content(run_error))
        if "files" in request.frames:
            await self._pull(request.frames["files"], emit)
        if request.error is not None:
            emit("error", request.error)
        return CellOutcome(
            error=request.error,
            user_expressions=request.frames.get("user_expressions", {}),
            payload=request.payload,
        )

    # -- the workdir mirror ------------------------------------------------

    async def _push(self, emit: EmitCallback, progress: ProgressCallback | None) -> list[str]:
        """Upload local changes before a cell; returns what went up. Never fails the cell."""
        if self.mirror is None:
            return []
        try:
            report = await self.mirror.push(progress)
        except (DaytonaKernelError, OSError) as exc:
            emit("stream", {"name": "stderr", "text": f"Could not sync your folder to the sandbox: {exc}\n"})
            return []
        finally:
            if progress is not None:
                progress("")
        self._notify(report, emit)
        return report.up

    async def _pull(self, changes: dict[str, Any], emit: EmitCallback) -> SyncReport | None:
        """Download what the cell changed, before the cell's reply."""
        if self.mirror is None:
            return None
        try:
            report = await self.mirror.pull(changes)
        except (DaytonaKernelError, OSError) as exc:
            emit("stream", {"name": "stderr", "text": f"Could not copy the cell's files back from the sandbox: {exc}\n"})
            return None
        self._notify(report, emit)
        return report

    @staticmethod
    def _notify(report: SyncReport, emit: EmitCallback) -> None:
        notices = report.notices()
        if notices:
            emit("stream", {"name": "stderr", "text": notices})

    async def kernel_magics(self, lines: list[tuple[str, str]], emit: EmitCallback) -> dict[str, Any] | None:
        """Run %sync / %upload / %download / %daytona here in the kernel. Returns the error, if any."""
        for name, args in lines:
            try:
                text = await self._kernel_magic(name, args, emit)
            except DaytonaKernelError as exc:
                content = error_content("UsageError" if "usage" in exc.message.lower() else exc.ename, str(exc))
                emit("error", content)
                return content
            if text:
                emit("stream", {"name": "stdout", "text": text})
        return None

    async def _kernel_magic(self, name: str, args: str, emit: EmitCallback) -> str:
        if name == "daytona":
            return await self._daytona_magic(args)
        if self.mirror is None:
            raise BackendError(f"%{name}: the mirror is not available (the sandbox did not start).")
        await self.ready()
        words = args.split()
        if name == "sync" and words[:1] == ["status"]:
            return self.mirror.status()
        if name == "sync":
            report = await self.mirror.push()
            changes = await self.call("file_changes")
            if changes:
                down = await self.mirror.pull(changes)
                report.down, report.bytes_down, report.conflicts = down.down, down.bytes_down, down.conflicts
                report.skipped += down.skipped
                report.deleted += down.deleted
            self._notify(report, emit)
            return report.summary() + "\n"
        if not words or len(words) > 2:
            raise BackendError(f"Usage: %{name} PATH [DEST]")
        if name == "upload":
            report = await self.mirror.upload_paths(words[0], words[1] if len(words) > 1 else None)
            return f"uploaded {len(report.up)} file(s), {report.bytes_up} bytes\n"
        report = await self.mirror.download_paths(words[0], words[1] if len(words) > 1 else None)
        self._notify(report, emit)
        return f"downloaded {len(report.down)} file(s), {report.bytes_down} bytes\n" if report.down else ""

    async def _daytona_magic(self, args: str) -> str:
        command = args.split()[0] if args.split() else ""
        if command == "status":
            return await self._status()
        if command in ("checkpoint", "restore"):
            live = await self.ready()
            reply = await self.call(command, self.checkpoint_path())
            if reply is None:
                raise BackendError(f"%daytona {command} failed; see the kernel log. Is there a checkpoint yet?")
            if command == "checkpoint":
                text = f"checkpoint: saved {len(reply['saved'])} variable(s) with {reply['pickler']} ({reply['bytes']} bytes) to {self.checkpoint_path()}"
                if reply["skipped"]:
                    text += "\nnot picklable, skipped: " + ", ".join(reply["skipped"])
            else:
                text = f"restored {len(reply['restored'])} variable(s): " + ", ".join(reply["restored"])
                if reply["failed"]:
                    text += "\ncould not restore: " + ", ".join(reply["failed"])
            self._log.info("%s in context of pid %s", command, live.pid)
            return text + "\n"
        raise BackendError("Usage: %daytona status | %daytona checkpoint | %daytona restore")

    def _disarm_idle_checkpoint(self) -> None:
        if self._idle_checkpoint is not None:
            self._idle_checkpoint.cancel()
            self._idle_checkpoint = None

    def _arm_idle_checkpoint(self) -> None:
        """With checkpoint_on_idle, save the variables shortly before an idle sandbox is auto-stopped."""
        minutes = self._config.auto_stop_interval
        if self._config.checkpoint_on_idle and minutes and not self._shut_down:
            delay = max(minutes * 60 - IDLE_CHECKPOINT_LEAD_S, IDLE_CHECKPOINT_LEAD_S)
            self._idle_checkpoint = asyncio.ensure_future(self._checkpoint_after(delay))

    async def _checkpoint_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        reply = await self.call("checkpoint", self.checkpoint_path())
        if reply is None:
            self._log.warning("the idle checkpoint failed; see above")
        else:
            self._log.info("idle checkpoint: saved %s, skipped %s", reply["saved"], reply["skipped"])
            self._idle_checkpoint_saved = True

    def checkpoint_path(self) -> str:
        return posixpath.join(self.sandbox.workdir, ".daytona-kernel", "checkpoint.pkl")

    async def _status(self) -> str:
        info = {"backend": self._config.backend}
        try:
            info.update(await self.sandbox.info())
        except DaytonaKernelError as exc:
            info["sandbox"] = f"unavailable: {exc}"
        if self._live is not None:
            info["interpreter"] = f"Python {self._live.python}, pid {self._live.pid}"
        else:
            info["interpreter"] = "not started"
        if self.mirror is not None:
            info["mirror"] = f"{self.mirror.mode}: {self.mirror.local_root} <-> {self.sandbox.workdir}"
        width = max(len(k) for k in info) + 1
        return "".join(f"{k + ':':<{width}} {v}\n" for k, v in info.items())

    async def _recover(self, cause: DaytonaKernelError, emit: EmitCallback, progress: ProgressCallback | None) -> _Live:
        """The sandbox stopped (auto-stop, archive) or could not be reached: start it and a new context."""
        self._log.warning("sandbox not running (%s); starting it again", cause)
        self._live = None
        self._starting = asyncio.ensure_future(self._start())
        live = await self.ready(progress)
        emit(
            "stream",
            {
                "name": "stderr",
                "text": f"{cause} It was started again and your cell runs in a fresh interpreter: "
                "variables were reset; files in the working directory are intact."
                + (" Your variables were checkpointed before the stop: `%daytona restore` brings them back." if self._idle_checkpoint_saved else "")
                + "\n",
            },
        )
        return live

    async def _answer(self, payload: dict[str, Any], ask: AskCallback, emit: EmitCallback) -> None:
        """Get the user's answer to input() and hand it to the waiting runtime."""
        value = await ask(str(payload.get("prompt", "")), bool(payload.get("password")))
        try:
            await self.sandbox.upload([(json.dumps({"value": value}).encode(), payload["path"])])
        except DaytonaKernelError as exc:
            emit("stream", {"name": "stderr", "text": f"Could not pass your input to the sandbox: {exc}. Interrupt the cell.\n"})

    async def call(self, method: str, *args: object) -> dict[str, Any] | None:
        """One runtime call that answers with a ``reply`` frame (complete, inspect ...).

        Returns None when the sandbox is not ready or the call failed: these
        requests must never disturb the user, so failures are only logged.
        """
        if self._live is None:
            return None
        live = self._live
        request = _Request(live.token, self._emit_to_log)
        try:
            error = await live.context.run_code(
                call_code(method, *args), request.on_stdout, request.on_stderr, REQUEST_TIMEOUT_S
            )
        except DaytonaKernelError as exc:
            self._log.warning("%s failed: %s", method, exc)
            return None
        request.finish()
        if error is not None:
            self._log.warning("%s failed in the sandbox: %s: %s", method, error.name, error.value)
        return request.frames.get("reply")

    async def interrupt(self) -> None:
        """Send SIGINT to the worker; restart the context if the cell does not yield.

        Returns once the signal is sent; the watchdog waits in the background.
        """
        request, live = self._current, self._live
        if request is None or live is None:
            return
        request.interrupted = True
        try:
            result = await self.sandbox.exec(f"kill -INT {live.pid}", timeout=INTERRUPT_EXEC_TIMEOUT_S)
            sent = result.exit_code == 0
            if not sent:
                self._log.warning("kill -INT %s failed: %s", live.pid, result.output)
        except DaytonaKernelError as exc:
            self._log.warning("could not send the interrupt: %s", exc)
            sent = False
        grace = self._config.interrupt_grace if sent else 0.0
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.ensure_future(self._interrupt_watchdog(request, live, grace))

    async def _interrupt_watchdog(self, request: _Request, live: _Live, grace: float) -> None:
        try:
            await asyncio.wait_for(request.done.wait(), grace)
            return
        except asyncio.TimeoutError:
            self._log.warning("the cell ignored the interrupt for %ss; restarting the context", grace)
        request.restarted_by_watchdog = True
        await self._close_quietly(live.context)


def _run_error_content(error: RunError) -> dict[str, Any]:
    """An error the runtime did not catch itself (it escaped the runtime)."""
    if error.name == "KeyboardInterrupt":
        return error_content("KeyboardInterrupt", error.value or "Interrupted by user")
    tb = [f"\x1b[0;31m{error.name}\x1b[0m: {error.value}"]
    if error.traceback:
        tb.insert(0, error.traceback)
    return {"ename": error.name, "evalue": error.value, "traceback": tb}
