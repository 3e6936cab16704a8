"""IPython syntax, handled in the kernel process with IPython's own machinery.

IPython does not need to be installed in the sandbox: cells are checked and
transformed here, then run there through runtime helpers.
"""

from __future__ import annotations

from typing import Any

from IPython.core.inputtransformer2 import TransformerManager

_transformer = TransformerManager()


def check_complete(code: str) -> dict[str, Any]:
    """An ``is_complete_reply``: answered locally, never through the sandbox."""
    status, indent = _transformer.check_complete(code)
    reply: dict[str, Any] = {"status": status}
    if status == "incomplete":
        reply["indent"] = " " * (indent or 0)
    return reply


def transform_cell(code: str) -> str:
    """IPython syntax (``!cmd``, ``%magic``, ``obj?``) to plain Python calling ``get_ipython()``."""
    return _transformer.transform_cell(code)
