"""Kernel-side magics in-process: usage errors, reasons for failures, replies from a hostile runtime."""

from __future__ import annotations

import logging

from fakes import FakeSandbox, Run, frame

from daytona_kernel.backends.base import RunError
from daytona_kernel.cell import Recorder
from daytona_kernel.config import SessionSettings
from daytona_kernel.interactive import kernel_magic_lines
from daytona_kernel.session import SandboxSession

LOG = logging.getLogger("test-magics")


async def run_magic(sandbox: FakeSandbox, line: str) -> tuple[dict | None, Recorder]:
    session = SandboxSession(sandbox, SessionSettings(backend="local"), LOG)
    front = Recorder()
    lines = kernel_magic_lines(line)
    assert lines is not None
    return await session.kernel_magics(lines, front), front


async def test_a_wrong_daytona_subcommand_is_a_usage_error_that_shows_the_usage() -> None:
    error, front = await run_magic(FakeSandbox(), "%daytona frobnicate")
    assert error is not None and error["ename"] == "UsageError"
    assert "%daytona status | %daytona checkpoint | %daytona restore" in error["evalue"]
    assert front.of_type("error") == [] and front.text("stderr") == f"UsageError: {error['evalue']}\n"  # as ipykernel


async def test_upload_without_a_mirror_says_why() -> None:
    error, _ = await run_magic(FakeSandbox(), "%upload data.csv")
    assert error is not None and "mirror is not available" in error["evalue"]


async def test_status_names_the_backend_and_the_interpreter() -> None:
    error, front = await run_magic(FakeSandbox(), "%daytona status")
    assert error is None
    # the first cell may be %daytona status: it waits for the sandbox and shows it, not "not started"
    assert "backend:" in front.text() and "local" in front.text() and "interpreter: Python 3.12.1, pid 4242" in front.text()


async def test_checkpoint_reports_what_it_saved_and_skipped() -> None:
    reply = {"saved": ["a", "b"], "skipped": ["lock (TypeError)"], "pickler": "cloudpickle", "bytes": 123}
    error, front = await run_magic(FakeSandbox([Run([frame("reply", reply)])]), "%daytona checkpoint")
    assert error is None
    assert "saved 2 variable(s) with cloudpickle (123 bytes)" in front.text()
    assert "not picklable, skipped: lock (TypeError)" in front.text()


async def test_a_failed_restore_shows_its_reason_not_the_kernel_log() -> None:
    missing = RunError("FileNotFoundError", "[Errno 2] No such file: checkpoint.pkl", "")
    error, _ = await run_magic(FakeSandbox([Run(error=missing)]), "%daytona restore")
    assert error is not None
    assert "FileNotFoundError" in error["evalue"] and "No such file" in error["evalue"]
    assert "kernel log" not in error["evalue"] and "%daytona checkpoint" in error["evalue"]


async def test_a_malformed_checkpoint_reply_is_an_error_not_a_crash() -> None:
    reply = {"saved": "everything", "skipped": [], "pickler": "pickle", "bytes": 1}
    error, _ = await run_magic(FakeSandbox([Run([frame("reply", reply)])]), "%daytona checkpoint")
    assert error is not None and "malformed 'saved'" in error["evalue"]


async def test_a_runtime_that_does_not_answer_is_an_error_with_the_reason() -> None:
    error, _ = await run_magic(FakeSandbox([Run(["no reply\n"])]), "%daytona checkpoint")
    assert error is not None and "did not answer" in error["evalue"]


def test_only_cells_made_of_kernel_magics_run_in_the_kernel() -> None:
    assert kernel_magic_lines("%sync\n%upload a b") == [("sync", ""), ("upload", "a b")]
    assert kernel_magic_lines("x = 1\n%sync") is None
    assert kernel_magic_lines("%%sync") is None
