"""The basic shell: the runtime's fallback when the sandbox's Python cannot run IPython (issue 15).

Plain Python with the last expression shown through the same ``result`` frame,
tracebacks from the ``traceback`` module, ``input()`` over the stdin path, basic
completion, and one notice that IPython features need a newer Python. The runtime
option ``{"ipython": False}`` picks it on any Python; these run a real local worker.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from daytona_kernel.backends.local.sandbox import LocalSandbox
from daytona_kernel.cell import Cell, Recorder
from daytona_kernel.config import DaytonaKernelConfig, LocalSettings, SessionSettings, settings_from
from daytona_kernel.runtime.calls import Complete, RuntimeOptions, Synced
from daytona_kernel.session import SandboxSession

pytestmark = pytest.mark.slow  # a local worker process

LOG = logging.getLogger("test-basic-shell")


class BasicShellMirror:
    """No mirror, only the runtime option that asks for the basic shell."""

    notice = ""
    syncs_down = False

    def runtime_options(self) -> RuntimeOptions:
        return RuntimeOptions(ipython=False)

    def handover(self) -> Synced:
        return Synced()

    async def push(self, progress: Any = None) -> Any:
        from daytona_kernel.mirror.plan import SyncReport

        return SyncReport()

    async def pull(self, changes: dict[str, Any]) -> Any:
        from daytona_kernel.mirror.plan import SyncReport

        return SyncReport()


def run_cells(tmp_path: Path, cells: list[str], answers: list[str] | None = None) -> tuple[list[tuple[Any, Recorder]], Any]:
    """Each cell's outcome and frontend, and a completion of ``pri`` after the cells."""

    async def go() -> tuple[list[tuple[Any, Recorder]], Any]:
        config = DaytonaKernelConfig(backend="local", sandbox_policy="ephemeral")
        sandbox = LocalSandbox(settings_from(LocalSettings, config), "basic-" + tmp_path.name)
        session = SandboxSession(sandbox, SessionSettings(), LOG, BasicShellMirror())  # type: ignore[arg-type]
        results = []
        try:
            for count, code in enumerate(cells, 1):
                front = Recorder(answers)
                outcome = await session.execute(Cell(code, count, allow_stdin=answers is not None), front)
                results.append((outcome, front))
            return results, await session.query(Complete(code="pri", cursor=3))
        finally:
            await session.shutdown()

    return asyncio.run(go())


def results_of(front: Recorder) -> list[str]:
    return [content["data"]["text/plain"] for content in front.of_type("execute_result")]


def test_plain_python_with_the_last_expression_and_one_notice(tmp_path: Path) -> None:
    results, completion = run_cells(tmp_path, ["x = 6 * 7\nprint('hi')\nx", "x;", "[1, 2]"])
    (first, front), (second, front2), (_, front3) = results
    assert first.error is None
    notice = front.text("stderr")
    assert notice.count("\n") == 1 and "cells run as plain Python" in notice and "Python 3.11+" in notice
    assert front.text() == "hi\n" and results_of(front) == ["42"]
    assert second.error is None and front2.outputs == []  # a trailing semicolon hides the result; no second notice
    assert results_of(front3) == ["[1, 2]"]
    assert completion is not None and "print(" in completion["matches"]


def test_tracebacks_come_from_the_traceback_module_and_ipython_syntax_says_what_it_needs(tmp_path: Path) -> None:
    results, _ = run_cells(tmp_path, ["def f():\n    return 1 / 0\nf()", "import sys\nsys.last_type.__name__", "%who_ls"])
    (failed, _), (_, last), (magic, magic_front) = results
    assert failed.error is not None and failed.error["ename"] == "ZeroDivisionError"
    text = "\n".join(failed.error["traceback"])
    assert text.startswith("Traceback (most recent call last):") and "return 1 / 0" in text and "runtime" not in text
    assert magic.error is not None and magic.error["ename"] == "UsageError"
    assert "needs IPython" in magic.error["evalue"]
    assert magic_front.outputs == [("stream", {"name": "stderr", "text": f"UsageError: {magic.error['evalue']}\n"})]  # as IPython
    assert results_of(last) == ["'ZeroDivisionError'"]  # sys.last_*: pdb.pm() works


def test_input_goes_over_the_stdin_path(tmp_path: Path) -> None:
    [(outcome, front)], _ = run_cells(tmp_path, ["name = input('who? ')\nprint('hello', name)"], answers=["ada"])
    assert outcome.error is None
    assert front.prompts == [("who? ", False)] and front.text() == "hello ada\n"


def test_widgets_without_ipython_show_their_text_with_one_notice(tmp_path: Path) -> None:
    cells = [
        "import ipywidgets as w\nw.IntSlider(value=3)",
        "import ipywidgets",
        "from tqdm.notebook import tqdm\nfor i in tqdm(range(3)):\n    pass",
    ]
    results, _ = run_cells(tmp_path, cells)
    (first, front), (_, front2), (third, front3) = results
    assert first.error is None and third.error is None
    assert front.text("stderr").count("interactive widgets need IPython in the sandbox") == 1
    assert [list(c["data"]) for c in front.of_type("execute_result")] == [["text/plain"]]  # the widget's text, no view
    assert "widgets" not in front2.text("stderr")  # once per runtime
    assert "3/3" in front3.text("stderr") and not front3.of_type("display_data")  # tqdm's text bar
