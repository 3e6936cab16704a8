"""Notebooks run headless through papermill, as users run them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import papermill

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _notebook(path: Path, cells: list[str], tags: dict[int, list[str]] | None = None) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "daytona-local", "display_name": "Python (Daytona local)", "language": "python"}
    for index, cell_tags in (tags or {}).items():
        nb.cells[index].metadata["tags"] = cell_tags
    nbformat.write(nb, path)
    return path


def _summary(nb: nbformat.NotebookNode) -> list[list[tuple]]:
    """What must agree between kernels: output types, stream text, MIME types, error names."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        for out in cell.outputs:
            if out.output_type == "stream":
                outs.append(("stream", out.name, out.text))
            elif out.output_type == "error":
                outs.append(("error", out.ename))
            else:
                outs.append((out.output_type, tuple(sorted(out.data))))
        cells.append(_merge_streams(outs))
    return cells


def _merge_streams(outs: list[tuple]) -> list[tuple]:
    merged: list[tuple] = []
    for out in outs:
        if merged and out[0] == "stream" and merged[-1][0] == "stream" and merged[-1][1] == out[1]:
            merged[-1] = ("stream", out[1], merged[-1][2] + out[2])
        else:
            merged.append(out)
    return merged


def test_quickstart_runs_with_every_kind_of_output(workdir: Path) -> None:
    out = papermill.execute_notebook(str(EXAMPLES / "quickstart.ipynb"), str(workdir / "out.ipynb"), kernel_name="daytona-local")
    summary = _summary(out)
    flat = [o for cell in summary for o in cell]
    assert ("stream", "stdout", "".join(f"step {i}\n" for i in range(5))) in flat
    assert ("display_data", ("image/png", "text/plain")) in flat
    assert ("execute_result", ("text/html", "text/plain")) in flat
    assert ("display_data", ("text/markdown", "text/plain")) in flat
    assert ("stream", "stdout", "handled: division by zero\n") in flat
    assert not [o for o in flat if o[0] == "error"]


def test_same_outputs_as_stock_ipykernel(workdir: Path) -> None:
    src = EXAMPLES / "quickstart.ipynb"
    ours = papermill.execute_notebook(str(src), str(workdir / "ours.ipynb"), kernel_name="daytona-local")
    stock = papermill.execute_notebook(str(src), str(workdir / "stock.ipynb"), kernel_name="python3")
    summary_ours, summary_stock = _summary(ours), _summary(stock)
    # The first cell prints the host name, which differs; everything else must match.
    summary_ours[0] = summary_stock[0] = []
    assert summary_ours == summary_stock


def test_same_errors_and_results_as_stock_ipykernel(workdir: Path) -> None:
    cells = [
        "x = 41\nx + 1",
        "print('a'); print('b', end='')\nimport sys; sys.stderr.write('e\\n')",
        "x;",
        "{'k': list(range(3))}",
        "undefined_name",
        "def f():\n    raise KeyError('k')\nf()",
        "from IPython.display import JSON, Image, SVG, display\ndisplay(JSON({'a': 1}))\n"
        'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"></svg>\'))',
        "import pandas as pd\npd.Series([1, 2])",
        "None",
    ]
    nb = _notebook(workdir / "nb.ipynb", cells)
    results = {}
    for kernel in ("daytona-local", "python3"):
        out = _run_allowing_errors(nb, workdir / f"{kernel}.ipynb", kernel)
        results[kernel] = _summary(out)
    assert results["daytona-local"] == results["python3"]


def _run_allowing_errors(nb_path: Path, out_path: Path, kernel: str) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    nb = nbformat.read(nb_path, as_version=4)
    NotebookClient(nb, kernel_name=kernel, allow_errors=True, timeout=120).execute()
    nbformat.write(nb, out_path)
    return nb


def test_parameters_are_injected(workdir: Path) -> None:
    nb = _notebook(workdir / "params.ipynb", ["alpha = 1\nlabel = 'default'", "print(label * alpha)"], tags={0: ["parameters"]})
    out = papermill.execute_notebook(
        str(nb), str(workdir / "out.ipynb"), kernel_name="daytona-local", parameters={"alpha": 3, "label": "ab"}
    )
    assert _summary(out)[-1] == [("stream", "stdout", "ababab\n")]


def test_failing_notebook_marks_the_right_cell_and_exits_nonzero(workdir: Path) -> None:
    nb = _notebook(workdir / "fail.ipynb", ["a = 1", "b = a / 0", "print('never')"])
    out_path = workdir / "out.ipynb"
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", str(nb), str(out_path), "-k", "daytona-local"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "ZeroDivisionError" in proc.stderr
    out = nbformat.read(out_path, as_version=4)
    code_cells = [c for c in out.cells if c.cell_type == "code"]
    failed = [c for c in code_cells if any(o.output_type == "error" for o in c.outputs)]
    assert [c.source for c in failed] == ["b = a / 0"]
    assert len(failed[0].outputs) == 1
    traceback = "\n".join(failed[0].outputs[0].traceback)
    assert "Cell In[2], line 1" in re.sub(r"\x1b\[[0-9;]*m", "", traceback)
    assert code_cells[-1].outputs == []


STREAM_CELLS = [
    "print('one')\nprint('two')",
    "%%time\nsum(range(10))",
    "import sys\nprint('a')\nprint('b', file=sys.stderr)\nprint('c')",
    "for i in range(5):\n    print(i)",
    "print('a', end='')\nprint('b')",
    "from IPython.display import display\nprint('before')\ndisplay('shown')\nprint('after')",
    "import time\nprint('x')\ntime.sleep(0.6)\nprint('y')",
]


PAUSE = "import time\ntime.sleep(0.3)"


def _outputs_as_saved(nb: nbformat.NotebookNode) -> list[list[tuple]]:
    """Each code cell's outputs as the notebook file keeps them, one per stream message (not merged);
    %%time's durations masked."""
    duration = re.compile(r"\d[^,\n]*")  # a number and its unit
    return [
        [("stream", o.name, duration.sub("T", o.text)) if o.output_type == "stream" else (o.output_type,) for o in cell.outputs]
        for cell in nb.cells
        if cell.cell_type == "code"
    ]


def test_streams_are_shaped_as_under_ipykernel(kernel_name: str, workdir: Path) -> None:
    """Issue 36: prints in a row, %%time, stdout beside stderr are one stream output each, as ipykernel's
    OutStream coalesces them (saved notebooks and their diffs then match ipykernel's)."""
    # Each cell after a pause (the first one also lets the sandbox's start show there): ipykernel's flush timer,
    # set by a cell's first write, is not cancelled by the flush at the cell's end, and splits the next cell's
    # output wherever it fires if that cell starts within its flush interval.
    cells = [c for cell in STREAM_CELLS for c in (PAUSE, cell)]
    nb = _notebook(workdir / "streams.ipynb", cells)
    stock = papermill.execute_notebook(str(nb), str(workdir / "stock.ipynb"), kernel_name="python3")
    ours = papermill.execute_notebook(str(nb), str(workdir / "ours.ipynb"), kernel_name=kernel_name)
    want, got = _outputs_as_saved(stock)[1::2], _outputs_as_saved(ours)[1::2]
    assert want[0] == [("stream", "stdout", "one\ntwo\n")]  # the reference coalesces as the test expects
    for source, mine, theirs in zip(STREAM_CELLS, got, want):
        assert mine == theirs, f"cell {source!r}"
