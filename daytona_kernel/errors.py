"""The project's own exceptions. Each message tells the user what to do next.

Backends translate their failures into these at one boundary, so the session
and the kernel never see SDK or OS exceptions.
"""

from __future__ import annotations


class DaytonaKernelError(Exception):
    """Base class. ``str(exc)`` is a complete, user-facing message."""

    ename = "DaytonaKernelError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(DaytonaKernelError):
    """The kernel's configuration is invalid; it lists every problem found."""

    ename = "DaytonaKernelConfigError"


class BackendError(DaytonaKernelError):
    """The sandbox backend failed in a way that is not about one cell."""

    ename = "SandboxError"


class AuthError(BackendError):
    """Daytona refused the credentials: retrying will not help."""

    ename = "DaytonaAuthError"


class QuotaExceeded(BackendError):
    """Daytona refused a new sandbox: the organisation's CPU, memory, disk or GPU quota is used up."""

    ename = "DaytonaQuotaExceeded"


class SandboxNotRunning(BackendError):
    """The sandbox could not run the request (stopped, archived, unreachable); no code ran."""

    ename = "SandboxNotRunning"


class SandboxPaused(SandboxNotRunning):
    """The sandbox is paused (or pausing, or resuming): resume it; its contexts and variables are intact."""

    ename = "SandboxPaused"


class SandboxGone(SandboxNotRunning):
    """The sandbox no longer exists (deleted, destroyed, or ephemeral and stopped): find or create another."""

    ename = "SandboxGone"


class ContextDied(BackendError):
    """The interpreter context's worker exited while (or before) running code."""

    ename = "SandboxContextDied"


class ContextTimeout(BackendError):
    """The backend stopped a run because it exceeded its time limit.

    Daytona also reports an interrupt we sent ourselves this way (close 4008),
    so the session decides whether it was an interrupt or a timeout.
    """

    ename = "CellTimeoutError"


class ConnectionLost(BackendError):
    """The stream of a running cell was cut off; the cell's fate is unknown."""

    ename = "SandboxConnectionLost"


class ProtocolError(BackendError):
    """The sandbox sent a frame that does not fit the protocol (wrong shape, too big, too deep)."""

    ename = "SandboxProtocolError"


class UsageError(DaytonaKernelError):
    """A kernel-side magic was called the wrong way; the message shows the right way."""

    ename = "UsageError"


class RuntimeCallError(BackendError):
    """A call into the runtime (checkpoint, restore, file_changes ...) failed; the message says how."""

    ename = "SandboxRuntimeError"


class Interrupted(DaytonaKernelError):
    """The user interrupted something the kernel itself waited for (following an attached cell)."""

    ename = "KeyboardInterrupt"


class MirrorError(DaytonaKernelError):
    """The workdir mirror refused or could not move one file (a path outside the folder, a symlink in the way ...)."""

    ename = "MirrorError"


class FolderNotSynced(MirrorError):
    """Part of the project folder is not in the sandbox yet (one sync's budget was reached): the cell did not run."""

    ename = "FolderNotSynced"
