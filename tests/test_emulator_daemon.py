"""The emulator's interpreter behaves like the Daytona daemon's, traps included.

These tests talk to the emulator the way a client of Daytona does (the
unmodified SDK, or a raw websocket where the SDK hides the detail) and pin each
behaviour of the daemon (apps/daemon/pkg/toolbox/process/, v0.190.0). The worker here is bare, without our
runtime: that is what the daemon gives every client. The same worker driver runs
the local backend; its traps are pinned in-process at the end of this file.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams, DaytonaConfig
from daytona.common.errors import DaytonaConnectionError, DaytonaTimeoutError

from daytona_kernel.backends.local.interpreter import LocalContext
from daytona_kernel.errors import ContextDied, ContextTimeout

KIB = 1024
MIB = 1024 * 1024


@pytest.fixture
async def sandbox(emulator) -> AsyncIterator[Any]:  # type: ignore[no-untyped-def]
    config = DaytonaConfig(api_key=emulator.api_key, api_url=emulator.api_url, target="us")
    async with AsyncDaytona(config) as client:
        sb = await client.create(CreateSandboxFromSnapshotParams())
        try:
            yield sb
        finally:
            await sb.delete()


@pytest.fixture
async def context(sandbox):  # type: ignore[no-untyped-def]
    return await sandbox.code_interpreter.create_context()


async def run(sandbox, context, code: str, **kwargs: Any):  # type: ignore[no-untyped-def]
    return await sandbox.code_interpreter.run_code(code, context=context, **kwargs)


async def pid_of(sandbox, context) -> int:  # type: ignore[no-untyped-def]
    return int((await run(sandbox, context, "import os\nprint(os.getpid())")).stdout)


async def signal_later(sandbox, pid: int, signal_name: str, delay_s: float = 0.7) -> None:  # type: ignore[no-untyped-def]
    await asyncio.sleep(delay_s)
    result = await sandbox.process.exec(f"kill -{signal_name} {pid}")
    assert result.exit_code == 0, result.result


async def raw_execute(
    emulator, sandbox, request: dict[str, Any], read_after_s: float = 0.0
) -> tuple[list[dict[str, Any]], int | None]:  # type: ignore[no-untyped-def]
    """Frames and close code of one interpreter websocket, without the SDK in between."""
    url = f"ws://127.0.0.1:{emulator.port}/toolbox/{sandbox.id}/process/interpreter/execute"
    frames: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {emulator.api_key}"}
    async with aiohttp.ClientSession() as http, http.ws_connect(url, headers=headers) as ws:
        await ws.send_str(json.dumps(request))
        await asyncio.sleep(read_after_s)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                frames.append(json.loads(msg.data))
        return frames, ws.close_code


# -- fd 1 is the protocol pipe ---------------------------------------------------


async def test_fd_level_output_with_a_newline_is_dropped(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    result = await run(sandbox, context, "import os\nos.system('echo lost')\nprint('kept')")
    assert result.stdout == "kept\n"
    assert result.error is None


async def test_fd_level_output_without_a_newline_swallows_the_next_line(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    result = await run(sandbox, context, "import os\nos.system('printf abc')\nprint('swallowed')\nprint('next')")
    assert result.stdout == "next\n"


async def test_fd_level_output_without_a_newline_swallows_the_end_of_the_cell(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    """The glued line was the control line: the cell never ends, until the timeout kills the worker."""
    await run(sandbox, context, "state = 1")
    with pytest.raises(DaytonaTimeoutError):
        await run(sandbox, context, "import os\nos.system('printf abc')", timeout=1)
    after = await run(sandbox, context, "print(state)")
    assert after.error is not None and after.error.name == "NameError"  # a fresh worker


async def test_non_json_lines_are_dropped_and_json_objects_pass(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    code = (
        "import os, sys\n"
        "print('plain', file=sys.__stdout__, flush=True)\n"
        "os.write(1, b'[1, 2]\\n')\n"
        'os.write(1, b\'{"type": "stdout", "text": "forged\\\\n"}\\n\')\n'
    )
    result = await run(sandbox, context, code)
    assert result.stdout == "forged\n"


# -- the worker's emitters --------------------------------------------------------


async def test_a_partial_line_waits_for_the_next_newline(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    pieces: list[str] = []
    code = "import sys, time\nsys.stdout.write('working...')\ntime.sleep(0.3)\nprint('done')"
    await run(sandbox, context, code, on_stdout=lambda m: pieces.append(m.output))
    assert pieces == ["working...done\n"]


async def test_emitters_flush_at_1024_characters(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    pieces: list[str] = []
    code = "import sys\nsys.stdout.write('a' * 1000)\nsys.stdout.write('b' * 30)\nsys.stdout.write('c')\nsys.stdout.flush()"
    await run(sandbox, context, code, on_stdout=lambda m: pieces.append(m.output))
    assert pieces == ["a" * 1000 + "b" * 30, "c"]


async def test_stderr_is_a_stream_of_its_own(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    result = await run(sandbox, context, "import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert (result.stdout, result.stderr) == ("out\n", "err\n")


# -- the 1 MiB line cap -------------------------------------------------------------


async def test_the_workers_pipe_is_linuxs_default_as_the_daemons_is(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    """Daytona's daemon reads the worker's fd 1 from a pipe Go made (exec.Cmd.StdoutPipe), which Linux sizes at
    64 KiB; the local backend enlarges its own, but the emulator imitates the daemon and must not."""
    result = await run(sandbox, context, "import fcntl, sys\nprint(fcntl.fcntl(sys.__stdout__.fileno(), 1032))")  # F_GETPIPE_SZ
    assert result.stdout == "65536\n"


async def test_a_line_just_under_1_mib_arrives(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    result = await run(sandbox, context, "print('a' * 1_000_000)")
    assert result.stdout == "a" * 1_000_000 + "\n"


async def test_a_line_of_1_mib_stops_the_reader_until_the_worker_is_replaced(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    await run(sandbox, context, "state = 1")
    with pytest.raises(DaytonaTimeoutError):
        await run(sandbox, context, "print('a' * (1024 * 1024))\nprint('never read')", timeout=1)
    after = await run(sandbox, context, "print('read again')\nprint(state)")
    assert after.stdout == "read again\n"
    assert after.error is not None and after.error.name == "NameError"


async def test_non_ascii_counts_six_bytes_a_character_towards_the_cap(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    """200,000 characters, but 1.2 MB of JSON: over the cap."""
    with pytest.raises(DaytonaTimeoutError):
        await run(sandbox, context, "print('\\u00e9' * 200_000)", timeout=1)


# -- errors, exits, environment -----------------------------------------------------


async def test_error_traceback_names_only_stdin_lines(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    result = await run(sandbox, context, "x = 1\n1/0")
    assert result.error is not None
    assert result.error.name == "ZeroDivisionError" and result.error.value == "division by zero"
    assert (
        result.error.traceback
        == 'Traceback (most recent call last):\n  File "<stdin>", line 2\nZeroDivisionError: division by zero\n'
    )


async def test_system_exit_is_a_normal_completion(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    result = await run(sandbox, context, "import sys\nprint('bye')\nsys.exit(3)")
    assert (result.stdout, result.error) == ("bye\n", None)
    assert (await run(sandbox, context, "print('still here')")).stdout == "still here\n"


async def test_request_env_vars_are_restored_after_the_request(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    code = "import os\nprint(os.environ.get('DK_TEST_VAR'))"
    assert (await run(sandbox, context, code, envs={"DK_TEST_VAR": "set"})).stdout == "set\n"
    assert (await run(sandbox, context, code)).stdout == "None\n"


# -- SIGINT, timeouts, dying workers ------------------------------------------------


async def test_sigint_that_escapes_the_code_is_a_timeout_close_and_keeps_state(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    await run(sandbox, context, "kept = 'yes'")
    pid = await pid_of(sandbox, context)
    with pytest.raises(DaytonaTimeoutError):
        await asyncio.gather(run(sandbox, context, "import time\ntime.sleep(30)"), signal_later(sandbox, pid, "INT"))
    assert (await run(sandbox, context, "print(kept)")).stdout == "yes\n"


async def test_sigint_caught_by_the_code_is_a_normal_completion(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    pid = await pid_of(sandbox, context)
    code = "import time\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    print('caught')"
    result, _ = await asyncio.gather(run(sandbox, context, code), signal_later(sandbox, pid, "INT"))
    assert (result.stdout, result.error) == ("caught\n", None)


async def test_timeout_sends_sigint_and_a_yielding_cell_keeps_its_state(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    await run(sandbox, context, "kept = 'yes'")
    with pytest.raises(DaytonaTimeoutError):
        await run(sandbox, context, "import time\ntime.sleep(30)", timeout=1)
    assert (await run(sandbox, context, "print(kept)")).stdout == "yes\n"


async def test_timeout_kills_a_cell_that_ignores_sigint_and_a_fresh_worker_follows(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    await run(sandbox, context, "lost = 1")
    before = await pid_of(sandbox, context)
    code = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass"
    with pytest.raises(DaytonaTimeoutError):
        await run(sandbox, context, code, timeout=1)
    assert await pid_of(sandbox, context) != before
    assert (await run(sandbox, context, "lost")).error.name == "NameError"


async def test_a_worker_killed_between_cells_is_replaced_silently(sandbox, context) -> None:  # type: ignore[no-untyped-def]
    await run(sandbox, context, "lost = 1")
    pid = await pid_of(sandbox, context)
    await signal_later(sandbox, pid, "KILL", 0)
    await asyncio.sleep(0.2)
    listed = {c.id: c.active for c in await sandbox.code_interpreter.list_contexts()}
    assert listed[context.id] is False
    result = await run(sandbox, context, "print('fresh')\nlost")
    assert result.stdout == "fresh\n"
    assert result.error is not None and result.error.name == "NameError"  # nothing says it was replaced


async def test_a_worker_exiting_mid_cell_closes_with_1001(emulator, sandbox, context) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DaytonaConnectionError, match="1001"):
        await run(sandbox, context, "import os\nos._exit(0)")
    _, code = await raw_execute(emulator, sandbox, {"code": "import os\nos._exit(3)", "contextId": context.id, "timeout": 0})
    assert code == 1001


# -- the websocket ---------------------------------------------------------------------


async def test_frames_carry_all_fields_and_control_frames_reach_the_client(emulator, sandbox, context) -> None:  # type: ignore[no-untyped-def]
    frames, code = await raw_execute(emulator, sandbox, {"code": "print('hi')", "contextId": context.id, "timeout": 0})
    assert code == 1000
    assert frames == [
        {"type": "stdout", "text": "hi\n", "name": "", "value": "", "traceback": ""},
        {"type": "control", "text": "completed", "name": "", "value": "", "traceback": ""},
    ]


@pytest.mark.parametrize(
    ("request_fields", "close_code"),
    [
        ({"code": "1", "contextId": "no-such-context"}, 1008),
        ({"code": ""}, 1008),
        ({"code": "1", "timeout": -1}, 1008),
        ({"code": "1", "timeout": 0.5}, 1002),  # Go reads "timeout" as an integer
        ({"code": "1", "envs": {"A": 1}}, 1002),
    ],
)
async def test_bad_requests_are_refused_with_the_daemons_close_codes(emulator, sandbox, request_fields, close_code) -> None:  # type: ignore[no-untyped-def]
    frames, code = await raw_execute(emulator, sandbox, request_fields)
    assert (frames, code) == ([], close_code)


async def test_no_context_id_runs_in_the_default_context(sandbox) -> None:  # type: ignore[no-untyped-def]
    await sandbox.code_interpreter.run_code("shared = 'default'")
    assert (await sandbox.code_interpreter.run_code("print(shared)")).stdout == "default\n"
    assert [c.id for c in await sandbox.code_interpreter.list_contexts()] == []


async def test_a_client_1024_frames_behind_is_dropped_and_the_cell_goes_on(emulator, sandbox, context) -> None:  # type: ignore[no-untyped-def]
    code = "for i in range(3000):\n    print('x' * 10000)\ndone = True"
    request = {"code": code, "contextId": context.id, "timeout": 0}
    frames, close = await raw_execute(emulator, sandbox, request, read_after_s=3.0)
    assert len(frames) < 3000
    assert close not in (1000, None) or frames[-1]["type"] != "control"
    for _ in range(50):  # closing the socket does not stop the code
        result = await run(sandbox, context, "print(globals().get('done'))")
        if result.stdout == "True\n":
            break
        await asyncio.sleep(0.2)
    assert result.stdout == "True\n"


async def test_a_sandbox_stopped_mid_cell_drops_the_socket(emulator, sandbox, context) -> None:  # type: ignore[no-untyped-def]
    async def stop_soon() -> None:
        await asyncio.sleep(0.7)
        await asyncio.get_running_loop().run_in_executor(None, emulator.stop_sandbox, sandbox.id)

    request = {"code": "import time\ntime.sleep(30)", "contextId": context.id, "timeout": 0}
    (_, close), _ = await asyncio.gather(raw_execute(emulator, sandbox, request), stop_soon())
    assert close not in (1000, 1001, 4008)


async def test_a_client_close_is_answered_once_its_job_runs_not_while_it_waits(emulator, sandbox, context) -> None:  # type: ignore[no-untyped-def]
    """websocket.go (v0.190.0): attachWebSocket starts a reader when the job leaves the queue; before, nothing
    reads the socket, so a client's close waits for an answer that does not come (aiohttp then reports 1006)."""
    url = f"ws://127.0.0.1:{emulator.port}/toolbox/{sandbox.id}/process/interpreter/execute"
    headers = {"Authorization": f"Bearer {emulator.api_key}"}
    quick_close = aiohttp.ClientWSTimeout(ws_close=1.0)
    async with aiohttp.ClientSession() as http:
        running = await http.ws_connect(url, headers=headers, timeout=quick_close)
        await running.send_str(
            json.dumps({"code": "print('on', flush=True)\nimport time\ntime.sleep(3)", "contextId": context.id})
        )
        assert json.loads((await running.receive()).data)["text"] == "on\n"  # its job runs
        waiting = await http.ws_connect(url, headers=headers, timeout=quick_close)
        await waiting.send_str(json.dumps({"code": "queued = 1", "contextId": context.id}))
        await waiting.close()
        assert waiting.close_code == 1006  # not answered: its job still waits behind the running one
        await running.close()
        assert running.close_code == 1000  # answered by the reader of the attached job


# -- process execute (apps/daemon/pkg/toolbox/process/execute.go) ---------------------


async def test_process_exec_feeds_the_command_to_the_shell_on_stdin(sandbox) -> None:  # type: ignore[no-untyped-def]
    result = await sandbox.process.exec("cat\necho never run")  # a child that reads stdin eats the rest
    assert (result.exit_code, result.result) == (0, "echo never run")
    result = await sandbox.process.exec("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.result) == (3, "out\nerr\n")  # combined


async def test_process_exec_timeout_kills_the_process_group_and_is_a_408(sandbox) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DaytonaTimeoutError) as timed_out:
        await sandbox.process.exec("sleep 60 & echo $! > child.pid; wait", timeout=1)
    assert getattr(timed_out.value, "status_code", None) == 408
    child = int((await sandbox.process.exec("cat child.pid")).result)
    for _ in range(50):  # SIGKILL is delivered at once; reaping may lag a little
        if not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z":
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"the background child {child} outlived the timeout")


async def test_process_exec_in_a_missing_folder_is_exit_code_minus_one(sandbox) -> None:  # type: ignore[no-untyped-def]
    result = await sandbox.process.exec("echo hi", cwd="/home/daytona/no/such/folder")
    assert result.exit_code == -1
    assert "no such file or directory" in result.result


# -- the local backend's worker shows the same traps ----------------------------------


@pytest.fixture
async def local(tmp_path) -> AsyncIterator[LocalContext]:  # type: ignore[no-untyped-def]
    ctx = await LocalContext.spawn(sys.executable, str(tmp_path), dict(os.environ))
    yield ctx
    await ctx.close()


async def local_run(ctx: LocalContext, code: str, timeout: float | None = None) -> tuple[str, str, Any]:
    out: list[str] = []
    err: list[str] = []
    error = await ctx.run_code(code, out.append, err.append, timeout)
    return "".join(out), "".join(err), error


async def test_local_worker_drops_fd_output_and_loses_the_end_of_the_cell(local) -> None:  # type: ignore[no-untyped-def]
    assert (await local_run(local, "import os\nos.system('echo lost')\nprint('kept')"))[0] == "kept\n"
    await local_run(local, "state = 1")
    with pytest.raises(ContextTimeout):
        await local_run(local, "import os\nos.system('printf abc')", timeout=0.5)
    error = (await local_run(local, "state"))[2]
    assert error.name == "NameError"  # the worker was killed and silently replaced


async def test_local_worker_flushes_at_newlines_and_1024_characters(local) -> None:  # type: ignore[no-untyped-def]
    pieces: list[str] = []
    code = "import sys, time\nsys.stdout.write('a' * 1030)\nsys.stdout.write('partial')\ntime.sleep(0.2)\nprint('!')"
    await local.run_code(code, pieces.append, pieces.append)
    assert pieces == ["a" * 1030, "partial!\n"]


async def test_local_worker_reader_stops_at_a_1_mib_line(local) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ContextTimeout):
        await local_run(local, "print('a' * (1024 * 1024))", timeout=0.5)
    assert (await local_run(local, "print('back')"))[0] == "back\n"


async def test_local_worker_sigint_escaping_is_a_timeout_and_caught_is_normal(local) -> None:  # type: ignore[no-untyped-def]
    await local_run(local, "kept = 'yes'")
    with pytest.raises(ContextTimeout):
        await local_run(local, "import time\ntime.sleep(30)", timeout=0.5)
    code = "import time\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    print('caught')"
    assert await local_run(local, code, timeout=0.5) == ("caught\n", "", None)
    assert (await local_run(local, "print(kept)"))[0] == "yes\n"


async def test_local_worker_exit_mid_cell_and_between_cells(local) -> None:  # type: ignore[no-untyped-def]
    await local_run(local, "lost = 1")
    with pytest.raises(ContextDied):
        await local_run(local, "import os\nos._exit(0)")
    out, _, error = await local_run(local, "print('fresh')\nlost")
    assert out == "fresh\n" and error.name == "NameError"
    pid = int((await local_run(local, "import os\nprint(os.getpid())"))[0])
    os.kill(pid, 9)
    await asyncio.sleep(0.2)
    assert (await local_run(local, f"import os\nprint(os.getpid() != {pid})"))[0] == "True\n"


async def test_local_worker_system_exit_and_error_format(local) -> None:  # type: ignore[no-untyped-def]
    assert await local_run(local, "import sys\nsys.exit(1)") == ("", "", None)
    error = (await local_run(local, "\n1/0"))[2]
    assert (
        error.traceback == 'Traceback (most recent call last):\n  File "<stdin>", line 2\nZeroDivisionError: division by zero\n'
    )


@pytest.mark.parametrize(
    ("line", "chunk"),
    [
        (b'{"type": "stdout", "text": "hi\\n"}', {"type": "stdout", "text": "hi\n"}),
        (b'{"type": "stdout", "text": "hi"}\r', {"type": "stdout", "text": "hi"}),  # ScanLines drops a final \r
        (b"null", {}),
        (b"[1, 2]", None),
        (b'"text"', None),
        (b"plain", None),
        (b'{"type": "stdout", "text": 5, "name": null, "value": ["x"]}', {"type": "stdout", "text": ""}),
        (b'{"type": "stdout", "text": "a", "text": "b"}', {"type": "stdout", "text": "b"}),  # the last one wins
        (b'{"type": "stdout", "text": "bad \xff utf-8"}', {"type": "stdout", "text": "bad \ufffd utf-8"}),
        # Go's decoder reads a lone surrogate escape as U+FFFD (a pair is one character), and refuses NaN
        (
            b'{"type": "stdout", "text": "lone \\ud800 \\udfff pair \\ud83d\\ude00"}',
            {"type": "stdout", "text": "lone \ufffd \ufffd pair \U0001f600"},
        ),
        (b'{"type": "stdout", "text": "x", "n": NaN}', None),
        (b'{"type": "stdout", "text": "x", "n": -Infinity}', None),
        (b'{"type": "stdout", "text": "x", "big": 123456789012345678901234567890}', {"type": "stdout", "text": "x"}),
        (b'{"type": "stdout"} trailing', None),
        # nested past any parser's depth: dropped (Go's limit is 10,000), never an exception that stops the reader
        (b'{"type": "stdout", "text": "x", "a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
        (b"[" * 100_000, None),
    ],
)
def test_a_worker_line_is_read_as_the_daemon_reads_it(line: bytes, chunk: dict[str, str] | None) -> None:
    from daytona_kernel.backends.local.interpreter import STREAM_FIELDS, parse_chunk

    expected = None if chunk is None else {key: chunk.get(key, "") for key in STREAM_FIELDS}
    assert parse_chunk(line) == expected
    assert parse_chunk(bytearray(line)) == expected
