"""Threat list: frames from a hostile sandbox (issue 12, items 4 and 5).

Code in a cell runs in the same interpreter as the runtime, so it can read the
frame token and send any frame. Each test below is one attack; the kernel must
answer every request, turn a bad frame into a clear error for that cell only,
and never shift output into the next cell. Most run in-process against the
session with a scripted sandbox; the last ones run end to end on both backends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeSandbox, Run, frame, raw
from kernels import Kernel

from daytona_kernel.backends.local.sandbox import LocalSandbox
from daytona_kernel.cell import Cell, CellOutcome, Recorder
from daytona_kernel.config import DaytonaKernelConfig, LocalSettings, SessionSettings, settings_from
from daytona_kernel.runtime import framing
from daytona_kernel.runtime.calls import RuntimeOptions, Synced
from daytona_kernel.runtime.framing import MARK, PIECE_CHARS, BadFrame, FrameDecoder, Text, encode_frame
from daytona_kernel.session import SandboxSession

LOG = logging.getLogger("test-hostile")
PROTOCOL_ERROR = "SandboxProtocolError"


class MirrorSpy:
    """Stands in for the mirror: records what the session asks it to pull."""

    notice = ""
    syncs_down = True

    def __init__(self) -> None:
        self.pulled: list[dict[str, Any]] = []

    def runtime_options(self) -> RuntimeOptions:
        return RuntimeOptions()

    def handover(self) -> Synced:
        return Synced()

    async def push(self, progress: Any = None) -> Any:
        from daytona_kernel.mirror.plan import SyncReport

        return SyncReport()

    async def pull(self, changes: dict[str, Any], retry_failed: bool = False) -> Any:
        from daytona_kernel.mirror.plan import SyncReport

        self.pulled.append(changes)
        return SyncReport()


async def run_cells(*runs: Run, mirror: MirrorSpy | None = None) -> list[tuple[CellOutcome, Recorder]]:
    """Run one cell per scripted run, in one session; each cell's outcome and what its frontend got."""
    session = SandboxSession(FakeSandbox(list(runs)), SessionSettings(), LOG, mirror)  # type: ignore[arg-type]
    results = []
    for count in range(1, len(runs) + 1):
        front = Recorder()
        results.append((await session.execute(Cell("cell", count), front), front))
    return results


async def assert_rejected_for_its_cell_only(*bad_output: Any) -> Recorder:
    """The bad frame fails its cell with a protocol error; the next cell is untouched."""
    (bad, bad_front), (good, good_front) = await run_cells(Run(["before\n", *bad_output, "after\n"]), Run(["next\n"]))
    assert bad.error is not None and bad.error["ename"] == PROTOCOL_ERROR, bad.error
    assert bad_front.text() == "before\nafter\n"  # the cell's other output is kept, in order
    assert good.error is None and good_front.outputs == [("stream", {"name": "stdout", "text": "next\n"})]
    return bad_front


# -- schema ------------------------------------------------------------------------


async def test_files_as_a_string() -> None:
    mirror = MirrorSpy()
    ((outcome, _),) = await run_cells(Run([frame("files", "../../etc/passwd")]), mirror=mirror)
    assert outcome.error is not None and outcome.error["ename"] == PROTOCOL_ERROR
    assert mirror.pulled == []


async def test_a_bad_files_entry() -> None:
    await assert_rejected_for_its_cell_only(frame("files", {"changed": {"a.txt": "big"}, "deleted": []}))


async def test_a_nul_in_a_path() -> None:
    mirror = MirrorSpy()
    ((outcome, _),) = await run_cells(Run([frame("files", {"changed": {"a\x00b": [1, 2]}})]), mirror=mirror)
    assert outcome.error is not None and "not a valid path" in outcome.error["evalue"]
    assert mirror.pulled == []


async def test_a_partial_files_report_that_is_not_a_bool_or_hides_a_bad_path() -> None:
    await assert_rejected_for_its_cell_only(frame("files", {"changed": {"a.txt": [1, 2]}, "partial": "yes"}))
    mirror = MirrorSpy()
    ((outcome, _),) = await run_cells(Run([frame("files", {"changed": {"a\x00b": [1, 2]}, "partial": True})]), mirror=mirror)
    assert outcome.error is not None and "not a valid path" in outcome.error["evalue"]
    assert mirror.pulled == []


async def test_a_partial_files_report_is_pulled_while_the_cell_runs_and_the_final_one_after() -> None:
    mirror = MirrorSpy()
    partial = frame("files", {"changed": {"log.txt": [1, 2]}, "partial": True})
    final = frame("files", {"changed": {"log.txt": [5, 6]}, "deleted": []})
    ((outcome, _),) = await run_cells(Run([partial, "out\n", final]), mirror=mirror)
    assert outcome.error is None
    assert [(dict(c.changed), c.partial) for c in mirror.pulled] == [({"log.txt": (1, 2)}, True), ({"log.txt": (5, 6)}, False)]


async def test_error_as_a_string() -> None:
    await assert_rejected_for_its_cell_only(frame("error", "boom"))


async def test_result_without_data() -> None:
    await assert_rejected_for_its_cell_only(frame("result", {"execution_count": 1}))


async def test_an_unknown_frame_kind() -> None:
    await assert_rejected_for_its_cell_only(frame("exec_on_host", {"code": "rm -rf ~"}))


async def test_an_input_request_when_the_cell_takes_no_input() -> None:
    await assert_rejected_for_its_cell_only(frame("input", {"prompt": "", "password": False, "path": "/tmp/x"}))


async def test_a_frame_that_is_not_a_kind_payload_pair() -> None:
    await assert_rejected_for_its_cell_only(raw(lambda token: f'{MARK}{token} . {{"kind": 1}}\n'))


# -- the debugger (docs/debugger.md) --------------------------------------------------


def dap(message: dict[str, Any], answers: int | None = None) -> Any:
    return frame("debug", {"message": message} if answers is None else {"message": message, "answers": answers})


async def test_a_debug_request_from_the_sandbox_is_refused() -> None:  # DAP's reverse requests (runInTerminal ...)
    await assert_rejected_for_its_cell_only(
        dap({"type": "request", "seq": 1, "command": "runInTerminal", "arguments": {"args": ["sh"]}})
    )


async def test_a_debug_response_that_answers_nothing_is_refused() -> None:
    await assert_rejected_for_its_cell_only(dap({"type": "response", "seq": 1, "command": "source", "success": True}))


async def test_a_debug_reply_with_a_mistyped_field_is_refused() -> None:
    await assert_rejected_for_its_cell_only(dap({"type": "response", "command": "source", "success": "yes"}, answers=1))


async def test_a_debug_event_that_claims_to_answer_a_request_is_refused() -> None:
    await assert_rejected_for_its_cell_only(dap({"type": "event", "seq": 1, "event": "stopped", "body": {}}, answers=1))


async def test_a_debug_event_whose_body_is_not_an_object_is_refused() -> None:
    await assert_rejected_for_its_cell_only(dap({"type": "event", "seq": 1, "event": "output", "body": "rm -rf ~"}))


async def test_an_oversized_debug_message_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from daytona_kernel import protocol

    monkeypatch.setattr(protocol, "MAX_DAP_CHARS", 1000)
    await assert_rejected_for_its_cell_only(dap({"type": "event", "seq": 1, "event": "output", "body": {"output": "x" * 2000}}))


async def test_a_debug_reply_nobody_waits_for_is_dropped_and_events_reach_the_frontend() -> None:
    session = SandboxSession(
        FakeSandbox(
            [
                Run(
                    [
                        "before\n",
                        dap({"type": "response", "command": "source", "success": True}, answers=7),
                        dap({"type": "event", "seq": 2, "event": "stopped", "body": {"threadId": 1}}),
                        "after\n",
                    ]
                )
            ]
        ),
        SessionSettings(),
        LOG,
        MirrorSpy(),
    )  # type: ignore[arg-type]
    events: list[dict[str, Any]] = []
    session.debugger.publish = events.append
    front = Recorder()
    outcome = await session.execute(Cell("cell", 1), front)
    assert outcome.error is None and front.text() == "before\nafter\n"
    assert events == [{"type": "event", "seq": 2, "event": "stopped", "body": {"threadId": 1}}]


async def test_a_rich_inspection_passes_the_output_policy_and_the_kernel_reads_no_file() -> None:
    reply = {
        "type": "response",
        "seq": 1,
        "request_seq": 1,
        "command": "richInspectVariables",
        "success": True,
        "body": {"data": {"text/html": "<b>x</b><script>steal()</script>", "text/plain": "x"}, "metadata": {}},
    }
    sandbox = FakeSandbox([Run([dap(reply, answers=1)])])
    session = SandboxSession(sandbox, SessionSettings(), LOG, MirrorSpy())  # type: ignore[arg-type]
    got = await session.debugger.request(
        {"type": "request", "seq": 1, "command": "richInspectVariables", "arguments": {"variableName": "x"}}
    )
    assert got["success"] and got["body"]["data"]["text/plain"] == "x"
    assert "script" not in got["body"]["data"]["text/html"] and "<b>x</b>" in got["body"]["data"]["text/html"]
    assert sandbox.download_limits == [] and sandbox.uploads == []


async def test_a_debug_request_the_sandbox_does_not_answer_gets_a_failed_reply_at_once() -> None:
    session = SandboxSession(FakeSandbox([Run(["nothing\n"])]), SessionSettings(), LOG, MirrorSpy())  # type: ignore[arg-type]
    got = await session.debugger.request({"type": "request", "seq": 5, "command": "stackTrace", "arguments": {"threadId": 1}})
    assert got == {
        "type": "response",
        "seq": 5,
        "request_seq": 5,
        "success": False,
        "command": "stackTrace",
        "message": "the sandbox's debugger sent no usable reply (the kernel log says why)",
    }


# -- size and depth ----------------------------------------------------------------


async def test_json_nested_200000_deep() -> None:
    body = '["display",' + "[" * 200_000 + "]" * 200_000 + "]"
    pieces = [body[i : i + PIECE_CHARS] for i in range(0, len(body), PIECE_CHARS)]
    lines = "".join(f"{MARK}{{t}} + {p}\n" for p in pieces[:-1]) + f"{MARK}{{t}} . {pieces[-1]}\n"
    await assert_rejected_for_its_cell_only(raw(lambda token: lines.replace("{t}", token)))


async def test_json_nested_deeper_than_any_output_needs() -> None:
    nested: Any = "x"
    for _ in range(500):
        nested = [nested]
    await assert_rejected_for_its_cell_only(frame("display", {"data": {"application/json": nested}}))


async def test_an_oversized_payload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(framing, "MAX_PAYLOAD_CHARS", 4 * PIECE_CHARS)
    big = {"data": {"text/plain": "A" * (6 * PIECE_CHARS)}}
    await assert_rejected_for_its_cell_only(frame("display", big))


# -- large strings in a file (framing's split_blobs) ------------------------------------


def blob_frame(payload: dict[str, Any], path: str, sizes: list[Any]) -> Any:
    return raw(lambda token: "".join(encode_frame(token, "display", payload, blobs={"path": path, "sizes": sizes})))


async def test_a_file_of_large_strings_is_fetched_and_later_output_waits_for_it() -> None:
    png = "iVBOR" * 100_000
    sandbox = FakeSandbox(
        [
            Run(
                [
                    "before\n",
                    blob_frame(
                        {"data": {"image/png": "", "text/plain": "img"}}, "/tmp/out-0", [[["data", "image/png"], len(png)]]
                    ),
                    "after\n",
                    frame("display", {"data": {"text/plain": "next"}}),
                ]
            )
        ]
    )
    sandbox.files["/tmp/out-0"] = png.encode()
    session = SandboxSession(sandbox, SessionSettings(), LOG, MirrorSpy())  # type: ignore[arg-type]
    front = Recorder()
    outcome = await session.execute(Cell("cell", 1), front)
    assert outcome.error is None, outcome.error
    assert [
        (kind, content.get("text") or content["data"].get("image/png") or content["data"]["text/plain"])
        for kind, content in front.outputs
    ] == [("stream", "before\n"), ("display_data", png), ("stream", "after\n"), ("display_data", "next")]


async def test_a_file_of_large_strings_that_is_not_there() -> None:
    await assert_rejected_for_its_cell_only(blob_frame({"data": {"image/png": ""}}, "/tmp/gone", [[["data", "image/png"], 10]]))


async def test_a_file_of_large_strings_that_does_not_fit_its_frame() -> None:
    sandbox = FakeSandbox(
        [Run(["before\n", blob_frame({"data": {"image/png": ""}}, "/etc/passwd", [[["data", "image/png"], 5]]), "after\n"])]
    )
    sandbox.files["/etc/passwd"] = b"root:x:0:0"
    session = SandboxSession(sandbox, SessionSettings(), LOG, MirrorSpy())  # type: ignore[arg-type]
    front = Recorder()
    outcome = await session.execute(Cell("cell", 1), front)
    assert outcome.error is not None and outcome.error["ename"] == PROTOCOL_ERROR
    assert "more than 5 bytes" in outcome.error["evalue"]
    assert front.text() == "before\nafter\n" and "root" not in str(front.outputs)
    # the download itself is bounded by what the frame announced: the kernel never holds more
    assert sandbox.download_limits == [{"/etc/passwd": 5}]


async def test_a_file_of_large_strings_larger_than_any_frame() -> None:
    await assert_rejected_for_its_cell_only(blob_frame({"data": {"image/png": ""}}, "/tmp/x", [[["data", "image/png"], 2**40]]))


def hang_under(folder: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[str]]:
    """From now on an ``os.open`` that reaches into ``folder`` hangs, as on a network file system that stopped
    answering, until the returned event is set (or 2 s pass); the list gets what was opened while it hung."""
    released, hung = threading.Event(), []
    real_open, far = os.open, str(folder.resolve())

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        where = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path) if dir_fd is not None else os.fspath(path)
        parent, name = os.path.split(where)
        real = os.path.join(os.path.realpath(parent), name) if flags & os.O_NOFOLLOW else os.path.realpath(where)
        if (real == far or real.startswith(far + os.sep)) and not released.wait(2):
            hung.append(where)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_)
    return released, hung


@pytest.mark.parametrize("how", ["elsewhere", "through a symlink in the temporary folder", "up out of the temporary folder"])
async def test_a_forged_file_of_large_strings_is_never_read_on_the_event_loop(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forged frame can name any file for the kernel to fetch. On the local backend the runtime's own files
    (its private folder in the sandbox's temporary folder) are read in the event loop, any other file in a
    thread: one on a network file system that hangs must not stop the kernel (review4 N9)."""
    config = DaytonaKernelConfig(backend="local", sandbox_policy="ephemeral")
    sandbox = LocalSandbox(settings_from(LocalSettings, config), "n9-" + tmp_path.name)
    await sandbox.start(lambda _: None)
    try:
        far = tmp_path / "nfs"
        far.mkdir()
        (far / "out-0").write_bytes(b"secret")
        if how == "elsewhere":
            path = str(far / "out-0")
        elif how.startswith("through"):
            (Path(sandbox.temp_dir) / "daytona-kernel-inbox-1-abc").symlink_to(far)
            path = os.path.join(sandbox.temp_dir, "daytona-kernel-inbox-1-abc", "out-0")
        else:
            path = os.path.join(sandbox.temp_dir, os.path.relpath(far, sandbox.temp_dir), "out-0")
        released, hung = hang_under(far, monkeypatch)
        asyncio.get_running_loop().call_soon(released.set)  # runs only if the read leaves the event loop free
        assert await sandbox.toolbox.download([path], {path: 6}) == {path: b"secret"}
        assert hung == []
    finally:
        await sandbox.shutdown()


async def test_the_runtimes_own_file_of_large_strings_is_read_in_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime's files were written moments ago (page cache): a hop to a thread and back costs more than the read."""
    config = DaytonaKernelConfig(backend="local", sandbox_policy="ephemeral")
    sandbox = LocalSandbox(settings_from(LocalSettings, config), "own-" + tmp_path.name)
    await sandbox.start(lambda _: None)
    try:
        private = Path(sandbox.temp_dir) / "daytona-kernel-inbox-1-abc"
        private.mkdir()
        (private / "out-0").write_bytes(b"x" * 1000)

        def no_thread(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("read in a thread")

        monkeypatch.setattr(asyncio, "to_thread", no_thread)
        path = str(private / "out-0")
        assert await sandbox.toolbox.download([path], {path: 1000}) == {path: b"x" * 1000}
    finally:
        await sandbox.shutdown()


def test_an_overlong_frame_line_is_dropped_as_soon_as_it_passes_the_limit() -> None:
    dec = FrameDecoder("tok")
    events = dec.feed(MARK + "tok . " + "x" * 1000)
    chunk = "y" * 4096
    for _ in range(PIECE_CHARS // len(chunk) + 1):  # no newline yet: nothing is held back for a re-scan
        events += dec.feed(chunk)
    assert events == [BadFrame(f"a frame line is over {PIECE_CHARS + 2} characters")]
    assert dec.feed("z" * 10_000 + "\nplain\n") == [Text("plain\n")]


def test_a_frame_cut_off_at_the_end_of_the_run_never_shows_the_token() -> None:
    dec = FrameDecoder("secret-token")
    events = dec.feed("ok\n" + MARK + 'secret-token . ["display", {')
    events += dec.flush()
    assert events[0] == Text("ok\n") and isinstance(events[1], BadFrame)
    assert "secret-token" not in repr(events)


# -- the record separator in ordinary output (issue 12.5) ----------------------------


async def test_a_lone_record_separator_does_not_swallow_the_error() -> None:
    error = {"ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": []}
    ((outcome, front),) = await run_cells(Run(["data\x1e", frame("error", error)]))
    assert outcome.error == error
    assert front.text() == "data\x1e"


async def test_a_lone_record_separator_does_not_swallow_the_next_display() -> None:
    ((outcome, front),) = await run_cells(Run(["a\x1e", frame("display", {"data": {"text/plain": "shown"}}), "b\n"]))
    assert outcome.error is None
    assert front.of_type("display_data") == [{"data": {"text/plain": "shown"}, "metadata": {}, "transient": {}}]
    assert front.text() == "a\x1eb\n"


def test_a_record_separator_right_before_a_frame_header_split_across_chunks() -> None:
    stream = "x\x1e\x1e" + "".join(encode_frame("tok", "clear", {"wait": True}))
    for cut in range(len(stream)):
        dec = FrameDecoder("tok")
        events = dec.feed(stream[:cut]) + dec.feed(stream[cut:]) + dec.flush()
        texts = "".join(e.text for e in events if isinstance(e, Text))
        assert texts == "x\x1e\x1e" and events[-1] == framing.Frame("clear", {"wait": True}), cut


# -- end to end, on both backends ------------------------------------------------------

FORGE = "import sys\nrt = sys.modules['_daytona_kernel_runtime'].current\n"


@pytest.mark.slow
def test_end_to_end_a_lone_record_separator_keeps_the_error(kernel_name: str, tmp_path: Any) -> None:
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        run = k.execute("import sys\nsys.stdout.write('data\\x1e')\n1/0")
        assert run.status == "error" and run.reply["content"]["ename"] == "ZeroDivisionError"
        assert run.text() == "data\x1e" and "DKF" not in run.text()


@pytest.mark.slow
def test_end_to_end_forged_frames_fail_only_their_own_cell(kernel_name: str, tmp_path: Any) -> None:
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        forged = k.execute(FORGE + "rt.send('files', 'oops')\nrt.send('result', {})\nrt.send('error', 'x')\nprint('end')")
        assert forged.status == "error" and forged.reply["content"]["ename"] == PROTOCOL_ERROR
        assert "end\n" in forged.text()
        after = k.execute("print(6 * 7)")
        assert after.status == "ok" and after.text() == "42\n" and not after.errors
