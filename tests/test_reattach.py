"""Sessions that outlive their kernel (issue 17, items 2 and 3), against the emulator.

The daemon keeps a context's worker running when its websocket client goes and drains its
output (docs/reattach.md); the runtime journals each cell on the sandbox's disk, and a new
kernel process attaches with ``%daytona attach``: it replays what it missed, follows the cell
to its end, and takes over the namespace and the execution count.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import sandboxes_of
from kernels import Kernel, result_text

from daytona_kernel import admin
from daytona_kernel.runtime import journal
from daytona_kernel.runtime.framing import MARK

NOTEBOOK = {"JPY_SESSION_NAME": "analysis.ipynb", "DAYTONA_KERNEL_SYNC": "off"}
STEPS = 6  # the long cell prints this many lines: half, then (once the test lets it go on) the rest
LONG_CELL = (
    "import os, time\n"
    f"for i in range({STEPS}):\n"
    f"    while i == {STEPS // 2} and not os.path.exists('go'):\n"
    "        time.sleep(0.05)\n"
    "    print('step', i, flush=True)\n"
    "    time.sleep(0.1)\n"
    "y = x + 1\n"
)


def start_cell(k: Kernel, code: str) -> str:
    return str(k.kc.execute(code, stop_on_error=False))


def wait_for_text(k: Kernel, msg_id: str, text: str, timeout: float = 30) -> str:
    """Read the cell's stream output until ``text`` shows; returns what was read."""
    seen = ""
    deadline = time.monotonic() + timeout
    while text not in seen:
        assert time.monotonic() < deadline, f"{text!r} not seen; got {seen!r}"
        try:
            msg = k.kc.get_iopub_msg(timeout=0.1)
        except Exception:  # queue.Empty: nothing yet
            continue
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            seen += msg["content"]["text"]
    return seen


def collect(k: Kernel, msg_id: str, timeout: float = 30) -> tuple[str, str, list[dict[str, Any]], dict[str, Any]]:
    """The rest of a cell started with ``start_cell``: (stdout, stderr, errors, reply content)."""
    out, err, errors = "", "", []
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"no idle within {timeout} s; stdout so far {out!r}"
        try:
            msg = k.kc.get_iopub_msg(timeout=0.1)
        except Exception:  # queue.Empty: nothing yet
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out, err = (out + content["text"], err) if content["name"] == "stdout" else (out, err + content["text"])
        elif kind == "error":
            errors.append(content)
        elif kind == "status" and content["execution_state"] == "idle":
            break
    while True:
        reply = k.kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return out, err, errors, reply["content"]


def kill(k: Kernel) -> None:
    """What a crash or an OOM kill does to the kernel process: no shutdown, no cleanup."""
    process = k.km.provisioner.process  # type: ignore[union-attr]
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    k.kc.stop_channels()


def live_contexts(emulator: Any, folder: Path) -> list[str]:
    [sandbox] = [s for s in sandboxes_of(emulator, folder) if s.state == "started"]
    return [cid for cid, ctx in sandbox.contexts.items() if ctx.worker.alive]


def test_a_new_kernel_attaches_to_the_cell_its_killed_kernel_left_running(daytona_env: Any, tmp_path: Path) -> None:
    first = Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path))
    first.execute("x = 41")
    [sandbox] = [s for s in sandboxes_of(daytona_env, tmp_path) if s.state == "started"]
    running = start_cell(first, LONG_CELL)
    wait_for_text(first, running, "step 1")
    kill(first)  # mid-cell: the daemon keeps the worker, and the cell goes on
    with Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path)) as second:
        fresh = second.execute("'y' in globals()")
        assert result_text(fresh) == "False"  # a fresh namespace until it attaches
        assert "%daytona attach" in fresh.text("stderr") and "still running" in fresh.text("stderr")
        attaching = start_cell(second, "%daytona attach")
        replayed = wait_for_text(second, attaching, f"step {STEPS // 2 - 1}")  # the output it missed
        (sandbox.home / "workspace" / "go").touch()  # the cell goes on: the rest is followed live
        followed, _, errors, reply = collect(second, attaching)
        printed = replayed + followed
        assert reply["status"] == "ok", errors
        assert [line for line in printed.splitlines() if line.startswith("step")] == [f"step {i}" for i in range(STEPS)]
        assert "attached:" in printed
        after = second.execute("y")
        assert result_text(after) == "42"  # the variables the cell set
        assert after.reply["content"]["execution_count"] == 3  # x = 41 was [1], the long cell [2]
        assert second.request("history", hist_access_type="tail", n=10, output=False, raw=True)["history"][:2] == [
            [1, 1, "x = 41"],
            [1, 2, LONG_CELL.rstrip("\n")],
        ]


def test_two_kernels_never_attach_to_the_same_session(daytona_env: Any, tmp_path: Path) -> None:
    first = Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path))
    first.execute("x = 41")
    kill(first)
    second = Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path))
    third = Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path))
    try:
        for k in (second, third):
            k.execute("1")  # both started and found the session
        runs: dict[str, Any] = {}
        threads = [
            threading.Thread(target=lambda k=k, name=name: runs.__setitem__(name, k.execute("%daytona attach")))
            for name, k in (("second", second), ("third", third))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        won = [name for name, run in runs.items() if run.status == "ok"]
        assert len(won) == 1, {name: (run.status, run.errors) for name, run in runs.items()}
        lost = runs["third" if won == ["second"] else "second"]
        why = lost.reply["content"]["evalue"]  # a UsageError: one line on stderr, the reply says why (as ipykernel)
        assert "attached to this session first" in why or "may still run" in why
        winner, loser = (second, third) if won == ["second"] else (third, second)
        assert result_text(winner.execute("x")) == "41"
        assert loser.execute("x").errors[0]["ename"] == "NameError"  # the loser keeps its fresh namespace
        again = loser.execute("%daytona attach")  # and cannot take the session from a live kernel
        assert "may still run" in again.reply["content"]["evalue"]
    finally:
        second.close()
        third.close()


def test_a_restart_gives_a_fresh_namespace_even_with_attach_auto(daytona_env: Any, tmp_path: Path) -> None:
    with Kernel("daytona", env={**NOTEBOOK, "DAYTONA_KERNEL_ATTACH": "auto"}, cwd=str(tmp_path)) as k:
        k.execute("x = 1")
        k.restart()
        run = k.execute("x")
        assert run.errors[0]["ename"] == "NameError"  # as ipykernel: a restart never attaches
        assert "attach" not in run.text("stderr")


def test_attach_auto_continues_the_session_before_the_first_cell(daytona_env: Any, tmp_path: Path) -> None:
    env = {**NOTEBOOK, "DAYTONA_KERNEL_ATTACH": "auto"}
    first = Kernel("daytona", env=env, cwd=str(tmp_path))
    first.execute("x = 41")
    kill(first)
    with Kernel("daytona", env=env, cwd=str(tmp_path)) as second:
        run = second.execute("x + 1")
        assert result_text(run) == "42"
        assert "attached:" in run.text("stderr")
        assert run.reply["content"]["execution_count"] == 2


def test_gc_reclaims_a_detached_session_past_its_idle_time(
    daytona_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path))
    first.execute("x = 41")
    [context] = live_contexts(daytona_env, tmp_path)
    [sandbox] = [s for s in sandboxes_of(daytona_env, tmp_path) if s.state == "started"]
    kill(first)
    lines: list[str] = []
    assert admin.run(admin.gc(3600.0, False, lines.append)) == 0
    assert any(line.startswith("kept detached session " + context[:8]) for line in lines), lines
    assert live_contexts(daytona_env, tmp_path) == [context]  # younger than detached_idle_minutes: kept
    assert sandbox.state == "started"  # not stopped from under the session
    monkeypatch.setenv("DAYTONA_KERNEL_DETACHED_IDLE_MINUTES", "0")
    lines.clear()
    assert admin.run(admin.gc(3600.0, False, lines.append)) == 0
    assert any(line.startswith("ended detached session " + context[:8]) for line in lines), lines
    assert context not in sandbox.contexts  # ended; with it gone, gc also stops the sandbox of the dead kernel
    assert not (sandbox.home / ".daytona-kernel" / "journal" / context).exists()


def test_a_cell_whose_websocket_is_cut_runs_to_its_end_and_keeps_its_output(daytona_env: Any, tmp_path: Path) -> None:
    """Nobody reads the cell's output after the cut: the daemon drains and drops it, so the runtime
    never blocks on a full pipe; the journal keeps it for an attaching kernel."""
    lines = 200_000  # about 1.3 MB: far more than any pipe holds
    code = (
        "import os, time\nprint('waiting', flush=True)\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\n"
        f"for i in range({lines}):\n    print(i)\nwith open('finished', 'w') as f:\n    f.write('yes')\n"
    )
    with Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path)) as k:
        k.execute("1")
        [sandbox] = [s for s in sandboxes_of(daytona_env, tmp_path) if s.state == "started"]
        running = start_cell(k, code)
        wait_for_text(k, running, "waiting")
        assert daytona_env.cut_websockets(sandbox.id) == 1
        (sandbox.home / "workspace" / "go").touch()  # the output starts once nobody reads it
        finished = sandbox.home / "workspace" / "finished"
        deadline = time.monotonic() + 30
        while not finished.exists():
            assert time.monotonic() < deadline, "the cell did not finish after its websocket was cut"
            time.sleep(0.1)
        [context] = live_contexts(daytona_env, tmp_path)
        folder = str(sandbox.home / ".daytona-kernel" / "journal" / context)
        texts, n, offset = [], 0, 0
        while True:  # read the journal the way an attaching kernel does
            read = journal.read(folder, n, offset)
            texts += [
                r["text"] for r in read["records"] if r["type"] == "stdout" and not r["text"].startswith(MARK)
            ]  # not frames
            n, offset = read["n"], read["offset"]
            if not read["records"]:
                break
        assert read["meta"]["state"] == "idle"
        assert "".join(texts).endswith(f"{lines - 1}\n")
        assert result_text(k.execute("i")) == str(lines - 1)  # the same session: its variables are kept


def test_attach_on_the_local_backend_says_what_to_do(tmp_path: Path) -> None:
    with Kernel("daytona-local", cwd=str(tmp_path)) as k:
        run = k.execute("%daytona attach")
        error = run.reply["content"]
        assert error["ename"] == "UsageError"
        assert "daytona backend" in error["evalue"] and "end with it" in error["evalue"]


# -- the journal is hostile input (issue 20, item 4) ----------------------------------------------------------

FORGE_JOURNALS = (
    "import json, os\n"
    "root = os.path.join('..', '.daytona-kernel', 'journal')\n"
    "for name in os.listdir(root):\n"
    "    meta = os.path.join(root, name, 'meta.json')\n"
    "    if json.load(open(meta))['count'] == 1:  # the detached session's\n"
    "        alive = dict(json.load(open(meta)), session='ctx-str', count='7')  # a live pid, a bad count\n"
    '        text = open(meta).read().replace(\'"count": \', \'"count": 1e400, "was": \')\n'
    "        open(meta, 'w').write(text.replace('\"pid\": ', '\"pid\": Infinity, \"was_pid\": '))\n"
    'for name, text in ((\'ctx-inf\', \'{"session": "ctx-inf", "token": "0123456789abcdef", "pid": Infinity}\'),\n'
    "                   ('ctx-str', json.dumps(alive)),\n"
    "                   ('ctx-deep', '[' * 100000), ('ctx-huge', '{\"pad\": \"' + 'x' * 10**6 + '\"}')):\n"
    "    os.makedirs(os.path.join(root, name), exist_ok=True)\n"
    "    open(os.path.join(root, name, 'meta.json'), 'w').write(text)\n"
    "    open(os.path.join(root, name, 'owner.json'), 'w').write('{\"pid\": 1e400, \"host\": NaN}')\n"
)


def test_a_forged_journal_never_stops_a_reply_or_gc(daytona_env: Any, tmp_path: Path) -> None:
    first = Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path))
    first.execute("x = 41")
    kill(first)
    second = Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path))
    assert second.execute(FORGE_JOURNALS).status == "ok"  # a cell forges the journal of the detached session
    kill(second)
    with Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path)) as third:
        for _ in range(2):
            run = third.execute("1 + 1", timeout=60)
            assert result_text(run) == "2", (run.errors, run.text("stderr"))
        lines: list[str] = []
        assert admin.run(admin.gc(3600.0, True, lines.append)) == 0
        assert any("skipped a malformed session journal" in line for line in lines), lines


def test_attach_to_a_forged_running_session_can_be_interrupted(daytona_env: Any, tmp_path: Path) -> None:
    """A cell marks the detached session as running forever: following it must stop at an interrupt."""
    first = Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path))
    first.execute("x = 41")
    kill(first)
    with Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path)) as second:
        forged = second.execute(
            "import json, os\n"
            "root = os.path.join('..', '.daytona-kernel', 'journal')\n"
            "for name in os.listdir(root):\n"
            "    path = os.path.join(root, name, 'meta.json')\n"
            "    meta = json.load(open(path))\n"
            "    if meta['count'] == 1:\n"
            "        meta['state'] = 'running'\n"
            "        json.dump(meta, open(path, 'w'))\n"
        )
        assert forged.status == "ok"
        attaching = start_cell(second, "%daytona attach")
        wait_for_text(second, attaching, "its last cell's output follows")
        time.sleep(1)
        second.interrupt()
        _, _, errors, reply = collect(second, attaching, timeout=30)
        assert reply["status"] == "error" and errors[0]["ename"] == "KeyboardInterrupt", errors
        assert "goes on in the sandbox" in errors[0]["evalue"]
        assert result_text(second.execute("'x' in globals()")) == "False"  # not attached
        again = second.execute("%daytona status")
        assert "detached" in again.text(), again.text()  # given back: still attachable


def test_a_pid_reused_after_the_sandbox_stopped_is_not_a_session_still_running(daytona_env: Any, tmp_path: Path) -> None:
    """Issue 23, item 3: a stop starts the sandbox's pids again, so the pid in a journal written before it
    may name another process afterwards. The journal stays on disk; the session does not."""
    first = Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path))
    first.execute("x = 41")
    [context] = live_contexts(daytona_env, tmp_path)
    [sandbox] = [s for s in sandboxes_of(daytona_env, tmp_path) if s.state == "started"]
    kill(first)
    daytona_env.stop_sandbox(sandbox.id)
    meta = sandbox.home / ".daytona-kernel" / "journal" / context / "meta.json"
    forged = json.loads(meta.read_text())
    forged.update(state="running", pid=os.getpid())  # the pid now names a live process: a reused pid
    meta.write_text(json.dumps(forged))
    with Kernel("daytona", env=NOTEBOOK, cwd=str(tmp_path)) as second:
        run = second.execute("'x' in globals()")
        assert result_text(run) == "False"
        assert "still running" not in run.text("stderr") and "%daytona attach" not in run.text("stderr")
        assert "none detached" in second.execute("%daytona status").text()
    assert not meta.exists()  # pruned by the next runtime's hello
