"""Installing the runtime into a fresh interpreter context: the bootstrap (the runtime's source and its
options, then its ``hello``), the kernel's own IPython shipped to a sandbox whose Python lacks one, and
``repo_url`` cloned once per sandbox. The ``ContextSupervisor`` decides when; this module does it.
"""

from __future__ import annotations

import logging
import os
import posixpath
import secrets
import shlex
import time
from dataclasses import replace
from typing import Any, Callable

from . import ipython_bundle
from .backends.base import Context, Sandbox
from .cell import ProgressCallback
from .config import SessionSettings
from .errors import BackendError, DaytonaKernelError
from .journal import SessionJournal
from .protocol import Hello
from .request import RUNTIME_CALL_TIMEOUT_S, Request, run_in
from .runtime import bootstrap_code
from .runtime.calls import RuntimeOptions

OUTSIDE_A_CELL_LOG_CHARS = 200  # how much of an output that arrived outside a cell the log keeps


def repo_folder(url: str) -> str:
    """The folder a clone of ``url`` goes to, in the working directory."""
    return posixpath.basename(url.rstrip("/")).removesuffix(".git") or "repo"


async def close_quietly(context: Context, log: logging.Logger) -> None:
    """Delete a context; a failure is only logged (the sandbox's end removes it anyway)."""
    try:
        await context.close()
    except DaytonaKernelError as exc:
        log.warning("could not delete the old context %s: %s", context.id, exc)


class RuntimeInstaller:
    """See the module docstring. ``report`` shows a status line to whoever waits; ``notice`` queues a
    line for the user, shown before the next cell's output."""

    def __init__(
        self,
        sandbox: Sandbox,
        settings: SessionSettings,
        log: logging.Logger,
        journal: SessionJournal | None,
        report: ProgressCallback,
        notice: Callable[[str], None],
    ) -> None:
        self._sandbox = sandbox
        self._settings = settings
        self._log = log
        self._journal = journal
        self._report = report
        self._notice = notice

    async def install(self, context: Context, runtime_options: RuntimeOptions) -> tuple[str, Hello]:
        """Install the runtime into ``context`` and wait for its hello. On any failure
        (a timeout too) the context is closed, so a retry leaks nothing."""
        token = secrets.token_hex(8)
        request = Request(token, self.output_outside_a_cell)
        options = replace(
            runtime_options,
            volume_dir=self._sandbox.volume_relpath(),
            volume_link=self._sandbox.toolbox.on_this_disk,  # a volume on this disk: its copy is made of hard links
            ship_ipython=ipython_bundle.ipython_version(),
        )
        if self._journal is not None:
            options = replace(options, journal=self._journal.options(context.id))
        if self._settings.repo_url:  # a clone is not kept on the volume: a new sandbox clones it again
            options = replace(options, volume_excludes=["/" + repo_folder(self._settings.repo_url) + "/"])
        code = bootstrap_code(token, options)
        try:
            error = await run_in(context, code, request, RUNTIME_CALL_TIMEOUT_S)
        except BackendError:
            await close_quietly(context, self._log)
            raise
        hello = request.hello
        if error is not None or hello is None:
            await close_quietly(context, self._log)
            detail = f"{error.name}: {error.value}" if error else "it did not report back"
            raise BackendError(
                f"The runtime could not start in the sandbox ({detail}). The sandbox needs Python 3.9 or newer as `python3`."
            )
        return token, hello

    @staticmethod
    def wants_ipython(hello: Hello) -> bool:
        """The sandbox's Python has no usable IPython, and the kernel's own runs there."""
        return not hello.ipython and bool(hello.ipython_cache) and ipython_bundle.supports(hello.python)

    async def ship_ipython(self, context: Context, hello: Hello) -> bool:
        """Upload the kernel's pure-Python IPython into the sandbox's cache folder, once per sandbox.

        False (with a notice; cells then run on the basic shell) if it could not be installed.
        """
        self._report("installing IPython in the sandbox (once per sandbox)…")
        started = time.monotonic()
        reason, size = await ipython_bundle.ship(
            self._sandbox, context, hello.python, hello.ipython_cache, RUNTIME_CALL_TIMEOUT_S
        )
        if reason:
            self._log.warning("could not install IPython in the sandbox: %s", reason)
            self._notice(f"daytona-kernel: could not install IPython in the sandbox ({reason}); cells run on a basic shell.\n")
            return False
        self._log.info(
            "IPython %s installed in the sandbox: %.1f MB in %.1f s",
            ipython_bundle.ipython_version(),
            size / 1e6,
            time.monotonic() - started,
        )
        return True

    async def stage_repo(self) -> None:
        """Clone repo_url into the working directory (on the sandbox's disk), unless it is already cloned there."""
        url = self._settings.repo_url
        dest = repo_folder(url)
        check = await self._sandbox.toolbox.exec(f"test -d {shlex.quote(dest)}/.git")
        if check.exit_code == 0:
            self._notice(f"{dest}/ is already cloned in the working directory; left as it is.\n")
            return
        self._report(f"cloning {dest}…")
        await self._sandbox.toolbox.clone(
            url, self._settings.repo_ref or None, dest, os.environ.get("GIT_USERNAME"), os.environ.get("GIT_TOKEN")
        )
        self._notice(f"Cloned {dest}/ into the working directory.\n")

    def output_outside_a_cell(self, msg_type: str, content: dict[str, Any]) -> None:
        """Logged as a bounded prefix: a sandbox must not be able to flood the kernel's log."""
        text = repr(content)
        more = f" … ({len(text) - OUTSIDE_A_CELL_LOG_CHARS} more characters)" if len(text) > OUTSIDE_A_CELL_LOG_CHARS else ""
        self._log.warning("output outside a cell: %s %s%s", msg_type, text[:OUTSIDE_A_CELL_LOG_CHARS], more)
