"""The session journal (runtime/journal.py) in process: what a cell wrote, rotated and bounded,
read back from an offset, and owned by exactly one kernel process."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys
import threading
import types
from pathlib import Path
from typing import Any, Callable

import pytest

from daytona_kernel.runtime import journal, streams
from daytona_kernel.runtime.calls import JournalOptions
from daytona_kernel.runtime.framing import MARK, Kind, encode_frame

TOKEN = "0123abcd"
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
        self.fds: Any = None

    def request_output(self) -> Any:
        return contextlib.nullcontext()

    def send(self, kind: str, payload: Any) -> None:
        self.sent.append((kind, payload))


def opened(tmp_path: Path) -> tuple[StubRuntime, journal.Journal]:
    rt = StubRuntime(tmp_path / "workspace")
    (tmp_path / "workspace").mkdir()
    options = JournalOptions(root="../journal", session="ctx-1", instance="me", owner=ME, notebook="nb.ipynb")
    j = journal.open_journal(rt, options)
    assert j is not None
    return rt, j


class DaemonEmitter:
    """sys.stdout of the Daytona daemon's worker (repl_worker.py, _StreamEmitter and _emit): a chunk at a newline or
    1024 characters, sent as ``json.dump`` of {"type", "text"} to ``sys.__stdout__`` (written a token at a time), then a
    newline and a flush."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        if "\n" in text or sum(map(len, self.parts)) >= 1024:
            self.flush()
        return len(text)

    def flush(self) -> None:
        if self.parts:
            text, self.parts = "".join(self.parts), []
            emit({"type": self.kind, "text": text})


def emit(chunk: dict[str, str]) -> None:
    json.dump(chunk, sys.__stdout__)
    sys.__stdout__.write("\n")
    sys.__stdout__.flush()


def through_the_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[StubRuntime, journal.Journal, Path]:
    """A journal whose runtime writes to the daemon's worker, as in a sandbox: its streams' targets are the worker's
    emitters, and ``sys.__stdout__`` is the runtime's ProtocolWriter, writing the lines to a file (the daemon's pipe)."""
    rt, j = opened(tmp_path)
    daemon = tmp_path / "daemon"
    writer = streams.ProtocolWriter(rt, os.open(daemon, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    monkeypatch.setattr(sys, "__stdout__", writer)
    rt.fds = types.SimpleNamespace(protocol=writer)
    rt.out.target, rt.err.target = DaemonEmitter("stdout"), DaemonEmitter("stderr")
    rt._frame_target = rt.out.target
    return rt, j, daemon


def journal_lines(folder: str) -> list[bytes]:
    return b"".join(path.read_bytes() for path in sorted(Path(folder).glob("out.*.jsonl"))).splitlines(keepends=True)


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


@pytest.mark.parametrize("runtime", ["through the worker", "without a protocol writer"])
def test_the_journal_is_bounded_rotates_and_never_splits_a_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: str
) -> None:
    monkeypatch.setattr(journal, "FILE_BYTES", 300)
    rt, j = through_the_worker(tmp_path, monkeypatch)[:2] if runtime == "through the worker" else opened(tmp_path)
    j.arm(1)
    j.begin()
    for i in range(100):
        rt.out.target.write(f"line {i}\n")
    pieces = encode_frame(TOKEN, Kind.DISPLAY, {"data": {"text/plain": "x" * 400}}, piece_chars=40)
    assert len(pieces) > 10  # more than two files hold (about 80 bytes a line)
    for piece in pieces:
        rt._frame_target.write(piece)
    rt.out.target.write("last\n")
    records, lost, _ = read_all(j.folder)
    assert lost  # the start was rotated away: at most two files are kept
    assert len(list(Path(j.folder).glob("out.*.jsonl"))) == 2
    texts = [r["text"] for r in records]
    assert texts[-1] == "last\n"
    assert texts[-1 - len(pieces) : -1] == pieces  # the frame's pieces stay together


def test_the_journal_keeps_the_lines_the_daemon_got_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal records the worker's own stdout and stderr lines as they go to the daemon (docs/reattach.md): what
    a reattaching kernel replays is what the kernel was sent, a line the cell wrote in the daemon's format to
    sys.__stdout__ and the worker's coalescing of a partial line included; the worker's other lines are not output."""
    rt, j, daemon = through_the_worker(tmp_path, monkeypatch)
    frame = encode_frame(TOKEN, Kind.DISPLAY, {"data": {"text/plain": "é" * 100}}, piece_chars=200)
    j.arm(1)
    j.begin()
    writes: list[Callable[[], Any]] = [
        lambda: rt.out.target.write("hello\n"),
        lambda: rt.out.target.write('é ü \x01 "quoted" \\ \ud800 \t\n'),
        lambda: rt.err.target.write("careful\n"),
        lambda: rt.out.target.write("abc"),  # the worker holds a partial line ...
        lambda: rt.out.target.write("def\n"),  # ... and sends it with the next: one line, "abcdef\n"
        *[lambda piece=piece: rt._frame_target.write(piece) for piece in frame],
        lambda: sys.__stdout__.write('{"type": "stdout", "text": "written to sys.__stdout__\\n"}\n'),
        lambda: emit({"type": "error", "name": "E", "value": "", "traceback": ""}),
    ]
    for write in writes:
        write()
    j.end()
    rt.out.target.write("after the cell\n")
    sent = daemon.read_bytes().splitlines(keepends=True)
    output = [line for line in sent if line.startswith((b'{"type": "stdout"', b'{"type": "stderr"'))]
    assert len(output) == len(sent) - 1 == 6 + len(frame)
    assert journal_lines(j.folder) == output[:-1]  # the line after the cell is not the cell's
    records = read_all(j.folder)[0]
    assert [r["text"] for r in records[:2]] == ["hello\n", 'é ü \x01 "quoted" \\ \ud800 \t\n']
    assert [(r["type"], r["text"]) for r in records[2:4]] == [("stderr", "careful\n"), ("stdout", "abcdef\n")]
    assert [r["text"] for r in records[4:]] == [*frame, "written to sys.__stdout__\n"]
    assert all(r["text"].startswith(MARK) for r in records[4:-1])


def test_a_worker_chunk_with_a_field_before_its_text_is_still_journaled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal keeps Daytona's worker lines as they are when they start as its json.dump writes them today
    (repl_worker.py ``_emit``: ``{"type": "stdout", "text": ...}``); a worker that adds a field before the text
    must not leave the journal empty, so such a line is read and journaled in today's layout."""
    rt, j, daemon = through_the_worker(tmp_path, monkeypatch)
    j.arm(1)
    j.begin()
    sys.__stdout__.write('{"type": "stdout", "seq": 1, "text": "with a field\\n"}\n')
    sys.__stdout__.write('{"type": "stderr", "seq": 2, "text": "on stderr\\n"}\n')
    sys.__stdout__.write('{"type": "stdout", "seq": 3}\n')  # no text: nothing to keep
    deep = '{"type": "stdout", "a": ' + "[" * 5000 + "]" * 5000 + ', "text": "too deep to read"}\n'
    sys.__stdout__.write(deep)  # a forged line the json module cannot read: dropped, and the write goes on
    sys.__stdout__.write('{"type": "control", "text": "completed"}\n')
    j.end()
    assert len(daemon.read_bytes().splitlines()) == 5  # the daemon got them as they were
    assert [(r["type"], r["text"]) for r in read_all(j.folder)[0]] == [("stdout", "with a field\n"), ("stderr", "on stderr\n")]


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
    assert kind == "error" and payload["ename"] == "DaytonaKernelDetached" and "(k2)" in payload["evalue"]
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


# -- the journal is hostile input: a cell can write any of it (issue 20, item 4; issue 23, item 3) --------------

FORGED = {
    "infinite pid": '{"session": "ctx-f1", "token": "0123456789abcdef", "pid": Infinity, "count": 1}',
    "huge count": '{"session": "ctx-f2", "token": "0123456789abcdef", "pid": 1, "count": 1e400}',
    "nan time": '{"session": "ctx-f3", "token": "0123456789abcdef", "pid": 1, "last_cell_at": NaN}',
    "bool pid": '{"session": "ctx-f4", "token": "0123456789abcdef", "pid": true}',
    "huge int": '{"session": "ctx-f5", "token": "0123456789abcdef", "pid": 1, "variables": ' + "9" * 400 + "}",
    "not a dict": "[1, 2, 3]",
    "deep": "[" * 100_000 + "]" * 100_000,
    "string count": '{"session": "ctx-f7", "token": "0123456789abcdef", "pid": 1, "count": "7"}',
    "bad token": '{"session": "ctx-f8", "token": "<script>", "pid": 1}',
}


def forge(root: Path, name: str, meta_text: str, owner_text: str = "{}") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(meta_text)
    (folder / "owner.json").write_text(owner_text)
    return folder


def test_a_forged_journal_never_stops_the_scan_and_every_bad_value_is_refused(tmp_path: Path) -> None:
    from daytona_kernel.journal import Detached, KernelIdentity

    rt, j = opened(tmp_path)
    root = Path(j.folder).parent
    for i, text in enumerate(FORGED.values()):
        forge(root, f"ctx-f{i}", text, owner_text='{"host": Infinity, "pid": 1e400}')
    forge(root, "ctx-big", '{"session": "ctx-big", "pad": "' + "x" * 100_000 + '"}')
    scanned = journal.scan(str(root))  # the runtime's side: never raises
    identity = KernelIdentity("k", "nb.ipynb")
    parsed = {e["meta"].get("session"): Detached.parse(e, scanned["now"], identity) for e in scanned["sessions"]}
    assert parsed.pop("ctx-1") is not None  # the real one
    assert set(parsed.values()) == {None}, parsed  # every forged one is refused, none raises
    assert "ctx-big" not in parsed  # too big to be ours: not even read
    assert Detached.parse({"meta": {"session": "ctx-1"}, "owner": []}, float("inf"), identity) is None


def test_values_a_forged_journal_sends_are_bounded_before_they_are_shown(tmp_path: Path) -> None:
    from daytona_kernel.journal import Detached, KernelIdentity

    meta = {"session": "ctx-2", "token": "0123456789abcdef", "pid": 5, "count": 3, "name": "\x1b[2Jnb\u202e.ipynb" * 50}
    session = Detached.parse({"meta": meta, "owner": {"kernel": "k\x00" * 100}, "alive": True}, 1e300, KernelIdentity("k", ""))
    assert session is not None
    assert session.name.startswith("[2Jnb.ipynb") and len(session.name) <= 80 and "\x1b" not in session.name
    assert session.owner_kernel == "k" * 40
    assert session.idle_s == 0.0 and "ran just now" in session.describe()  # a sandbox clock of 1e300 is not believed


def test_a_journal_line_longer_than_a_read_is_passed_over_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "READ_BYTES", 200)
    rt, j = opened(tmp_path)
    j.arm(1)
    j.begin()
    rt.out.target.write("before\n")
    rt.out.target.write("x" * 5000)  # one record: one line of about 5 KB
    rt.out.target.write("after\n")
    records, _, _ = read_all(j.folder)
    assert [r["type"] for r in records] == ["stdout", journal.SKIPPED, "stdout"]
    assert records[0]["text"] == "before\n" and records[2]["text"] == "after\n" and int(records[1]["text"]) > 5000


def test_a_forged_record_is_dropped_from_the_replay(tmp_path: Path) -> None:
    rt, j = opened(tmp_path)
    (Path(j.folder) / "out.0.jsonl").write_text(
        '{"type": "stdout", "text": "ok\\n"}\n{"type": "stdout", "text": 1e400}\n[1]\n{"type": "evil", "text": "x"}\n'
    )
    assert [r["text"] for r in read_all(j.folder)[0]] == ["ok\n"]


def test_a_pid_reused_after_the_sandbox_restarted_is_not_the_session(tmp_path: Path) -> None:
    """A stop or restart of the sandbox starts pids from 1 again: the same pid is another process."""
    rt, j = opened(tmp_path)
    root = Path(j.folder).parent
    meta = json.loads((Path(j.folder) / "meta.json").read_text())
    assert meta["pid"] == os.getpid() and meta["stamp"]  # this process, with its boot id and start time
    forge(root, "ctx-old", json.dumps(dict(meta, session="ctx-old", stamp="another-boot:" + meta["stamp"].split(":")[1])))
    forge(root, "ctx-older", json.dumps(dict(meta, session="ctx-older", stamp=meta["stamp"].split(":")[0] + ":1")))
    forge(root, "ctx-unstamped", json.dumps({k: v for k, v in dict(meta, session="ctx-unstamped").items() if k != "stamp"}))
    alive = {s["meta"]["session"]: s["alive"] for s in journal.scan(str(root))["sessions"]}
    assert alive == {"ctx-1": True, "ctx-old": False, "ctx-older": False, "ctx-unstamped": False}
    assert journal.read(str(root / "ctx-old"), 0, 0)["alive"] is False
    journal.hello_sessions(j)  # the runtime's hello prunes them
    assert sorted(p.name for p in root.iterdir()) == ["ctx-1"]


def test_the_journal_keeps_no_host_name_pid_or_local_path_readable_in_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from daytona_kernel import journal as attach
    from daytona_kernel.journal import KernelIdentity

    notebook = "/home/alice/clients/acme-merger/model.ipynb"
    identity = KernelIdentity("kid", notebook)
    owner = identity.owner()
    written = json.dumps(owner) + json.dumps(dataclasses.asdict(attach.SessionJournal.options.__get__(_Journal(identity))("c")))
    assert socket.gethostname() not in written and "alice" not in written and "acme" not in written
    assert owner["pid"] != os.getpid()
    seen: list[int] = []
    monkeypatch.setattr(attach, "pid_is_kernel", lambda pid: seen.append(pid) or True)
    assert identity.owner_alive(owner) is True and seen == [os.getpid()]  # this machine can still tell
    assert identity.owner_alive(dict(owner, host="0" * 32)) is None  # another machine's
    assert KernelIdentity("kid", notebook).notebook_tag == identity.notebook_tag != KernelIdentity("kid", "x").notebook_tag


class _Journal:
    """Just enough of a SessionJournal for its ``options``."""

    def __init__(self, identity: Any) -> None:
        self.identity = identity
        self.root = "/home/daytona/.daytona-kernel/journal"
        self._sandbox = type("S", (), {"workdir": "/home/daytona/workspace"})()


def test_a_session_the_daemon_no_longer_runs_is_not_announced(tmp_path: Path) -> None:
    """After a stop or restart of the sandbox, the journal is still on its disk but the daemon's contexts are
    gone: the kernel asks the daemon before it says that the previous session "is still running"."""
    import asyncio
    import logging

    from daytona_kernel.config import SessionSettings
    from daytona_kernel.journal import KernelIdentity, SessionJournal, _pad
    from daytona_kernel.outputs import OutputPolicy

    identity = KernelIdentity("k", "nb.ipynb")
    dead_owner = dict(identity.owner(), instance="0" * 16, pid=journal.PID_MAX ^ _pad(identity.key, "0" * 16))  # no such process
    meta = {"session": "ctx-old", "token": "0123456789abcdef", "pid": 7, "state": "running", "cell_count": 7,
            "notebook": identity.notebook_tag, "count": 6}  # fmt: skip
    scanned = {"now": 1e9, "sessions": [{"meta": dict(meta, last_cell_at=1e9), "owner": dead_owner, "alive": True}]}

    class Box:
        workdir = "/home/daytona/workspace"

        def __init__(self, live: set[str]) -> None:
            self.live = live
            self.toolbox = self  # its own toolbox

        async def live_contexts(self) -> set[str]:
            return self.live

    def look(live: set[str]) -> str:
        j = SessionJournal(Box(live), SessionSettings(), identity, OutputPolicy(trusted=True), logging.getLogger("t"))  # type: ignore[arg-type]
        return asyncio.run(j.look("ctx-new", scanned))

    assert "cell [7] still running" in look({"ctx-old", "ctx-new"})
    assert look({"ctx-new"}) == ""


# -- the kernel's verbs, as typed calls (calls.JournalCall) --------------------------------------------------


def run_main(call_json: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    journal.main([call_json])
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_a_claim_travels_by_name_and_swapped_or_missing_arguments_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``claim(folder, expected, owner)`` by position let two strings swap unnoticed; by name, typed, they cannot."""
    from daytona_kernel.runtime.calls import CALLS, ClaimSession, decode, encode

    _, j = opened(tmp_path)
    swapped = json.dumps({"method": "claim", "args": {"folder": j.folder, "expected": json.dumps(ME), "owner": "me"}})
    assert "claim.owner is not an object" in run_main(swapped, capsys)["error"]
    missing = json.dumps({"method": "claim", "args": {"folder": j.folder, "owner": ME}})
    assert "expected" in run_main(missing, capsys)["error"]
    assert run_main(json.dumps({"method": "adopt", "args": {"instance": "x"}}), capsys) == {"error": "no journal method 'adopt'"}
    assert journal.claim(j.folder, "me", ME)["ok"]  # nothing above changed the owner
    new_owner = dict(ME, instance="new")
    assert run_main(encode(ClaimSession(folder=j.folder, expected="me", owner=new_owner)), capsys) == {
        "ok": True,
        "owner": new_owner,
    }
    with pytest.raises(Exception, match="no runtime method 'claim'"):  # the runtime never takes a journal verb for its own
        decode(encode(ClaimSession(folder=j.folder, expected="me", owner=ME)), CALLS)


def test_the_journal_command_runs_isolated_beside_a_users_json_module(tmp_path: Path) -> None:
    """What the kernel sends through process.exec: the calls module and the journal's source, one typed call."""
    import subprocess

    from daytona_kernel.runtime import journal_command
    from daytona_kernel.runtime.calls import ReadJournal, ScanJournals

    _, j = opened(tmp_path)
    (tmp_path / "json.py").write_text("raise SystemExit('shadowed')\n")
    for call in (ScanJournals(root=os.path.dirname(j.folder)), ReadJournal(folder=j.folder, n=0, offset=0)):
        done = subprocess.run(["sh", "-c", journal_command(call)], cwd=tmp_path, capture_output=True, text=True, check=True)
        result = json.loads(done.stdout)
        assert "error" not in result
    assert result["meta"]["session"] == "ctx-1"
