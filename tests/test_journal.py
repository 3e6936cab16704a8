"""The session journal (runtime/journal.py) in process: what a cell wrote, rotated and bounded,
read back from an offset, and owned by exactly one kernel process."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from daytona_kernel.runtime import journal
from daytona_kernel.runtime.framing import Kind, encode_frame

TOKEN = "t0k"
ME = {"instance": "me", "kernel": "k1", "host": "h", "pid": 1}


class Stream:
    def __init__(self) -> None:
        self.target: Any = io.StringIO()


class StubRuntime:
    """The few runtime attributes the journal touches."""

    def __init__(self, workdir: Path) -> None:
        self.token = TOKEN
        self.workdir = str(workdir)
        self.out, self.err = Stream(), Stream()
        self._frame_target: Any = self.out.target
        self.user_ns: dict[str, Any] = {"x": 1, "_hidden": 2, "json": json}
        self.initial_names: frozenset[str] = frozenset()
        self.sent: list[tuple[str, Any]] = []

    def session(self) -> Any:
        return contextlib.nullcontext()

    def send(self, kind: str, payload: Any) -> None:
        self.sent.append((kind, payload))


def opened(tmp_path: Path) -> tuple[StubRuntime, journal.Journal]:
    rt = StubRuntime(tmp_path / "workspace")
    (tmp_path / "workspace").mkdir()
    j = journal.open_journal(
        rt, {"root": "../journal", "session": "ctx-1", "notebook": "nb.ipynb", "instance": "me", "owner": ME}
    )
    assert j is not None
    return rt, j


def read_all(folder: str) -> tuple[list[dict[str, str]], bool, dict[str, Any]]:
    records: list[dict[str, str]] = []
    n = offset = 0
    lost = False
    while True:
        got = journal.read(folder, n, offset)
        lost = lost or got["lost"]
        records += got["records"]
        n, offset = got["n"], got["offset"]
        if not got["records"]:
            return records, lost, got["meta"]


def test_a_cell_is_journaled_then_marked_idle_with_its_count_and_variables(tmp_path: Path) -> None:
    rt, j = opened(tmp_path)
    assert j.arm(7)
    j.begin()
    rt.out.target.write("hello\n")
    rt.err.target.write("careful\n")
    records, lost, meta = read_all(j.folder)
    assert meta["state"] == "running" and meta["cell_count"] == 7
    assert records == [{"type": "stdout", "text": "hello\n"}, {"type": "stderr", "text": "careful\n"}] and not lost
    j.end()
    assert isinstance(rt.out.target, io.StringIO) and rt.out.target.getvalue() == "hello\n"  # un-teed, and passed on
    meta = read_all(j.folder)[2]
    assert (meta["state"], meta["count"], meta["variables"]) == ("idle", 7, 1)


def test_the_journal_is_bounded_rotates_and_never_splits_a_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "FILE_BYTES", 300)
    rt, j = opened(tmp_path)
    j.arm(1)
    j.begin()
    for i in range(100):
        rt.out.target.write(f"line {i}\n")
    pieces = encode_frame(TOKEN, Kind.DISPLAY, {"data": {"text/plain": "x" * 200}}, piece_chars=60)
    assert len(pieces) > 3
    for piece in pieces:
        rt._frame_target.write(piece)
    rt.out.target.write("last\n")
    records, lost, _ = read_all(j.folder)
    assert lost  # the start was rotated away: at most two files are kept
    assert len(list(Path(j.folder).glob("out.*.jsonl"))) == 2
    texts = [r["text"] for r in records]
    assert texts[-1] == "last\n"
    assert texts[-1 - len(pieces) : -1] == pieces  # the frame's pieces stay together


def test_exactly_one_of_two_kernels_claims_a_session(tmp_path: Path) -> None:
    _, j = opened(tmp_path)
    results: list[dict[str, Any]] = []
    claimers = [
        threading.Thread(target=lambda n=n: results.append(journal.claim(j.folder, "me", dict(ME, instance=f"other-{n}"))))
        for n in range(8)
    ]
    for thread in claimers:
        thread.start()
    for thread in claimers:
        thread.join()
    assert sum(r["ok"] for r in results) == 1


def test_a_kernel_that_lost_its_session_gets_its_cell_refused(tmp_path: Path) -> None:
    rt, j = opened(tmp_path)
    assert journal.claim(j.folder, "me", dict(ME, instance="new", kernel="k2", host="laptop"))["ok"]
    assert not j.arm(3)
    j.refuse()
    [(kind, payload)] = rt.sent
    assert kind == "error" and payload["ename"] == "DaytonaKernelDetached" and "k2 on laptop" in payload["evalue"]
    j.adopt("new")  # the new owner takes over: its cells run again
    assert j.arm(4)
    assert rt.sent[-1][0] == "reply" and rt.sent[-1][1]["count"] == 0


def test_the_hello_scan_reports_live_sessions_and_prunes_ended_ones(tmp_path: Path) -> None:
    rt, j = opened(tmp_path)
    ended = Path(j.folder).parent / "ctx-ended"
    ended.mkdir()
    (ended / "meta.json").write_text(json.dumps({"session": "ctx-ended", "pid": 2**22 + 7}))  # no such process
    scanned = journal.hello_sessions(j)
    assert [s["meta"]["session"] for s in scanned["sessions"]] == ["ctx-1"]  # this process: alive
    assert not ended.exists()
    assert journal.hello_sessions(None) == {}
