"""IPython syntax, handled in the kernel process with IPython's own machinery.

IPython does not need to be installed in the sandbox: cells are checked and
transformed here, then run there through runtime helpers.
"""

from __future__ import annotations

import tokenize
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


def transform_cell(code: str) -> str:
    """IPython syntax (``!cmd``, ``%magic``, ``obj?``) to plain Python calling ``get_ipython()``.

    Code that does not even tokenize is passed on as it is, so the sandbox reports
    the SyntaxError with the user's own lines, as for any other error.
    """
    try:
        return _transformer.transform_cell(code)
    except (SyntaxError, tokenize.TokenError, ValueError):
        return code


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
