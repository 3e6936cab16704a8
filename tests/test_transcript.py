"""The transcript notebook (daytona_kernel.transcript): appended to, never truncated, refused when unreadable."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from daytona_kernel.agent import AsyncAgentKernel
from daytona_kernel.transcript import Transcript, TranscriptError


def test_an_existing_notebook_is_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "agent.ipynb"
    mine = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# my notes")])
    nbformat.write(mine, path)
    transcript = Transcript(path, "daytona", "Python (Daytona)")
    transcript.append("print(1)", [{"output_type": "stream", "name": "stdout", "text": "1\n"}], 1)
    transcript.append(
        "1 / 0", [{"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": []}], 2
    )
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert [c.source for c in nb.cells] == ["# my notes", "print(1)", "1 / 0"]
    assert [c.get("execution_count") for c in nb.cells[1:]] == [1, 2]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left beside it


def test_a_new_transcript_names_its_kernel(tmp_path: Path) -> None:
    transcript = Transcript(tmp_path / "new.ipynb", "daytona-local", "daytona-local")
    transcript.append("x = 1", [], 1)
    nb = nbformat.read(tmp_path / "new.ipynb", as_version=4)
    assert nb.metadata.kernelspec.name == "daytona-local"


@pytest.mark.parametrize("content", ["not json", '{"cells": "nope"}'])
def test_a_file_that_is_not_a_notebook_is_refused_and_left_as_it_is(tmp_path: Path, content: str) -> None:
    path = tmp_path / "notes.ipynb"
    path.write_text(content)
    with pytest.raises(TranscriptError, match="left as it is"):
        AsyncAgentKernel("daytona-local", tmp_path, notebook=path)
    assert path.read_text() == content
