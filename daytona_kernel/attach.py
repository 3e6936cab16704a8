"""Sessions that outlive their kernel: finding a detached one, attaching to it, ending old ones.

The daemon keeps an interpreter context's worker running when its websocket client goes
(the kernel was SIGKILLed, the laptop slept), drains its output and drops it. The runtime
journals each cell's output on the sandbox's disk (``runtime/journal.py``), so a new kernel
process can replay what it missed, follow the cell to its end and take the context over.
See docs/reattach.md for the daemon facts this rests on.

Every journal operation from here is one ``process.exec`` of the journal module's own source
(``python3 -c``): it runs beside the interpreter, so it works while the old cell still runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import secrets
import shlex
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .backends.base import Sandbox
from .cell import Frontend, stderr
from .config import SessionSettings
from .errors import BackendError, DaytonaKernelError, UsageError
from .outputs import OutputBudget, OutputPolicy
from .protocol import InputRequest
from .request import Request
from .runtime import journal_script

JOURNAL_EXEC_TIMEOUT_S = 30.0
FOLLOW_POLL_S = 0.3  # how often a followed cell's journal is read while it prints nothing new
KERNEL_PROCESS_MARK = b"daytona_kernel"  # in the command line of every kernel process


def journal_root(workdir: str) -> str:
    """Where sessions are journaled: beside the working directory, never inside it (it is mirrored)."""
    return posixpath.join(posixpath.dirname(workdir.rstrip("/")), ".daytona-kernel", "journal")


def _ago(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return "just now"
    if minutes < 120:
        return f"{minutes} min ago"
    return f"{minutes // 60} h {minutes % 60} min ago"


@dataclass(frozen=True)
class KernelIdentity:
    """This kernel process, as a session's owner. ``instance`` is new in every process, so a
    restarted kernel (same Jupyter id) is a different owner."""

    kernel: str
    notebook: str
    instance: str = field(default_factory=lambda: secrets.token_hex(8))
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)

    def owner(self) -> dict[str, Any]:
        return {"instance": self.instance, "kernel": self.kernel, "host": self.host, "pid": self.pid, "claimed_at": time.time()}


def owner_alive(owner: dict[str, Any]) -> bool | None:
    """Whether a session's owning kernel process still runs: True, False, or None when it runs on
    another machine (then nobody here can tell)."""
    if owner.get("host") != socket.gethostname():
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self").exists():  # a zombie or another program with that pid is not our kernel
        try:
            return KERNEL_PROCESS_MARK in cmdline.read_bytes()
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Detached:
    """A session in the sandbox that this kernel process does not own."""

    session: str  # its interpreter context's id
    notebook: str
    token: str
    pid: int
    python: str
    count: int
    variables: int
    running: bool
    cell_count: int
    idle_s: float  # since its last cell ended (or it started)
    owner: dict[str, Any]
    owner_alive: bool | None

    @classmethod
    def parse(cls, entry: dict[str, Any], now: float) -> Detached | None:
        meta = entry.get("meta") or {}
        try:
            last = float(meta.get("last_cell_at") or meta.get("started_at") or now)
            return cls(
                session=str(meta["session"]),
                notebook=str(meta.get("notebook") or ""),
                token=str(meta["token"]),
                pid=int(meta["pid"]),
                python=str(meta.get("python") or ""),
                count=int(meta.get("count") or 0),
                variables=int(meta.get("variables") or 0),
                running=meta.get("state") == "running" and bool(entry.get("alive")),
                cell_count=int(meta.get("cell_count") or 0),
                idle_s=max(0.0, now - last),
                owner=dict(entry.get("owner") or {}),
                owner_alive=owner_alive(dict(entry.get("owner") or {})),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        what = f"{self.variables} variable{'s' if self.variables != 1 else ''}"
        if self.running:
            return f"{what}, cell [{self.cell_count}] still running"
        if self.count:
            return f"{what}, last cell [{self.count}] ran {_ago(self.idle_s)}"
        return f"{what}, no cell run yet"


@dataclass
class Adopted:
    """What the kernel takes over from an attached session: its execution count and inputs."""

    count: int
    inputs: list[tuple[int, str]]


class SessionJournal:
    """The kernel's side of the session journal: see the module docstring."""

    def __init__(
        self, sandbox: Sandbox, settings: SessionSettings, identity: KernelIdentity, policy: OutputPolicy, log: logging.Logger
    ) -> None:
        self._sandbox = sandbox
        self._settings = settings
        self.identity = identity
        self._policy = policy
        self._log = log
        self.candidate: Detached | None = None  # this notebook's detached session, found at start
        self._looked = False
        self._auto_done = False

    @property
    def root(self) -> str:
        return journal_root(self._sandbox.workdir)

    def folder(self, session: str) -> str:
        return posixpath.join(self.root, session)

    def options(self, context_id: str) -> dict[str, Any]:
        """The runtime's journal options for a new context of this kernel."""
        return {
            "root": posixpath.relpath(self.root, self._sandbox.workdir),
            "session": context_id,
            "notebook": self.identity.notebook,
            "instance": self.identity.instance,
            "owner": self.identity.owner(),
        }

    async def _exec(self, verb: str, *args: str | int) -> dict[str, Any]:
        command = " ".join(["python3", "-c", shlex.quote(journal_script()), verb, *(shlex.quote(str(a)) for a in args)])
        result = await self._sandbox.exec(command, timeout=JOURNAL_EXEC_TIMEOUT_S)
        text = result.output.strip().splitlines()[-1] if result.output.strip() else ""
        try:
            value = json.loads(text) if result.exit_code == 0 else None
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise BackendError(f"The session journal in the sandbox could not be read ({verb}): {result.output.strip()[:300]}")
        return value

    # -- finding sessions ----------------------------------------------------------

    async def sessions(self, mine: str | None = None) -> list[Detached]:
        """The sessions this process does not own, whose interpreter still runs. Journals of contexts
        that are gone are removed; detached sessions idle past ``detached_idle_minutes`` are ended."""
        scanned = await self._exec("scan", self.root)
        live = await self._sandbox.live_contexts()
        now = float(scanned.get("now") or time.time())
        found: list[Detached] = []
        for entry in scanned.get("sessions") or []:
            session = Detached.parse(entry, now)
            if session is None or session.session == mine or session.owner.get("instance") == self.identity.instance:
                continue
            if session.session not in live:
                await self._exec("remove", self.folder(session.session))  # its context was deleted
                continue
            if self.expired(session):
                await self.end(session, f"idle for {session.idle_s / 60:.0f} min")
                continue
            found.append(session)
        return found

    def expired(self, session: Detached) -> bool:
        """Detached (its kernel is gone, here or elsewhere) and idle past the limit, with no cell running."""
        return (
            session.owner_alive is not True and not session.running and session.idle_s > self._settings.detached_idle_minutes * 60
        )

    async def end(self, session: Detached, why: str) -> None:
        self._log.info("ending detached session %s (%s)", session.session, why)
        await self._sandbox.end_context(session.session)
        await self._exec("remove", self.folder(session.session))

    def attachable(self, sessions: list[Detached]) -> list[Detached]:
        """This notebook's sessions whose kernel is known to be gone."""
        return [s for s in sessions if s.notebook == self.identity.notebook and s.owner_alive is False]

    async def look(self, mine: str, scanned: dict[str, Any]) -> str:
        """Once per kernel process, after its context started: a one-line notice when this
        notebook's previous session is still alive in the sandbox ("" otherwise). ``scanned`` is
        the runtime's scan from its hello (no extra round trip); expired sessions are ended."""
        if self._looked or self._settings.attach == "never":
            return ""
        self._looked = True
        now = float(scanned.get("now") or time.time()) if isinstance(scanned.get("now"), (int, float)) else time.time()
        found = []
        for entry in scanned.get("sessions") or []:
            session = Detached.parse(entry, now) if isinstance(entry, dict) else None
            if session is not None and session.session != mine and session.owner.get("instance") != self.identity.instance:
                found.append(session)
        try:
            for session in [s for s in found if self.expired(s)]:
                found.remove(session)
                await self.end(session, f"idle for {session.idle_s / 60:.0f} min")
        except DaytonaKernelError as exc:
            self._log.warning("could not end a detached session: %s", exc)
        candidates = self.attachable(found)
        if not candidates:
            return ""
        self.candidate = max(candidates, key=lambda s: -s.idle_s)
        if self._settings.attach == "auto":
            return ""
        more = f" ({len(candidates) - 1} more: `%daytona status`)" if len(candidates) > 1 else ""
        return (
            f"daytona-kernel: this notebook's previous session is still alive in the sandbox ({self.candidate.describe()})"
            f"{more}. Run `%daytona attach` to continue it; this kernel has a fresh namespace until then.\n"
        )

    def take_auto(self) -> bool:
        """Whether to attach before this cell (attach='auto', a session was found, not done yet)."""
        if self._auto_done or self._settings.attach != "auto" or self.candidate is None:
            return False
        self._auto_done = True
        return True

    async def status(self, mine: str | None) -> str:
        """One line for %daytona status."""
        sessions = await self.sessions(mine)
        if not sessions:
            return "none detached"
        limit = self._settings.detached_idle_minutes
        parts = []
        for s in sessions:
            who = "detached" if s.owner_alive is False else f"owned by kernel {s.owner.get('kernel')} on {s.owner.get('host')}"
            parts.append(f"{s.session[:8]} ({s.notebook or 'notebook unknown'}: {s.describe()}; {who})")
        return f"{len(sessions)}: " + "; ".join(parts) + f"; detached ones end after {limit:g} min idle"

    # -- attaching -------------------------------------------------------------------

    async def pick(self, args: list[str], mine: str | None) -> Detached:
        force = "--force" in args
        wanted = [a for a in args if not a.startswith("--")]
        sessions = await self.sessions(mine)
        if wanted:
            chosen = [s for s in sessions if s.session.startswith(wanted[0])]
        else:
            chosen = [s for s in sessions if s.notebook == self.identity.notebook]
        if not force:
            busy = [s for s in chosen if s.owner_alive is not False]
            chosen = [s for s in chosen if s.owner_alive is False]
            if not chosen and busy:
                owner = busy[0].owner
                raise UsageError(
                    f"The session {busy[0].session[:8]} belongs to kernel {owner.get('kernel')} on {owner.get('host')}, "
                    "which may still run. `%daytona attach --force` takes it over (that kernel's next cell is then refused)."
                )
        if not chosen:
            raise UsageError(
                "No detached session of this notebook in the sandbox: its kernel shut down cleanly, was restarted, or "
                "the session ended. `%daytona status` lists the sessions there are."
            )
        return max(chosen, key=lambda s: -s.idle_s)

    async def claim(self, session: Detached) -> None:
        """Become the session's owner; fails if another kernel claimed it first."""
        owner = json.dumps(self.identity.owner())
        result = await self._exec("claim", self.folder(session.session), str(session.owner.get("instance") or ""), owner)
        if not result.get("ok"):
            other = result.get("owner") or {}
            raise UsageError(
                f"Another kernel ({other.get('kernel')} on {other.get('host')}) attached to this session first; "
                "this kernel keeps its fresh namespace."
            )

    async def follow(self, session: Detached, frontend: Frontend) -> bool:
        """Replay the session's last cell into ``frontend``, then follow it live until it ends.
        False if its interpreter died meanwhile."""

        def no_input(event: InputRequest) -> None:
            frontend.emit(
                "stream",
                stderr("daytona-kernel: the attached cell waits for input(); it cannot be answered from here. Interrupt it.\n"),
            )

        request = Request(
            session.token, frontend.emit, no_input, self._policy, OutputBudget(int(self._settings.output_limit_mb * 1024 * 1024))
        )
        folder = self.folder(session.session)
        n = offset = 0
        try:
            while True:
                read = await self._exec("read", folder, n, offset)
                if read.get("lost"):
                    frontend.emit(
                        "stream", stderr("daytona-kernel: the start of this cell's output was rotated out of the journal.\n")
                    )
                records = read.get("records") or []
                for record in records:
                    text = record.get("text") if isinstance(record, dict) else None
                    if isinstance(text, str):
                        (request.on_stderr if record.get("type") == "stderr" else request.on_stdout)(text)
                n, offset = int(read.get("n") or 0), int(read.get("offset") or 0)
                running = (read.get("meta") or {}).get("state") == "running"
                if records:
                    continue
                if not running:
                    return True
                if not read.get("alive"):
                    return False
                await asyncio.sleep(FOLLOW_POLL_S)
        finally:
            request.finish()
            if request.error is not None and not request.error_shown:
                frontend.emit("error", request.error)

    @staticmethod
    def adopted(reply: dict[str, Any]) -> Adopted:
        count = reply.get("count")
        inputs = [
            (int(item[0]), item[1])
            for item in reply.get("inputs") or []
            if isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) and isinstance(item[1], str)
        ]
        return Adopted(count if isinstance(count, int) and count >= 0 else 0, inputs)

    async def forget(self, session: str) -> None:
        """Remove the journal of a context this kernel closed."""
        try:
            await self._exec("remove", self.folder(session))
        except DaytonaKernelError as exc:
            self._log.warning("could not remove the journal of context %s: %s", session, exc)


async def reclaim_detached(sandbox: Any, workdir: str, idle_minutes: float, dry_run: bool, out: Callable[[str], None]) -> int:
    """``daytona-kernel gc``: end the detached sessions of a started sandbox (an SDK object) idle past
    ``idle_minutes``; returns how many detached sessions it keeps (younger, or with a cell running)."""
    root = journal_root(workdir)
    command = " ".join(["python3", "-c", shlex.quote(journal_script()), "scan", shlex.quote(root)])
    result = await sandbox.process.exec(command, timeout=int(JOURNAL_EXEC_TIMEOUT_S))
    try:
        scanned = json.loads((result.result or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        out(f"error: could not read the session journal of {sandbox.id}: {(result.result or '').strip()[:200]}")
        return 0
    contexts = {c.id: c for c in await sandbox.code_interpreter.list_contexts() if c.active}
    now = float(scanned.get("now") or time.time())
    kept = 0
    for entry in scanned.get("sessions") or []:
        session = Detached.parse(entry, now)
        if session is None or session.session not in contexts or session.owner_alive is True:
            continue
        what = f"detached session {session.session[:8]} in {sandbox.id} ({session.notebook or 'notebook unknown'}: {session.describe()})"
        if session.running or session.idle_s <= idle_minutes * 60:
            kept += 1
            out(f"kept {what}: `%daytona attach` continues it; it is ended after {idle_minutes:g} min idle")
        elif dry_run:
            out(f"would end {what}")
        else:
            await sandbox.code_interpreter.delete_context(contexts[session.session])
            await sandbox.process.exec(
                " ".join(
                    ["python3", "-c", shlex.quote(journal_script()), "remove", shlex.quote(posixpath.join(root, session.session))]
                ),
                timeout=int(JOURNAL_EXEC_TIMEOUT_S),
            )
            out(f"ended {what}")
    return kept
