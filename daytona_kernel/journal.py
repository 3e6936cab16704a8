"""Sessions that outlive their kernel: finding a detached one, attaching to it, ending old ones.

The daemon keeps an interpreter context's worker running when its websocket client goes
(the kernel was SIGKILLed, the laptop slept), drains its output and drops it. The runtime
journals each cell's output on the sandbox's disk (``runtime/journal.py``), so a new kernel
process can replay what it missed, follow the cell to its end and take the context over.
See docs/reattach.md for the daemon facts this rests on.

Every journal operation from here is one ``process.exec`` of the journal module's own source with
one typed call (``journal_call``; ``runtime.journal_command``): it runs beside the interpreter, so it
works while the old cell still runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import os
import posixpath
import re
import secrets
import socket
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from .backends.base import ExecResult, Sandbox
from .cell import Frontend, stderr
from .config import SessionSettings
from .errors import BackendError, DaytonaKernelError, Interrupted, UsageError
from .outputs import OutputBudget, OutputPolicy
from .protocol import InputRequest
from .request import Request, fetcher
from .runtime import journal_command
from .runtime.calls import ClaimSession, JournalCall, JournalOptions, ReadJournal, RemoveJournal, ScanJournals
from .runtime.journal import PID_MAX, SESSION_NAME, SKIPPED
from .runtime.journal import loads as journal_loads

JOURNAL_EXEC_TIMEOUT_S = 30.0
FOLLOW_POLL_S = 0.3  # how often a followed cell's journal is read while it prints nothing new
FOLLOW_LIVE_CHECK_S = 10.0  # how often a followed cell's context is looked up in the daemon's live contexts
KERNEL_PROCESS_MARK = b"daytona_kernel"  # in the command line of every kernel process
# Every value below comes from a file a cell can write: typed and bounded before use.
_TOKEN = re.compile(r"^[0-9a-f]{8,64}$")
_HEX = re.compile(r"^[0-9a-f]{1,64}$")
_UNSHOWN = re.compile(r"[^\w .,:+@()/\[\]-]")
MAX_COUNT = 10**9
MAX_OFFSET = 2**40
LATEST_TIME = 1e11  # seconds since 1970: the year 5138
T = TypeVar("T")


class JournalHost(Protocol):
    """What the journal's verbs need of a toolbox (a ``Sandbox``'s, or ``gc``'s of a sandbox it found)."""

    async def exec(self, command: str, timeout: float | None = None) -> ExecResult: ...

    async def live_contexts(self) -> set[str]: ...

    async def end_context(self, context_id: str) -> None: ...


async def journal_call(toolbox: JournalHost, call: JournalCall) -> dict[str, Any]:
    """One journal verb, run as a process command beside the interpreter (``journal.main``)."""
    result = await toolbox.exec(journal_command(call), timeout=JOURNAL_EXEC_TIMEOUT_S)
    value = _last_json(result.output) if result.exit_code == 0 else None
    if value is None or "error" in value:
        detail = value["error"] if value is not None else result.output.strip()
        raise BackendError(f"The session journal in the sandbox could not be read ({call.METHOD}): {shown(detail, 300)}")
    return value


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


def _count(value: Any, top: int = MAX_COUNT) -> int | None:
    """A non-negative int no bigger than ``top`` (not a bool, a float or a string), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top else None


def _time(value: Any) -> float | None:
    """A finite time in seconds since 1970, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value <= LATEST_TIME else None


def shown(value: Any, limit: int = 80) -> str:
    """A string a cell wrote, safe to put in a message: plain characters only, bounded."""
    return _UNSHOWN.sub("", value)[:limit] if isinstance(value, str) else ""


def _tag(key: str, what: str) -> str:
    return hmac.new(key.encode(), what.encode(), hashlib.sha256).hexdigest()[:32]


def _pad(key: str, instance: str) -> int:
    """A one-time pad for one kernel process's pid: only a holder of the key can unseal it."""
    return int(_tag(key, "pid:" + instance)[:8], 16)


@dataclass(frozen=True)
class KernelIdentity:
    """This kernel process, as a session's owner. ``instance`` is new in every process, so a
    restarted kernel (same Jupyter id) is a different owner.

    What it writes into the sandbox's journal says nothing a cell could use about this machine:
    the host name and the notebook's path only as keyed hashes, the pid sealed with the key
    (``identity.journal_key``, which stays here)."""

    kernel: str
    notebook: str  # the notebook's path here (JPY_SESSION_NAME); never written to the sandbox as it is
    instance: str = field(default_factory=lambda: secrets.token_hex(8))
    pid: int = field(default_factory=os.getpid)

    @cached_property
    def key(self) -> str:
        from .errors import ConfigError
        from .identity import journal_key

        try:
            return journal_key()
        except ConfigError as exc:  # no writable Jupyter data folder: sessions of this process only
            logging.getLogger(__name__).warning("%s; detached sessions will not be recognised after a restart", exc)
            return secrets.token_hex(16)

    @property
    def notebook_tag(self) -> str:
        return _tag(self.key, "notebook:" + self.notebook) if self.notebook else ""

    @property
    def notebook_name(self) -> str:
        """What the journal shows of the notebook: its file name (the sandbox has the file anyway)."""
        return posixpath.basename(self.notebook.replace("\\", "/"))

    def owner(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "kernel": self.kernel,
            "host": _tag(self.key, "host:" + socket.gethostname()),
            "pid": self.pid ^ _pad(self.key, self.instance),
            "claimed_at": time.time(),
        }

    def owner_alive(self, owner: dict[str, Any]) -> bool | None:
        """Whether a session's owning kernel process still runs: True, False, or None when it runs on
        another machine (then nobody here can tell)."""
        instance, sealed = owner.get("instance"), _count(owner.get("pid"), 2**32)
        if owner.get("host") != _tag(self.key, "host:" + socket.gethostname()):
            return None
        if not isinstance(instance, str) or not _HEX.match(instance) or sealed is None:
            return False
        return pid_is_kernel(sealed ^ _pad(self.key, instance))


def pid_is_kernel(pid: int) -> bool:
    """Whether ``pid`` is a kernel process on this machine."""
    if not 0 < pid <= PID_MAX:
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

    context_id: str  # its interpreter context's id (the journal's "session")
    notebook: str  # the keyed hash of its notebook's path (``KernelIdentity.notebook_tag``)
    name: str  # its notebook's file name, for messages
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
    def parse(cls, entry: Any, now: float, identity: KernelIdentity) -> Detached | None:
        """One session as the journal's scan reports it, or None when any value is not what the runtime
        writes (a cell can write the journal: nothing in it is trusted)."""
        meta = entry.get("meta") if isinstance(entry, dict) else None
        owner = entry.get("owner") if isinstance(entry, dict) else None
        if not isinstance(meta, dict) or not isinstance(owner, dict):
            return None
        session, token, pid = meta.get("session"), meta.get("token"), _count(meta.get("pid"), PID_MAX)
        if not isinstance(session, str) or not SESSION_NAME.match(session) or not isinstance(token, str):
            return None
        if not _TOKEN.match(token) or not pid:
            return None
        counts = [_count(meta.get(name, 0)) for name in ("count", "variables", "cell_count")]
        times = [_time(meta.get(name, 0)) for name in ("last_cell_at", "started_at")]
        if None in counts or None in times:
            return None
        count, variables, cell_count = (int(c or 0) for c in counts)
        last = times[0] or times[1] or now
        notebook = meta.get("notebook")
        return cls(
            context_id=session,
            notebook=notebook if isinstance(notebook, str) and _HEX.match(notebook) else "",
            name=shown(meta.get("name")),
            token=token,
            pid=pid,
            python=shown(meta.get("python"), 20),
            count=count,
            variables=variables,
            running=meta.get("state") == "running" and entry.get("alive") is True,
            cell_count=cell_count,
            idle_s=max(0.0, now - last),
            owner=owner,
            owner_alive=identity.owner_alive(owner),
        )

    @property
    def owner_kernel(self) -> str:
        return shown(self.owner.get("kernel"), 40) or "?"

    def describe(self) -> str:
        what = f"{self.variables} variable{'s' if self.variables != 1 else ''}"
        if self.running:
            return f"{what}, cell [{self.cell_count}] still running"
        if self.count:
            return f"{what}, last cell [{self.count}] ran {_ago(self.idle_s)}"
        return f"{what}, no cell run yet"


def scan_time(scanned: dict[str, Any]) -> float:
    """The sandbox's clock as its scan reported it, when it is a sane time; else this machine's."""
    return _time(scanned.get("now")) or time.time()


def _where(session: Detached) -> str:
    return "on this machine" if session.owner_alive is not None else "on another machine"


def _last_json(output: str) -> dict[str, Any] | None:
    """The JSON object on the last line of a journal command's output (which a cell can forge), or None."""
    lines = output.strip().splitlines()
    try:
        value = journal_loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


async def _unless(stop: asyncio.Event, awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result, or Interrupted as soon as ``stop`` is set (the awaitable is cancelled)."""
    task = asyncio.ensure_future(awaitable)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        raise Interrupted("Interrupted by user")
    return task.result()


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

    def options(self, context_id: str) -> JournalOptions:
        """The runtime's journal options for a new context of this kernel."""
        return JournalOptions(
            root=posixpath.relpath(self.root, self._sandbox.workdir),
            session=context_id,
            instance=self.identity.instance,
            owner=self.identity.owner(),
            notebook=self.identity.notebook_tag,
            name=self.identity.notebook_name,
        )

    async def _exec(self, call: JournalCall) -> dict[str, Any]:
        return await journal_call(self._sandbox.toolbox, call)

    # -- finding sessions ----------------------------------------------------------

    async def sessions(self, mine: str | None = None) -> list[Detached]:
        """The sessions this process does not own, whose interpreter still runs. Journals of contexts
        that are gone are removed; detached sessions idle past ``detached_idle_minutes`` are ended."""
        scanned = await self._exec(ScanJournals(root=self.root))
        live = await self._sandbox.toolbox.live_contexts()
        found: list[Detached] = []
        for session in self._parsed(scanned):
            if session.context_id == mine or session.owner.get("instance") == self.identity.instance:
                continue
            if session.context_id not in live:
                await self._exec(RemoveJournal(folder=self.folder(session.context_id)))  # its context was deleted
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
        self._log.info("ending detached session %s (%s)", session.context_id, why)
        await self._sandbox.toolbox.end_context(session.context_id)
        await self._exec(RemoveJournal(folder=self.folder(session.context_id)))

    def _parsed(self, scanned: dict[str, Any]) -> list[Detached]:
        """The sessions of a scan, each checked; a malformed one is logged and left out, never raised."""
        entries = scanned.get("sessions")
        now = scan_time(scanned)
        found = []
        for entry in entries if isinstance(entries, list) else []:
            session = Detached.parse(entry, now, self.identity)
            if session is None:
                self._log.warning("a session journal in the sandbox is malformed; it is ignored")
            else:
                found.append(session)
        return found

    def attachable(self, sessions: list[Detached]) -> list[Detached]:
        """This notebook's sessions whose kernel is known to be gone."""
        return [s for s in sessions if s.notebook == self.identity.notebook_tag and s.owner_alive is False]

    def _others(self, mine: str, scanned: dict[str, Any]) -> list[Detached]:
        return [s for s in self._parsed(scanned) if s.context_id != mine and s.owner.get("instance") != self.identity.instance]

    def may_offer(self, mine: str, scanned: dict[str, Any]) -> bool:
        """Whether ``look`` may have a session to offer, from the scan alone (no round trip)."""
        return self._settings.attach != "never" and bool(self.attachable(self._others(mine, scanned)))

    async def look(self, mine: str, scanned: dict[str, Any]) -> str:
        """Once per kernel process, after its context started: a one-line notice when this
        notebook's previous session is still alive in the sandbox ("" otherwise). ``scanned`` is
        the runtime's scan from its hello (no extra round trip); expired sessions are ended."""
        if self._looked or self._settings.attach == "never":
            return ""
        self._looked = True
        found = self._others(mine, scanned)
        try:
            for session in [s for s in found if self.expired(s)]:
                found.remove(session)
                await self.end(session, f"idle for {session.idle_s / 60:.0f} min")
            candidates = self.attachable(found)
            if candidates:  # the journal survives a stop of the sandbox, its contexts do not: ask the daemon
                live = await self._sandbox.toolbox.live_contexts()
                candidates = [s for s in candidates if s.context_id in live]
        except DaytonaKernelError as exc:
            self._log.warning("could not look at the detached sessions: %s", exc)
            return ""
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
            who = "detached" if s.owner_alive is False else f"owned by kernel {s.owner_kernel} {_where(s)}"
            parts.append(f"{s.context_id[:8]} ({s.name or 'notebook unknown'}: {s.describe()}; {who})")
        return f"{len(sessions)}: " + "; ".join(parts) + f"; detached ones end after {limit:g} min idle"

    # -- attaching -------------------------------------------------------------------

    async def pick(self, args: list[str], mine: str | None) -> Detached:
        force = "--force" in args
        wanted = [a for a in args if not a.startswith("--")]
        sessions = await self.sessions(mine)
        if wanted:
            chosen = [s for s in sessions if s.context_id.startswith(wanted[0])]
        else:
            chosen = [s for s in sessions if s.notebook == self.identity.notebook_tag]
        if not force:
            busy = [s for s in chosen if s.owner_alive is not False]
            chosen = [s for s in chosen if s.owner_alive is False]
            if not chosen and busy:
                raise UsageError(
                    f"The session {busy[0].context_id[:8]} belongs to kernel {busy[0].owner_kernel} {_where(busy[0])}, "
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
        expected = str(session.owner.get("instance") or "")
        result = await self._exec(
            ClaimSession(folder=self.folder(session.context_id), expected=expected, owner=self.identity.owner())
        )
        if result.get("ok") is not True:
            other = result.get("owner")
            kernel = shown(other.get("kernel"), 40) if isinstance(other, dict) else ""
            raise UsageError(
                f"Another kernel ({kernel or '?'}) attached to this session first; this kernel keeps its fresh namespace."
            )

    async def release(self, session: Detached) -> None:
        """Give a claimed session back to its previous owner (the user stopped following it)."""
        previous = ClaimSession(folder=self.folder(session.context_id), expected=self.identity.instance, owner=session.owner)
        try:
            await self._exec(previous)
        except DaytonaKernelError as exc:
            self._log.warning("could not give the session %s back: %s", session.context_id, exc)

    async def follow(self, session: Detached, frontend: Frontend, stop: asyncio.Event) -> bool:
        """Replay the session's last cell into ``frontend``, then follow it live until it ends.
        False if its interpreter died meanwhile; Interrupted when ``stop`` is set (an interrupt)."""

        def no_input(event: InputRequest) -> None:
            frontend.emit(
                "stream",
                stderr("daytona-kernel: the attached cell waits for input(); it cannot be answered from here. Interrupt it.\n"),
            )

        budget = OutputBudget(self._settings.output_limit_chars)
        request = Request(session.token, frontend.emit, no_input, self._policy, budget, fetch=fetcher(self._sandbox))
        folder = self.folder(session.context_id)
        n = offset = 0
        loop = asyncio.get_running_loop()
        checked = loop.time()
        try:
            while True:
                read = await _unless(stop, self._exec(ReadJournal(folder=folder, n=n, offset=offset)))
                if read.get("lost") is True:
                    frontend.emit(
                        "stream", stderr("daytona-kernel: the start of this cell's output was rotated out of the journal.\n")
                    )
                records = read.get("records")
                records = records if isinstance(records, list) else []
                _replay(records, request, frontend)
                new_n, new_offset = _count(read.get("n"), MAX_OFFSET), _count(read.get("offset"), MAX_OFFSET)
                if new_n is None or new_offset is None or (new_n, new_offset) < (n, offset):
                    raise BackendError("The session journal in the sandbox went backwards or is malformed; stopped following it.")
                moved = (new_n, new_offset) != (n, offset)
                n, offset = new_n, new_offset
                meta = read.get("meta")
                running = isinstance(meta, dict) and meta.get("state") == "running"
                if records and moved:
                    continue
                if not running:
                    return True
                if read.get("alive") is not True:
                    return False
                if loop.time() - checked > FOLLOW_LIVE_CHECK_S:  # the daemon has the last word on a context
                    checked = loop.time()
                    if session.context_id not in await _unless(stop, self._sandbox.toolbox.live_contexts()):
                        return False
                await _unless(stop, asyncio.sleep(FOLLOW_POLL_S))
        finally:
            await request.settle()
            request.finish()
            if request.error is not None and not request.error_shown:
                frontend.emit("error", request.error)

    async def forget(self, session: str) -> None:
        """Remove the journal of a context this kernel closed."""
        try:
            await self._exec(RemoveJournal(folder=self.folder(session)))
        except DaytonaKernelError as exc:
            self._log.warning("could not remove the journal of context %s: %s", session, exc)


def _replay(records: list[Any], request: Request, frontend: Frontend) -> None:
    """A journal's records (which a cell can forge) into the request that reads them as a cell's output."""
    for record in records:
        kind = record.get("type") if isinstance(record, dict) else None
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            continue
        if kind == SKIPPED:
            frontend.emit(
                "stream",
                stderr(
                    f"daytona-kernel: a line of {shown(text, 20)} bytes in the journal was too long to replay; it was passed over.\n"
                ),
            )
        else:
            (request.on_stderr if kind == "stderr" else request.on_stdout)(text)


async def reclaim_detached(
    toolbox: JournalHost, sandbox_id: str, workdir: str, idle_minutes: float, dry_run: bool, out: Callable[[str], None]
) -> int:
    """``daytona-kernel gc``: end the detached sessions of a started sandbox idle past ``idle_minutes``;
    returns how many detached sessions it keeps (younger, or with a cell running).
    A journal a cell forged is named and left alone: it never stops the cleanup."""
    root = journal_root(workdir)
    try:
        scanned = await journal_call(toolbox, ScanJournals(root=root))
    except BackendError as exc:
        out(f"error: could not read the session journal of {sandbox_id}: {exc}")
        return 0
    contexts = await toolbox.live_contexts()
    identity = KernelIdentity("", "")
    now = scan_time(scanned)
    entries = scanned.get("sessions")
    kept = 0
    for entry in entries if isinstance(entries, list) else []:
        session = Detached.parse(entry, now, identity)
        if session is None:
            out(f"skipped a malformed session journal in {sandbox_id}")
            continue
        if session.context_id not in contexts or session.owner_alive is True:
            continue
        what = f"detached session {session.context_id[:8]} in {sandbox_id} ({session.name or 'notebook unknown'}: {session.describe()})"
        if session.running or session.idle_s <= idle_minutes * 60:
            kept += 1
            out(f"kept {what}: `%daytona attach` continues it; it is ended after {idle_minutes:g} min idle")
        elif dry_run:
            out(f"would end {what}")
        else:
            await toolbox.end_context(session.context_id)
            await journal_call(toolbox, RemoveJournal(folder=posixpath.join(root, session.context_id)))
            out(f"ended {what}")
    return kept
