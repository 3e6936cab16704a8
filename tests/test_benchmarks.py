"""The benchmark page's machinery, without measuring anything: goals, verdicts, the page and its chart."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.run import BEGIN, END, Figure, Report, goal_line, judge, write_page


def one(value: float) -> dict[str, float]:
    return {"median": value, "min": value, "max": value, "n": 1}


def report(*figures: Figure) -> Report:
    r = Report("test-machine (2 cores)", "2026-11-26 15:50 UTC", quick=False, figures=list(figures))
    judge(r)
    return r


def test_every_goal_is_judged_against_its_baseline_measured_in_the_same_run() -> None:
    r = report(
        Figure("ratio", "ms", one(30), one(20), "b", "≤ 1.5×"),
        Figure("ratio missed", "ms", one(31), one(20), "b", "≤ 1.5×"),
        Figure("ratio plus", "ms", one(5), one(2.5), "b", "≤ 1.2× + 2 ms"),
        Figure("at least", "MB/s", one(10), one(30), "b", "≥ 0.5×"),
        Figure("plus baseline", "s", one(1.1), one(0.8), "b", "≤ baseline + 0.3 s"),
        Figure("absolute", "s", one(1.2), one(0.6), "b", "≤ 1 s"),
        Figure("absolute in ms", "ms", one(90), goal="≤ 100 ms, 0 requests"),
        Figure("flat", "MB", {"median": 50, "min": 46, "max": 54, "n": 2}, goal="within 20% of cell 100"),
        Figure("reference", "ms", one(3), one(1), "b"),
    )
    assert [f.verdict for f in r.figures] == ["met", "MISSED", "met", "MISSED", "met", "MISSED", "met", "met", ""]
    assert goal_line(r.figures[2]) == (2.0, True) and goal_line(r.figures[3]) == (0.5, False)
    assert goal_line(r.figures[5]) == pytest.approx((1 / 0.6, True))
    with pytest.raises(ValueError, match="no rule judges the goal"):
        report(Figure("typo", "ms", one(1), one(1), "b", "≤ 1.5 x"))


def test_the_page_keeps_its_prose_and_replaces_only_the_generated_table_and_chart(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\nHow to read it.\n\n{BEGIN}\nold table\n{END}\n\n## Where the time goes\n\nprofiles\n")
    write_page(report(Figure("2 MB PNG display", "ms", one(30), one(20), "ipykernel", "≤ 1.5×")), page, (3.1, 2.9))
    text = page.read_text()
    assert "old table" not in text and text.startswith("# Benchmarks\n\nHow to read it.") and text.endswith("profiles\n")
    assert "| 2 MB PNG display | 30.00 [30.00–30.00] ms | 20.00 ms (ipykernel) | 1.50× | ≤ 1.5× | met |" in text
    assert "test-machine (2 cores), 2026-11-26 15:50 UTC" in text and "other work loaded it" in text
    assert "![every ratio against its goal](benchmarks.png)" in text
    assert (tmp_path / "benchmarks.png").read_bytes().startswith(b"\x89PNG")
    stopped = report(Figure("first", "ms", one(1), one(1), "b"))
    stopped.stopped = "AttributeError: no on_this_disk"
    write_page(stopped, page, (0.1, 0.1))
    assert "**The run stopped before its last figure** (AttributeError: no on_this_disk)" in page.read_text()
    assert "other work loaded it" not in page.read_text()
    page.write_text("# no markers\n")
    with pytest.raises(ValueError, match="no .* block to replace"):
        write_page(report(), page, (0.1, 0.1))


def test_the_package_is_byte_compiled_first_as_an_installed_one_is(tmp_path: Path) -> None:
    """pip compiles a package when it installs it; an editable install on a machine that sets
    PYTHONDONTWRITEBYTECODE (this one) compiled the kernel's modules from source at every start instead."""
    from benchmarks.run import compile_package

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("X = 1\n")
    compile_package(tmp_path / "pkg")
    assert [p.name.split(".")[0] for p in (tmp_path / "pkg" / "__pycache__").iterdir()] == ["mod"]
