"""The interface every backend implements, in two parts: the lifecycle (``Sandbox``: start, stop,
pause and resume, status) and the toolbox of a started sandbox (``Toolbox``: interpreter contexts, a
shell and files), as jupyter_client's provisioner keeps a kernel's lifecycle apart from its channels.

It is shaped after what Daytona offers, so the Daytona backend fits it as is:
a sandbox has interpreter contexts, a shell (``exec``) and a file API. A
context runs a code string, streams stdout/stderr chunks while it runs and
ends with an optional error (name, value, traceback), like the Daytona
interpreter's ``run_code``.

Failures are translated into ``daytona_kernel.errors`` at this boundary.
"""

from __future__ import annotations

import abc
import enum
import posixpath
from dataclasses import dataclass
from typing import BinaryIO, Callable

from ..errors import UsageError

LOCAL_ATTACH = (
    "%daytona attach needs the daytona backend: the local backend's interpreters are child processes of "
    "the kernel and end with it, so no session outlives a kernel here. Rerun the notebook, or use the "
    "daytona kernel for cells that must survive a closed window."
)
OutputCallback = Callable[[str], None]
ProgressCallback = Callable[[str], None]
"""Receives status lines while something slow runs; an empty line clears the status."""


class SandboxPolicy(str, enum.Enum):
    """What happens to the sandbox when the kernel shuts down."""

    REUSE = "reuse"  # found again by its labels; stopped at shutdown
    EPHEMERAL = "ephemeral"  # created per kernel; deleted at shutdown


class IdleMode(str, enum.Enum):
    """What happens to an idle sandbox (and to a 'reuse' sandbox at shutdown)."""

    PAUSE = "pause"  # memory and processes are kept: variables survive; only the disk is billed while paused
    STOP = "stop"  # only the disk is kept: variables are lost (checkpoint_on_idle saves them first)


@dataclass(frozen=True)
class RunError:
    """An exception that escaped the code string, as the interpreter reports it."""

    name: str
    value: str
    traceback: str


@dataclass(frozen=True)
class FileError:
    """One file of a bulk download that failed while the others went through."""

    message: str
    retry: bool  # True: a later attempt may work (5xx, timeout); False: it fails the same way again
    over_limit: bool = False  # the sandbox sent more bytes than the download's limit allowed


class NotShared(OSError):
    """``Toolbox.fetch`` could neither clone nor hard-link the file, and never copies one (it is over the size cap)."""


@dataclass(frozen=True)
class ExecResult:
    """The result of a shell command: exit code and combined stdout/stderr."""

    exit_code: int
    output: str


class Context(abc.ABC):
    """An interpreter context: one persistent Python namespace in the sandbox."""

    id: str

    @abc.abstractmethod
    async def run_code(
        self,
        code: str,
        on_stdout: OutputCallback,
        on_stderr: OutputCallback,
        timeout: float | None = None,
    ) -> RunError | None:
        """Run code, streaming output through the callbacks while it runs.

        Raises ContextTimeout when the run exceeded ``timeout`` (or was
        interrupted, on backends that report it that way), ContextDied when
        the worker went away, ConnectionLost when the stream broke.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Delete the context; its namespace is gone afterwards."""


class Toolbox(abc.ABC):
    """What runs in a started sandbox: interpreter contexts, a shell (``exec``) and files. The lifecycle
    (``Sandbox``) starts the sandbox and holds its toolbox; a caller that runs or moves something takes the
    toolbox (``sandbox.toolbox``), as jupyter_client's provisioner leaves the kernel's channels to the client.

    ``workdir`` is the cell's working directory, on the sandbox's own disk.
    """

    workdir: str

    on_this_disk = False
    """The sandbox's files are on this machine's disk (the local backend): the mirror moves big files
    with ``place``/``fetch`` (a clone or a link, never a second copy where the file system allows)
    instead of refusing them."""

    @abc.abstractmethod
    async def create_context(self) -> Context:
        """A new interpreter context whose cwd is the working directory."""

    @abc.abstractmethod
    async def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run a shell command in the sandbox's working directory."""

    @abc.abstractmethod
    async def upload(self, files: list[tuple[bytes, str]]) -> None:
        """Write (content, sandbox path) pairs, in as few requests as possible."""

    @abc.abstractmethod
    async def download(self, paths: list[str], limits: dict[str, int] | None = None) -> dict[str, bytes | FileError]:
        """Read sandbox paths, in as few requests as possible.

        A file that cannot be read is a ``FileError`` in the result; the call
        raises only when the whole request failed. ``limits``: the most bytes
        to take of a path; the sandbox decides what it sends, so a file over
        its limit is stopped there (never held whole in memory) and is a
        ``FileError`` with ``over_limit`` (``read_capped``).
        """

    @abc.abstractmethod
    async def clone(self, url: str, ref: str | None, dest: str, username: str | None, password: str | None) -> None:
        """Clone a git repository into ``dest`` (relative to the working directory)."""

    @abc.abstractmethod
    async def remove(self, paths: list[str]) -> None:
        """Delete files (paths relative to the working directory), in as few requests as possible."""

    async def place(self, local: str, dest: str, link: bool) -> None:
        """Make the sandbox path ``dest`` hold the local file ``local`` (only when ``on_this_disk``)."""
        raise NotImplementedError

    async def fetch(self, path: str, local: str, link: bool) -> None:
        """Make the local file ``local`` hold the sandbox path ``path`` (only when ``on_this_disk``): a clone,
        or with ``link`` a hard link; ``NotShared`` when neither can be made (it never copies: the file is over
        sync_max_file_mb, which a copy would spend)."""
        raise NotImplementedError

    def same_file(self, path: str, local: str) -> bool:
        """Whether the sandbox path and the local file are one file (a hard link), so nothing needs moving."""
        return False

    async def live_contexts(self) -> set[str]:
        """The ids of the sandbox's interpreter contexts whose worker runs (any kernel's)."""
        raise UsageError(LOCAL_ATTACH)

    async def adopt_context(self, context_id: str) -> Context:
        """Take over a context another (gone) kernel process created; it becomes this kernel's."""
        raise UsageError(LOCAL_ATTACH)

    async def end_context(self, context_id: str) -> None:
        """Delete a context that is not this kernel's (a detached session past its idle time)."""
        raise UsageError(LOCAL_ATTACH)


def read_capped(f: BinaryIO, limit: int | None) -> bytes | FileError:
    """A downloaded file's bytes, at most ``limit`` (one byte more tells it is over): both backends' last step."""
    content = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(content) > limit:
        return FileError(f"it is more than {limit} bytes", retry=False, over_limit=True)
    return content


class Sandbox(abc.ABC):
    """The lifecycle of a place to run code (a Daytona sandbox, or a local directory): start, pause and
    resume, stop, status. What runs in it once started goes through its ``toolbox``.

    ``workdir`` is the cell's working directory, on the sandbox's own disk;
    ``volume_dir`` is where the volume keeps its volume copy ("" for none).
    """

    id: str
    toolbox: Toolbox
    workdir: str
    volume_dir: str = ""
    generation: int = 0
    """Counts the sandboxes found or created: when it moves, everything installed in the old one is gone."""
    idle_mode: IdleMode = IdleMode.STOP
    auto_pause_s: float = 0.0
    """Seconds without activity after which the sandbox pauses itself (0: it does not)."""
    temp_dir: str = "/tmp"
    """The sandbox's folder for short-lived files (the runtime's comm inbox)."""
    blob_chars: int = 1024 * 1024
    """A string in a cell's output this long travels as a file the kernel downloads, not through the
    interpreter's output lines (0: never). See docs/benchmarks.md for what each way costs."""

    loading = False
    """Its own calls wait for a load that goes on in the background (a Daytona restart's quick start): what
    the first cell's result does not need may wait for it in the background too."""

    supports_attach = False
    """Whether a context can outlive the kernel process (and so be attached to by the next one)."""

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """One line for banners and status: what and where this sandbox is."""

    @abc.abstractmethod
    async def info(self) -> dict[str, str]:
        """What %daytona status shows: id, state, resources, uptime, auto-stop, volume."""

    @abc.abstractmethod
    async def start(self, progress: ProgressCallback) -> None:
        """Create or find the sandbox and wait until it can run code."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Release the sandbox according to its policy: stop it or delete it."""

    async def detach(self) -> None:
        """A kernel restart: let go of this process's contexts. Backends whose sandbox can outlive the
        process keep it for the next one; by default this is a shutdown."""
        await self.shutdown()

    async def resume_if_paused(self, progress: ProgressCallback) -> bool:
        """Resume the sandbox if it is paused (or pausing, or resuming); True if it was. Its processes,
        and so every context's variables, carry on where they were frozen."""
        return False

    async def recreate(self, progress: ProgressCallback) -> None:
        """Throw the sandbox away and start a new one with the current configuration."""
        raise UsageError("%daytona recreate needs the daytona backend: this sandbox is a local folder.")

    def take_notices(self) -> list[str]:
        """Lines for the user that arose while starting (shown before the next cell); each is given once."""
        return []

    async def first_start_settled(self) -> None:
        """After the runtime's install in a first start that ran ahead of the backend's own client (Daytona's
        ``_early_start``): wait until the backend has caught up (its settings and idle mode known), raising what
        it failed with. Nothing to wait for by default."""
        return None  # noqa: RET501 - a body, so B027 does not take the default for a forgotten @abstractmethod

    async def leave_next_context(self, code: str, timeout: float) -> None:
        """A kernel restart, before ``detach``: create the next kernel process's context and leave ``code``
        running in it, for at most ``timeout`` seconds (``take_next_context`` finds it). Backends whose
        contexts die with the process do nothing."""
        return None  # noqa: RET501 - a body, so B027 does not take the default for a forgotten @abstractmethod

    async def take_next_context(self) -> Context | None:
        """The context the previous process of this kernel left at its restart, now this one's; None if
        there is none (or it is gone)."""
        return None

    def volume_relpath(self) -> str:
        """What the runtime needs for the volume copy: the volume folder, relative to the working directory ("" for none)."""
        return posixpath.relpath(self.volume_dir, self.workdir) if self.volume_dir else ""

    @property
    def size_text(self) -> str:
        """What one sandbox like this one is, for the line before ``%%daytona map`` starts engines."""
        return "a worker process on this machine with its own copy of the project's files"
