"""``%%daytona map`` in-process: the magic's arguments, how workers' output is shown, the combined
error, and the sandbox side of scatter and gather (run here on a stand-in runtime)."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path
from typing import Any

import pytest

from daytona_kernel.cell import Recorder
from daytona_kernel.engine_output import CellLines, EngineOutput
from daytona_kernel.engines import EngineRun, MapSpec, combined_error, parse_map
from daytona_kernel.errors import UsageError
from daytona_kernel.interactive import daytona_cell, kernel_magic_lines
from daytona_kernel.runtime import MODULES, call_source
from daytona_kernel.runtime import fanout as sandbox_side
from daytona_kernel.runtime.calls import Prelude


def test_map_arguments() -> None:
    assert parse_map("map 4") == MapSpec(4)
    assert parse_map("map 3 --scatter xs,ys --gather total --gather best") == MapSpec(3, ("xs", "ys"), ("total", "best"))
    assert parse_map("map 2 --gather=a,a") == MapSpec(2, (), ("a",))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ("map", "the following arguments are required: engines"),
        ("map four", "invalid int value"),
        ("map 0", "N must be 1 or more"),
        ("map 2 --gather 1x", "1x is not a variable name"),
        ("map 2 --scatter class", "class is not a variable name"),
        ("map 2 --frobnicate", "unrecognized arguments"),
        ("reduce 2", "invalid choice"),
    ],
)
def test_bad_map_arguments_are_a_usage_error_with_the_usage(args: str, says: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_map(args)
    assert says in str(caught.value) and "Usage: %%daytona map N" in str(caught.value)


def test_the_cell_magic_must_be_the_first_line_and_is_not_a_line_magic_cell() -> None:
    assert daytona_cell("%%daytona map 4\nprint(rank)\n") == ("map 4", "print(rank)\n")
    assert daytona_cell("\n%%daytona map 2 --gather x\nx = 1") == ("map 2 --gather x", "x = 1")
    assert daytona_cell("x = 1\n%%daytona map 2") is None
    assert daytona_cell("%%time\nx") is None
    assert kernel_magic_lines("%%daytona map 2\nx") is None
    assert kernel_magic_lines("%daytona map --close") == [("daytona", "map --close")]


def test_the_sandbox_side_is_shipped_with_the_runtime() -> None:
    assert "fanout" in MODULES
    code = call_source(Prelude(rank=1, world=4, path=""))
    assert '"method":"prelude"' in code and '"rank":1,"world":4' in code


def recorder() -> tuple[list[tuple[str, dict[str, Any]]], EngineOutput]:
    front = Recorder()
    return front.outputs, EngineOutput(2, CellLines(front))


def test_each_stream_line_is_prefixed_with_its_stream_and_rank_and_shown_at_once() -> None:
    shown, out = recorder()
    out.emit("stream", {"name": "stdout", "text": "one\ntwo\nthr"})
    out.emit("stream", {"name": "stdout", "text": "ee\n\nfour"})
    out.emit("stream", {"name": "stderr", "text": "oops\n"})
    out.emit("stream", {"name": "stdout", "text": "no newline"})
    out.flush()
    assert shown == [
        ("stream", {"name": "stdout", "text": "[stdout:2] one\n[stdout:2] two\n[stdout:2] thr"}),  # a partial line, live
        ("stream", {"name": "stdout", "text": "ee\n[stdout:2] \n[stdout:2] four"}),  # which goes on as one line
        ("stream", {"name": "stdout", "text": "\n"}),  # ended before anything else is shown
        ("stream", {"name": "stderr", "text": "[stderr:2] oops\n"}),
        ("stream", {"name": "stdout", "text": "[stdout:2] no newline"}),
        ("stream", {"name": "stdout", "text": "\n"}),  # the worker is done
    ]


def test_another_workers_text_starts_its_own_line() -> None:
    front = Recorder()
    lines = CellLines(front)
    zero, one = EngineOutput(0, lines), EngineOutput(1, lines)
    zero.emit("stream", {"name": "stdout", "text": "abc"})
    one.emit("stream", {"name": "stdout", "text": "xyz\n"})
    zero.emit("stream", {"name": "stdout", "text": "def\n"})
    assert front.text() == "[stdout:0] abc\n[stdout:1] xyz\n[stdout:0] def\n"
    one.flush()  # worker 1 has no line open: nothing to end
    assert front.text() == "[stdout:0] abc\n[stdout:1] xyz\n[stdout:0] def\n"


def rendered(text: str) -> list[str]:
    """What a terminal or JupyterLab shows: the text after a carriage return overwrites the line's start."""
    shown = []
    for line in text.split("\n"):
        screen = ""
        for part in line.split("\r"):
            screen = part + screen[len(part) :]
        shown.append(screen)
    return shown


def test_a_worker_cannot_pass_for_another_with_a_carriage_return_or_a_backspace() -> None:
    front = Recorder()
    lines = CellLines(front)
    EngineOutput(1, lines).emit("stream", {"name": "stdout", "text": "\r[stdout:0] fake\n"})
    EngineOutput(1, lines).emit("stream", {"name": "stdout", "text": "\b" * 11 + "[stdout:0] fake too\n"})
    EngineOutput(1, lines).emit("stream", {"name": "stderr", "text": " 10%\r 20%\r"})
    EngineOutput(1, lines).emit("stream", {"name": "stderr", "text": " 30%\n"})
    shown = rendered(front.text()) + rendered(front.text("stderr"))
    assert [line for line in shown if line] == [
        "[stdout:1] [stdout:0] fake",
        "[stdout:1] " + "\\x08" * 11 + "[stdout:0] fake too",
        "[stderr:1]  30%",
    ]  # a progress bar still works: each step overwrites the last, after the worker's own prefix


def test_a_worker_cannot_move_a_terminals_cursor_onto_another_workers_line() -> None:
    """jupyter console writes stream text to a terminal as it is: a cursor movement (up a line, to its
    start, erase) could rewrite another worker's line there. Colours (SGR, ``ESC[...m``) stay."""
    front = Recorder()
    lines = CellLines(front)
    EngineOutput(0, lines).emit("stream", {"name": "stdout", "text": "real\n"})
    EngineOutput(1, lines).emit("stream", {"name": "stdout", "text": "\x1b[1A\x1b[2K\x1b[G[stdout:0] fake \x1b[31mred\x1b[0m\n"})
    assert front.text() == "[stdout:0] real\n[stdout:1] \\x1b[1A\\x1b[2K\\x1b[G[stdout:0] fake \x1b[31mred\x1b[0m\n"


def test_rich_outputs_come_after_a_header_with_the_worker_in_their_metadata() -> None:
    shown, out = recorder()
    out.emit("stream", {"name": "stdout", "text": "before"})
    out.emit("display_data", {"data": {"image/png": "iVBO"}, "metadata": {"image/png": {"width": 3}}, "transient": {}})
    out.emit("execute_result", {"data": {"text/plain": "42"}, "metadata": {}, "execution_count": 7})
    assert shown[:2] == [
        ("stream", {"name": "stdout", "text": "[stdout:2] before"}),
        ("stream", {"name": "stdout", "text": "\n"}),
    ]
    assert shown[2] == ("stream", {"name": "stdout", "text": "[output:2]\n"})  # a partial line ends first
    assert shown[3][0] == "display_data" and shown[3][1]["metadata"] == {"image/png": {"width": 3}, "worker": 2}
    assert shown[4] == ("stream", {"name": "stdout", "text": "Out[2:7]:\n"})
    assert (
        shown[5][0] == "display_data" and shown[5][1]["data"] == {"text/plain": "42"} and shown[5][1]["metadata"]["worker"] == 2
    )


def test_a_worker_may_not_clear_the_cell_and_its_error_is_kept_for_the_combined_one() -> None:
    shown, out = recorder()
    out.emit("clear_output", {"wait": False})
    out.emit("error", {"ename": "ValueError", "evalue": "x", "traceback": []})
    assert shown == []


def test_the_combined_error_names_each_failed_worker_and_its_exception() -> None:
    failed = [
        EngineRun(1, {"ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": ["tb1"]}),
        EngineRun(3, {"ename": "KeyError", "evalue": "'k'\nmore", "traceback": ["tb3"]}),
    ]
    error = combined_error(failed, 4, interrupted=False)
    assert error["ename"] == "CompositeError"
    assert error["evalue"] == "2 of 4 engines failed: [1] ZeroDivisionError: division by zero; [3] KeyError: 'k'"
    assert error["traceback"][1:] == [
        "[1:execute] ZeroDivisionError: division by zero",
        "tb1",
        "[3:execute] KeyError: 'k'",
        "tb3",
    ]
    interrupted = combined_error(
        [EngineRun(0, {"ename": "KeyboardInterrupt", "evalue": "", "traceback": []})], 2, interrupted=True
    )
    assert interrupted["ename"] == "KeyboardInterrupt" and "keep their variables" in interrupted["evalue"]


@pytest.mark.parametrize(
    ("length", "world", "sizes"),
    [(10, 3, [4, 3, 3]), (2, 4, [1, 1, 0, 0]), (8, 4, [2, 2, 2, 2]), (0, 2, [0, 0])],
)
def test_scatter_chunks_are_contiguous_as_even_as_possible_in_rank_order(length: int, world: int, sizes: list[int]) -> None:
    spans = sandbox_side.bounds(length, world)
    assert [stop - start for start, stop in spans] == sizes
    assert [start for start, _ in spans] == [0] + [stop for _, stop in spans[:-1]]


class StandInRuntime:
    """What the sandbox side uses of the runtime: the namespace, a session and reply frames."""

    def __init__(self, **user_ns: Any) -> None:
        self.user_ns = dict(user_ns)
        self.workdir = "/"  # the tests give absolute paths
        self.replies: list[Any] = []

    def request_output(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def send(self, kind: str, payload: Any) -> None:
        self.replies.append(payload)


def test_scatter_then_prelude_gives_each_worker_its_chunk_rank_and_world(tmp_path: Path) -> None:
    main = StandInRuntime(xs=list(range(5)), word="abcde")
    paths = [str(tmp_path / "t" / f"{rank}.pkl") for rank in range(2)]
    sandbox_side.scatter(main, ["xs", "word"], paths)
    assert "error" not in main.replies[0]
    engines = [StandInRuntime(), StandInRuntime()]
    for rank, engine in enumerate(engines):
        sandbox_side.prelude(engine, rank, 2, paths[rank])
        assert not os.path.exists(paths[rank])  # read once, then removed
    assert [(w.user_ns["rank"], w.user_ns["world"], w.user_ns["xs"], w.user_ns["word"]) for w in engines] == [
        (0, 2, [0, 1, 2], "abc"),
        (1, 2, [3, 4], "de"),
    ]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (None, "there is no variable 'xs'"),
        ({"a": 1}, "'xs' cannot be split into chunks"),
        ([threading.Lock()], "could not pickle 'xs'"),
    ],
)
def test_a_scatter_that_cannot_be_done_says_which_variable_and_why(tmp_path: Path, value: Any, says: str) -> None:
    main = StandInRuntime() if value is None else StandInRuntime(xs=value)
    sandbox_side.scatter(main, ["xs"], [str(tmp_path / "0.pkl")])
    assert says in main.replies[0]["error"]


def test_gather_makes_lists_in_rank_order_and_removes_the_files(tmp_path: Path) -> None:
    paths = []
    for rank in range(3):
        engine = StandInRuntime(total=rank * 10, name=f"w{rank}")
        path = str(tmp_path / f"g{rank}.pkl")
        sandbox_side.dump(engine, ["total", "name"], path)
        assert "error" not in engine.replies[0]
        paths.append(path)
    main = StandInRuntime(other=1)
    sandbox_side.gather(main, ["total", "name"], paths)
    assert main.replies == [{"gathered": ["total", "name"]}]
    assert main.user_ns == {"other": 1, "total": [0, 10, 20], "name": ["w0", "w1", "w2"]}
    assert not any(os.path.exists(p) for p in paths)


def test_a_value_that_cannot_be_gathered_is_named(tmp_path: Path) -> None:
    engine = StandInRuntime(lock=threading.Lock())
    sandbox_side.dump(engine, ["lock"], str(tmp_path / "g.pkl"))
    assert engine.replies[0]["error"].startswith("--gather could not pickle 'lock': TypeError")
    sandbox_side.dump(engine, ["missing"], str(tmp_path / "g.pkl"))
    assert "the engine has no variable 'missing'" in engine.replies[1]["error"]


def test_the_envelope_is_plain_pickle_around_each_values_own_pickle(tmp_path: Path) -> None:
    engine = StandInRuntime(total=3)
    path = tmp_path / "g.pkl"
    sandbox_side.dump(engine, ["total"], str(path))
    assert pickle.loads(pickle.loads(path.read_bytes())["total"]) == 3


def pool_of(sandboxes: list[Any], **settings: Any) -> Any:
    import logging

    from daytona_kernel.config import SessionSettings
    from daytona_kernel.engines import EnginePool
    from daytona_kernel.outputs import OutputPolicy

    made = iter(sandboxes)
    return EnginePool(
        lambda serial: (next(made), None), SessionSettings(**settings), logging.getLogger("test"), OutputPolicy(True)
    )


async def test_the_pool_starts_what_the_quota_allows_says_so_in_one_line_and_deletes_the_refused() -> None:
    from fakes import FakeSandbox

    from daytona_kernel.errors import QuotaExceeded

    sandboxes = [FakeSandbox() for _ in range(4)]
    for refused in sandboxes[2:]:
        refused.start_errors = [
            QuotaExceeded("Total CPU limit exceeded. Maximum allowed: 3.\nTo increase concurrency limits ...")
        ]
    pool, front = pool_of(sandboxes), Recorder()
    await pool.resize(4, "a sandbox", front)
    assert [w.sandbox for w in pool.engines] == sandboxes[:2]
    lines = front.text("stderr").splitlines()
    assert front.statuses[0].startswith("starting 4 engines, each a sandbox: [0] starting")
    assert lines[0].startswith(f"daytona-kernel: started 2 engines; each is {sandboxes[0].size_text}.")  # as created
    assert lines[1:] == [
        "daytona-kernel: 2 of 4 engines started; the organisation's quota is used up: Total CPU limit exceeded. "
        "Maximum allowed: 3. The cell runs on 2 (world = 2)."
    ]
    assert [s.shut_down for s in sandboxes] == [False, False, True, True]  # nothing half-made is left


async def test_a_pool_that_cannot_start_any_worker_fails_with_the_reason() -> None:
    from fakes import FakeSandbox

    from daytona_kernel.errors import QuotaExceeded

    sandbox = FakeSandbox()
    sandbox.start_errors = [QuotaExceeded("Total CPU limit exceeded. Maximum allowed: 1.")]
    pool = pool_of([sandbox])
    with pytest.raises(QuotaExceeded, match="Total CPU limit exceeded"):
        await pool.resize(1, "a sandbox", Recorder())
    assert pool.engines == [] and sandbox.shut_down


async def test_a_smaller_n_deletes_the_highest_ranks_and_close_deletes_the_rest() -> None:
    from fakes import FakeSandbox

    sandboxes = [FakeSandbox() for _ in range(3)]
    pool, front = pool_of(sandboxes), Recorder()
    await pool.resize(3, "a sandbox", front)
    await pool.resize(1, "a sandbox", front)
    assert [w.sandbox for w in pool.engines] == sandboxes[:1] and [s.shut_down for s in sandboxes] == [False, True, True]
    assert await pool.close() == "closed 1 engine\n" and sandboxes[0].shut_down


async def test_n_over_fan_out_max_is_a_usage_error_that_names_the_setting() -> None:

    with pytest.raises(UsageError, match="at most fan_out_max=2 engines"):
        await pool_of([], fan_out_max=2).resize(3, "a sandbox", Recorder())


async def test_pickles_in_transit_are_read_with_a_cap_the_sandbox_cannot_lift(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker (or the main sandbox) decides how big its pickle is: the kernel takes at most
    PICKLE_MAX_BYTES of it, and the message names whose values and what to do."""
    from fakes import FakeSandbox

    from daytona_kernel import engines as fanout

    monkeypatch.setattr(fanout, "PICKLE_MAX_BYTES", 8)
    sandbox = FakeSandbox()
    sandbox.files[fanout.full_path(sandbox, "small")] = b"12345678"
    sandbox.files[fanout.full_path(sandbox, "big")] = b"123456789"
    assert await fanout.read_pickles(sandbox, ["small"], lambda i: "x") == [b"12345678"]
    with pytest.raises(UsageError, match="--gather: engine 3's values are more than 0 MB pickled.*Write them to a file"):
        await fanout.read_pickles(sandbox, ["small", "big"], lambda i: f"--gather: engine {i + 2}'s values")
    assert sandbox.download_limits[-1] == {fanout.full_path(sandbox, p): 8 for p in ("small", "big")}
