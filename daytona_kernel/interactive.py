"""What the kernel answers about a cell without the sandbox.

``is_complete`` with IPython's own TransformerManager (JupyterLab's console waits
only 250 ms for it), and the cells of kernel-side magics. Cells go to the sandbox
as they are: IPython there transforms them, as ipykernel's shell does.
"""

from __future__ import annotations

from typing import Any

from IPython.core.inputtransformer2 import TransformerManager

from .runtime.framing import KERNEL_MAGICS

_transformer = TransformerManager()


def check_complete(code: str) -> dict[str, Any]:
    """An ``is_complete_reply``: answered locally, never through the sandbox."""
    status, indent = _transformer.check_complete(code)
    reply: dict[str, Any] = {"status": status}
    if status == "incomplete":
        reply["indent"] = " " * (indent or 0)
    return reply


def kernel_magic_lines(code: str) -> list[tuple[str, str]] | None:
    """``[(name, args), ...]`` when every line of the cell is a kernel-side magic (%sync ...), else None.

    These magics act on the user's own files or on the kernel, so they run here, not in the sandbox.
    """
    lines = [line.strip() for line in code.strip().splitlines() if line.strip()]
    found = []
    for line in lines:
        name, _, args = line[1:].partition(" ") if line.startswith("%") and not line.startswith("%%") else ("", "", "")
        if name not in KERNEL_MAGICS:
            return None
        found.append((name, args.strip()))
    return found or None


CELL_MAGIC = "%%daytona"


def daytona_cell(code: str) -> tuple[str, str] | None:
    """``(arguments, body)`` when the cell begins with the kernel's cell magic (``%%daytona map 4 ...``),
    else None. Like any cell magic, it must be the cell's first line."""
    first, _, body = code.lstrip("\n").partition("\n")
    name, _, args = first.strip().partition(" ")
    if name != CELL_MAGIC:
        return None
    return args.strip(), body
