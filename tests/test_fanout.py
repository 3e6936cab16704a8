"""``%%daytona map N`` through real kernels, on both backends: the contract of issue 26 item by item
(workers of their own with the project's files, rank and world, state kept between cells, the pool
resized and closed, ipyparallel's output, scatter and gather, one combined error, interrupt, a worker
that dies, fan_out_max) and the cleanup after a shutdown and after a SIGKILLed kernel."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from kernels import Kernel, Run, result_text

BACKENDS = ["daytona-local", "daytona"]


def project(root: Path) -> Path:
    """A project shaped like a user's: a git repository with notebooks/ (and helpers.py) beside data/."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "numbers.txt").write_text("41\n")
    (root / "notebooks").mkdir()
    (root / "notebooks" / "helpers.py").write_text("def double(x):\n    return 2 * x\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root / "notebooks"


@pytest.fixture(scope="module", params=BACKENDS)
def kernel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """One kernel per backend for the module: the Daytona one against an emulator of its own."""
    env: dict[str, str] = {}
    emulator = None
    if request.param == "daytona":
        from conftest import INSTANT_TRANSITIONS
        from daytona_emulator import DaytonaEmulator

        emulator = DaytonaEmulator(tmp_path_factory.mktemp("emulator")).start()
        emulator.transition_s.update(dict.fromkeys(INSTANT_TRANSITIONS, 0.0))
        env = emulator.env()
    notebooks = project(tmp_path_factory.mktemp("project"))
    with Kernel(request.param, env=env, cwd=str(notebooks)) as k:
        k.emulator = emulator  # type: ignore[attr-defined]
        k.execute("import os")
        yield k
    if emulator is not None:
        emulator.close()


LINE = re.compile(r"\[(stdout|stderr):(\d+)\] (.*)")


def shown(run: Run, stream: str = "stdout") -> str:
    """A stream's text as a notebook keeps it: a clear_output (the status line going) drops what came before."""
    kept: list[str] = []
    for m in run.outputs:
        if m["msg_type"] == "clear_output":
            kept = []
        elif m["msg_type"] == "stream" and m["content"]["name"] == stream:
            kept.append(m["content"]["text"])
    return "".join(kept)


def lines(run: Run, stream: str = "stdout") -> dict[int, list[str]]:
    """Each worker's lines of one stream, by rank, checking every line has its prefix."""
    by_rank: dict[int, list[str]] = {}
    for line in shown(run, stream).splitlines():
        match = LINE.fullmatch(line)
        if match is None:
            continue
        assert match.group(1) == stream
        by_rank.setdefault(int(match.group(2)), []).append(match.group(3))
    return by_rank


def ok(run: Run) -> Run:
    assert run.status == "ok", run.errors
    return run


def usage_error(run: Run, says: str) -> bool:
    """As ipykernel shows a UsageError: one line on stderr, no error output, and a reply that says error."""
    content = run.reply["content"]
    line = [x for x in shown(run, "stderr").splitlines() if x.startswith("UsageError: ")]
    return (
        run.status == "error"
        and content["ename"] == "UsageError"
        and says in content["evalue"]
        and not run.errors
        and len(line) == 1
        and says in line[0]
    )


def pids(kernel: Kernel, n: int) -> dict[int, int]:
    run = ok(kernel.execute(f"%%daytona map {n}\nimport os\nprint(os.getpid())"))
    return {rank: int(out[0]) for rank, out in lines(run).items()}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(check: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_each_worker_is_a_sandbox_of_its_own_with_rank_world_and_the_projects_files(kernel: Kernel) -> None:
    ok(kernel.execute("%daytona map --close"))
    main_pid = int(result_text(kernel.execute("os.getpid()")))
    code = "%%daytona map 3\nimport os\nfrom helpers import double\nprint(rank, world, os.getpid(), open('../data/numbers.txt').read().strip(), double(rank))"
    run = ok(kernel.execute(code))
    assert "started 3 engines; each is " in shown(run, "stderr")  # said once they run
    assert any(s.startswith("⏳ starting 3 engines, each ") for s in run.status_lines)  # and while they start
    seen = {rank: out[0].split() for rank, out in lines(run).items()}
    assert sorted(seen) == [0, 1, 2]
    assert all(words[:2] == [str(rank), "3"] and words[3:] == ["41", str(2 * rank)] for rank, words in seen.items())
    worker_pids = {int(words[2]) for words in seen.values()}
    assert len(worker_pids) == 3 and main_pid not in worker_pids
    again = ok(kernel.execute(code))  # the pool is there: the status line says what runs until the first output
    assert any("[0] running" in s and "[2] running" in s for s in again.status_lines)
    kinds = [m["msg_type"] for m in again.outputs]
    first_output = min(i for i, kind in enumerate(kinds) if kind == "stream")
    assert kinds[first_output - 1] == "clear_output" and kinds.count("clear_output") == 1  # the line goes, nothing else


def test_workers_keep_their_state_and_the_main_namespace_is_untouched(kernel: Kernel) -> None:
    before = pids(kernel, 3)
    ok(kernel.execute("%%daytona map 3\nsecret = rank * 7"))
    run = ok(kernel.execute("%%daytona map 3\nprint(secret)"))
    assert lines(run) == {0: ["0"], 1: ["7"], 2: ["14"]}
    assert pids(kernel, 3) == before
    assert result_text(kernel.execute("[name in dir() for name in ('secret', 'rank', 'world')]")) == "[False, False, False]"


def test_another_n_grows_or_shrinks_the_pool_and_close_ends_it(kernel: Kernel) -> None:
    three = pids(kernel, 3)
    two = pids(kernel, 2)
    assert two == {0: three[0], 1: three[1]}
    assert wait_until(lambda: not alive(three[2]))
    run = ok(kernel.execute("%%daytona map 4\nprint(world)"))
    assert "started 2 engines more (the pool had 2)" in shown(run, "stderr")
    assert lines(run) == {rank: ["4"] for rank in range(4)}
    four = pids(kernel, 4)
    assert "map engines:" in kernel.execute("%daytona status").text() and "4 (0: " in kernel.execute("%daytona status").text()
    closed = ok(kernel.execute("%daytona map --close"))
    assert closed.text() == "closed 4 engines\n"
    assert wait_until(lambda: not any(alive(pid) for pid in four.values()))
    assert "none (`%%daytona map N` starts them)" in kernel.execute("%daytona status").text()


def test_stream_lines_are_prefixed_and_rich_outputs_carry_their_worker(kernel: Kernel) -> None:
    code = (
        "%%daytona map 2\nimport sys\nfrom IPython.display import HTML, display\n"
        "print('out', rank)\nprint('err', rank, file=sys.stderr)\ndisplay(HTML(f'<b>{rank}</b>'))\nrank + 40"
    )
    run = ok(kernel.execute(code))
    count = run.reply["content"]["execution_count"]
    assert lines(run) == {0: ["out 0"], 1: ["out 1"]}
    assert {"[output:0]", "[output:1]", f"Out[0:{count}]:", f"Out[1:{count}]:"} <= set(shown(run).splitlines())
    assert lines(run, "stderr") == {0: ["err 0"], 1: ["err 1"]}
    rich = [c for c in run.of_type("display_data") if "worker" in c["metadata"]]
    assert sorted((c["metadata"]["worker"], c["data"].get("text/html")) for c in rich if "text/html" in c["data"]) == [
        (0, "<b>0</b>"),
        (1, "<b>1</b>"),
    ]
    assert sorted(c["data"]["text/plain"] for c in rich if "text/html" not in c["data"]) == ["40", "41"]
    assert run.of_type("execute_result") == []  # the cell has no result of its own


def test_a_large_output_of_each_worker_arrives_whole_and_prefixed(kernel: Kernel) -> None:
    run = ok(kernel.execute("%%daytona map 2\nprint(str(rank) * 100_000)"))  # past the local backend's blob size
    assert lines(run) == {0: ["0" * 100_000], 1: ["1" * 100_000]}


def test_scatter_splits_in_rank_order_and_gather_collects_in_rank_order(kernel: Kernel) -> None:
    ok(kernel.execute("xs = list(range(10))\nlabel = 'abcde'"))
    ok(kernel.execute("%%daytona map 3 --scatter xs,label --gather part,n\npart = xs\nn = len(xs) + len(label)"))
    printed = ok(kernel.execute("print(part, n, xs, label)")).text()
    assert printed == "[[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]] [6, 5, 4] [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] abcde\n"


def test_what_cannot_be_scattered_or_gathered_is_named(kernel: Kernel) -> None:
    run = kernel.execute("%%daytona map 2 --gather lock\nimport threading\nlock = threading.Lock()")
    assert run.status == "error" and len(run.errors) == 1
    assert "could not pickle 'lock'" in run.errors[0]["evalue"] and "[0]" in run.errors[0]["evalue"]
    assert result_text(kernel.execute("'lock' in dir()")) == "False"
    ok(kernel.execute("table = {'a': 1}"))
    run = kernel.execute("%%daytona map 2 --scatter table\nprint(table)")
    assert usage_error(run, "'table' cannot be split into chunks")
    run = kernel.execute("%%daytona map 2 --scatter nothing\npass")
    assert usage_error(run, "no variable 'nothing'")


def test_a_failing_worker_makes_the_cell_fail_naming_it_and_the_others_output_is_kept(kernel: Kernel) -> None:
    run = kernel.execute("%%daytona map 3\nif rank == 1:\n    raise ValueError('bad one')\nprint('fine', rank)")
    assert run.status == "error"
    (error,) = run.errors  # one error output, as for any cell
    assert error["ename"] == "CompositeError" and error["evalue"] == "1 of 3 engines failed: [1] ValueError: bad one"
    assert any("[1:execute] ValueError: bad one" in line for line in error["traceback"])
    assert lines(run) == {0: ["fine 0"], 2: ["fine 2"]}
    assert run.reply["content"]["ename"] == "CompositeError"


def test_interrupt_stops_every_worker_and_keeps_their_state(kernel: Kernel) -> None:
    ok(kernel.execute("%%daytona map 2\nkept = 'k%d' % rank"))
    started: set[str] = set()

    def watch(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            started.update(re.findall(r"\[stdout:(\d)\] started", msg["content"]["text"]))

    def interrupt_when_both_run() -> None:
        if wait_until(lambda: started == {"0", "1"}, 30):
            kernel.interrupt()

    helper = threading.Thread(target=interrupt_when_both_run)
    helper.start()
    run = kernel.execute(
        "%%daytona map 2\nimport time\nprint('started', flush=True)\ntime.sleep(120)", on_message=watch, timeout=60
    )
    helper.join()
    assert run.status == "error" and run.errors[0]["ename"] == "KeyboardInterrupt"
    assert "[0] KeyboardInterrupt" in run.errors[0]["evalue"] and "[1] KeyboardInterrupt" in run.errors[0]["evalue"]
    assert lines(ok(kernel.execute("%%daytona map 2\nprint(kept)"))) == {0: ["k0"], 1: ["k1"]}


def test_an_interrupt_while_the_workers_start_leaves_a_pool_ready_for_the_next_cell(kernel: Kernel) -> None:
    ok(kernel.execute("%daytona map --close"))

    interrupted: list[bool] = []

    def interrupt_once_starting(msg: dict[str, Any]) -> None:  # the status line says they start
        if msg["msg_type"] == "display_data" and "starting 3 engines" in msg["content"]["data"]["text/plain"] and not interrupted:
            interrupted.append(True)
            kernel.interrupt()

    run = kernel.execute("%%daytona map 3\nimport time\ntime.sleep(60)", on_message=interrupt_once_starting, timeout=60)
    assert run.status == "error" and run.errors[0]["ename"] == "KeyboardInterrupt"
    after = ok(kernel.execute("%%daytona map 3\nprint(rank)"))
    assert "started" not in shown(after, "stderr")  # the workers started then are the pool now
    assert lines(after) == {0: ["0"], 1: ["1"], 2: ["2"]}


def test_a_worker_that_dies_is_named_and_comes_back_fresh(kernel: Kernel) -> None:
    ok(kernel.execute("%%daytona map 2\nkept = rank"))
    run = kernel.execute("%%daytona map 2\nimport os\nif rank == 1:\n    os._exit(3)\nprint('alive', rank)")
    assert run.status == "error"
    assert run.errors[0]["evalue"].startswith("1 of 2 engines failed: [1] ")
    assert "died" in run.errors[0]["evalue"]
    assert lines(run) == {0: ["alive 0"]}
    after = ok(kernel.execute("%%daytona map 2\nprint(globals().get('kept'), rank, world)"))
    assert lines(after) == {0: ["0 0 2"], 1: ["None 1 2"]}


def test_a_partial_line_shows_while_the_worker_runs(kernel: Kernel) -> None:
    """The interrupt is sent when the line without its newline arrives: it must arrive before the cell ends."""
    seen: list[bool] = []

    def interrupt_at_the_partial_line(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and "[stdout:1] half way" in msg["content"]["text"] and not seen:
            seen.append(True)
            kernel.interrupt()

    code = (
        "%%daytona map 2\nimport time\nif rank == 1:\n    print('half way', end='', flush=True)\ntime.sleep(40)\nprint('slept')"
    )
    run = kernel.execute(code, on_message=interrupt_at_the_partial_line, timeout=120)
    assert seen and run.errors and run.errors[0]["ename"] == "KeyboardInterrupt", run.outputs
    assert "slept" not in shown(run)
    assert lines(run) == {1: ["half way"]}  # ended with a newline when the cell ended


def test_a_carriage_return_cannot_pass_one_worker_off_as_another(kernel: Kernel) -> None:
    run = ok(kernel.execute("%%daytona map 2\nif rank == 1:\n    print('\\r[stdout:0] forged')\nprint('real', rank)"))
    for line in shown(run).splitlines():  # as a client shows it: the text after a carriage return overwrites the start
        screen = ""
        for part in line.split("\r"):
            screen = part + screen[len(part) :]
        assert not (screen.startswith("[stdout:0] ") and "forged" in screen), repr(line)


def test_a_worker_replaced_in_the_middle_of_a_map_is_named_and_the_pool_goes_on(kernel: Kernel) -> None:
    ok(kernel.execute("%%daytona map 3\nkept = rank"))
    run = kernel.execute(
        "%%daytona map 3\nimport os\nprint('before', rank, flush=True)\nif rank == 2:\n    os._exit(9)\nprint('after', rank)"
    )
    assert run.status == "error"
    evalue = run.errors[0]["evalue"]
    assert evalue.startswith("1 of 3 engines failed: [2] ") and "died" in evalue, evalue
    assert lines(run) == {0: ["before 0", "after 0"], 1: ["before 1", "after 1"], 2: ["before 2"]}
    after = ok(kernel.execute("%%daytona map 3\nprint(globals().get('kept'), rank)"))
    assert lines(after) == {0: ["0 0"], 1: ["1 1"], 2: ["None 2"]}
    assert not repeated_lines(run) and not repeated_lines(after)


def test_a_worker_replaced_between_map_cells_is_said_with_its_rank_before_its_output(kernel: Kernel) -> None:
    """The daemon (and the local worker) replaces an interpreter that died between cells: the next map cell
    installs the runtime again in that worker, says so once with its rank, and runs there."""
    ok(kernel.execute("%%daytona map 3\nkept = rank"))
    victim = pids(kernel, 3)[1]
    os.kill(victim, signal.SIGKILL)
    assert wait_until(lambda: not os.path.exists(f"/proc/{victim}"))
    time.sleep(0.3)  # the parent's handler of the exit runs just after the reap (as test_worker_replaced waits)
    run = ok(kernel.execute("%%daytona map 3\nprint(globals().get('kept'), rank)"))
    assert lines(run) == {0: ["0 0"], 1: ["None 1"], 2: ["2 2"]}
    texts = [m["content"]["text"] for m in run.outputs if m["msg_type"] == "stream"]
    said = [i for i, text in enumerate(texts) if "variables were reset" in text]
    assert len(said) == 1 and texts[said[0]].startswith("[stderr:1] "), texts
    assert said[0] < texts.index("[stdout:1] None 1\n"), texts  # before the worker's output, as for the main sandbox
    assert not repeated_lines(run)


def repeated_lines(run: Run) -> list[str]:
    every = "".join(m["content"]["text"] for m in run.outputs if m["msg_type"] == "stream").splitlines()
    return [line for line in set(every) if every.count(line) > 1]


def test_fan_out_max_caps_n(tmp_path: Path) -> None:
    with Kernel("daytona-local", cwd=str(tmp_path), env={"DAYTONA_KERNEL_FAN_OUT_MAX": "2"}) as k:
        run = k.execute("%%daytona map 3\nprint(rank)")
        assert usage_error(run, "at most fan_out_max=2 engines")
        assert lines(ok(k.execute("%%daytona map 2\nprint(rank)"))) == {0: ["0"], 1: ["1"]}


def local_workers(data_dir: Path) -> set[str]:
    folder = data_dir / "daytona-kernel" / "sandboxes"
    return {p.name for p in folder.iterdir() if re.fullmatch(r"local-[0-9a-f]{12}", p.name)} if folder.is_dir() else set()


def test_shutdown_ends_the_workers_and_deletes_their_folders(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"  # its own: no other test's sandboxes there
    with Kernel("daytona-local", cwd=str(tmp_path), env={"JUPYTER_DATA_DIR": str(data_dir)}) as k:
        worker_pids = pids(k, 2)
        assert len(local_workers(data_dir)) == 2
    assert wait_until(lambda: not any(alive(pid) for pid in worker_pids.values()))
    assert local_workers(data_dir) == set()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_workers_of_a_sigkilled_kernel_die_with_it_and_gc_removes_what_they_left(tmp_path: Path) -> None:
    data_dir, scratch = tmp_path / "data", tmp_path / "tmp"  # its own: gc --older-than 0 touches nothing of another test
    scratch.mkdir()
    notebook = tmp_path / "nb"
    notebook.mkdir()
    (notebook / "data.csv").write_text("a,b\n")  # a file to copy into the workers: their mirror keeps a record
    k = Kernel("daytona-local", cwd=str(notebook), env={"JUPYTER_DATA_DIR": str(data_dir), "TMPDIR": str(scratch)})
    try:
        worker_pids = pids(k, 2)
        os.kill(k.km.provisioner.pid, signal.SIGKILL)  # type: ignore[union-attr]
        assert wait_until(lambda: not any(alive(pid) for pid in worker_pids.values()))
        assert wait_until(lambda: not k.km.is_alive())  # reaped, so its pid counts as gone
    finally:
        k.kc.stop_channels()
        k.km.cleanup_resources()
    assert len(local_workers(data_dir)) == 2
    assert len(list(scratch.glob("daytona-kernel-fanout-*"))) == 1
    env = {key: v for key, v in os.environ.items() if not key.startswith("DAYTONA_")}
    env.update(DAYTONA_KERNEL_BACKEND="local", JUPYTER_DATA_DIR=str(data_dir), TMPDIR=str(scratch))
    gc = subprocess.run(
        [sys.executable, "-m", "daytona_kernel.cli", "gc", "--older-than", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert local_workers(data_dir) == set()
    assert not list(scratch.glob("daytona-kernel-fanout-*")), gc.stdout
