"""``jupyter console`` in a pseudo-terminal, as a user types into it (pexpect), on both backends."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pexpect
import pytest
from kernels import Kernel, result_text

PROMPT = r"In \[\d+\]: "
TIMEOUT_S = 60
# jupyter_console shows its first prompt once the kernel answers kernel_info on the shell channel; its
# iopub subscription can reach the kernel up to one ZMQ reconnect interval (100 ms) later. A cell typed
# inside that window, as pexpect types it, loses its status messages and the console waits forever
# for "idle" (seen in CI with bare `exit`). A person never types that fast; the tests wait it out.
IOPUB_SETTLE_S = 0.5


def console(kernel_name: str, folder: Path) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "jupyter_console", "--kernel", kernel_name, "--simple-prompt"],
        cwd=str(folder),
        env=dict(os.environ),
        encoding="utf-8",
        timeout=TIMEOUT_S,
        dimensions=(40, 200),
    )
    child.expect(PROMPT)
    time.sleep(IOPUB_SETTLE_S)
    return child


def close(child: pexpect.spawn) -> None:
    """Leave as a user does, so the kernel shuts down and cleans up after itself."""
    if child.isalive():
        child.sendline("exit")
        child.expect(pexpect.EOF)
    child.close()


def test_ctrl_c_at_an_input_prompt_is_a_plain_keyboard_interrupt(kernel_name: str, tmp_path: Path) -> None:
    child = console(kernel_name, tmp_path)
    try:
        child.sendline("x = input('name? ')")
        child.expect_exact("input('name? ')")  # the echo of the line typed
        child.expect_exact("name? ")  # the prompt itself
        child.sendintr()
        child.expect(PROMPT)
        shown = child.before
        assert "KeyboardInterrupt" in shown
        assert "FileNotFoundError" not in shown and "During handling" not in shown, shown
        child.sendline("print('still', 'here')")
        child.expect_exact("still here")
        child.expect(PROMPT)
    finally:
        close(child)


@pytest.mark.parametrize("word", ["exit", "quit"])
def test_bare_exit_closes_the_console(kernel_name: str, tmp_path: Path, word: str) -> None:
    child = console(kernel_name, tmp_path)
    try:
        child.sendline(word)
        child.expect(pexpect.EOF)
        assert "Use exit() to" not in child.before
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_a_variable_named_exit_is_just_a_variable(kernel_name: str, tmp_path: Path) -> None:
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        assert k.execute("exit = 5").errors[0]["ename"] == "SyntaxError"  # as in ipykernel: autocall makes it exit(= 5)
        k.execute("exit = 5\npass")
        run = k.execute("exit")
        assert run.status == "ok" and result_text(run) == "5"
        assert not [m for m in run.messages if m["content"].get("payload")]


def test_the_first_cell_prints_no_frozen_modules_warning(tmp_path: Path) -> None:
    """The kernelspec passes -Xfrozen_modules=off, as ipykernel's does (else debugpy warns on the first cell)."""
    child = console("daytona-local", tmp_path)
    try:
        child.sendline("6 * 7")
        child.expect(PROMPT)
        assert "42" in child.before
        assert "frozen modules" not in child.before.lower()
    finally:
        close(child)
