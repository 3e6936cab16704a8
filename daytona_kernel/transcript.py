"""The agent's transcript: every run appended to a notebook a person can open.

Each ``run`` becomes a code cell with its outputs and execution count. The notebook is read,
appended to and written whole to a temporary file beside it, then moved over it
(``os.replace``), so a reader never sees half a file and a crash never truncates it. A file
that is not a readable notebook is refused at the start: nothing is ever written over it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import nbformat

__all__ = ["Transcript", "TranscriptError"]

NBFORMAT_VERSION = 4


class TranscriptError(ValueError):
    """The transcript cannot be used (not a notebook, or not writable)."""


class Transcript:
    """An .ipynb file that grows by one cell per run."""

    def __init__(self, path: str | os.PathLike[str], kernel_name: str, display_name: str) -> None:
        self.path = Path(path).expanduser().resolve()
        self._kernelspec = {"name": kernel_name, "display_name": display_name, "language": "python"}
        if self.path.exists():
            self._read()  # refuse a file that is not a notebook now, before the agent's first run
        elif not self.path.parent.is_dir():
            raise TranscriptError(
                f"the transcript's folder {self.path.parent} does not exist; create it or give another --notebook path"
            )

    def _read(self) -> Any:
        try:
            return nbformat.read(self.path, as_version=NBFORMAT_VERSION)
        except Exception as exc:  # nbformat raises several kinds (JSON, validation, OS): each means "not usable"
            raise TranscriptError(
                f"{self.path} is not a notebook this transcript can append to ({type(exc).__name__}: {exc}); "
                "it was left as it is. Give another --notebook path."
            ) from exc

    def _new(self) -> Any:
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = dict(self._kernelspec)
        nb.metadata["language_info"] = {"name": "python"}
        return nb

    def append(self, code: str, outputs: list[dict[str, Any]], execution_count: int | None) -> int:
        """Add one cell; returns its index in the notebook."""
        nb = self._read() if self.path.exists() else self._new()
        cell = nbformat.v4.new_code_cell(source=code, execution_count=execution_count)
        cell.outputs = [nbformat.from_dict(output) for output in outputs]
        nb.cells.append(cell)
        self._write(nb)
        return len(nb.cells) - 1

    def _write(self, nb: Any) -> None:
        nbformat.validate(nb)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                nbformat.write(nb, f)
            if self.path.exists():
                os.chmod(tmp, self.path.stat().st_mode & 0o777)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
