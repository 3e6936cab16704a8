"""The debugger (docs/debugger.md) through jupyter_client, as JupyterLab drives it, on both backends,
next to stock ipykernel (kernel ``python3``) doing the same: a breakpoint in a cell stops it, the stack,
scopes and variables show the cell's values, a step and a continue go on, and ``richInspectVariables``,
``copyToGlobals`` and ``inspectVariables`` answer as ipykernel's do."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from daytona_emulator import DaytonaEmulator
from kernels import Kernel

TIMEOUT_S = 60
INITIALIZE = {  # what JupyterLab's debugger sends
    "clientID": "jupyterlab",
    "clientName": "JupyterLab",
    "adapterID": "python",
    "pathFormat": "path",
    "linesStartAt1": True,
    "columnsStartAt1": True,
    "supportsVariableType": True,
    "supportsVariablePaging": True,
    "supportsRunInTerminalRequest": True,
    "locale": "en",
}
CELL = "def f(a, b):\n    c = a + b\n    return c\n\nprint('before')\nf(2, 3)\nprint('after')\n"


class Debugging:
    """debug_request on the control channel, its debug_reply, and the debug_events on iopub."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.seq = 0

    def __call__(self, command: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        self.seq += 1
        kc = self.kernel.kc
        msg = kc.session.msg(
            "debug_request", {"type": "request", "seq": self.seq, "command": command, "arguments": arguments or {}}
        )
        kc.control_channel.send(msg)
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                reply = kc.control_channel.get_msg(timeout=0.1)
            except Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                assert reply["msg_type"] == "debug_reply"
                return dict(reply["content"])
        raise TimeoutError(f"no debug_reply to {command} within {TIMEOUT_S} s")

    def until_running(self) -> bool:
        """Whether debugInfo comes to list no stopped thread after a continue (ipykernel's list is updated when
        its ``continued`` event has been handled, which may come after the cell's idle)."""
        deadline = time.monotonic() + TIMEOUT_S
        while self("debugInfo")["body"]["stoppedThreads"]:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def event(self, name: str) -> dict[str, Any]:
        msg = self.kernel.wait_for(lambda m: m["msg_type"] == "debug_event" and m["content"].get("event") == name)
        return dict(msg["content"])


def session(name: str, **launch: Any) -> dict[str, Any]:
    """One debugging session as JupyterLab has it, and what each step showed (paths and ids left out)."""
    seen: dict[str, Any] = {}
    with Kernel(name, **launch) as kernel:
        kernel.execute("pass")
        seen["features"] = "debugger" in kernel.request("kernel_info")["supported_features"]
        debug = Debugging(kernel)
        seen["initialize"] = debug("initialize", INITIALIZE)["success"]
        seen["attach"] = debug("attach")["success"]
        modules = debug("modules")  # ipykernel answers with a bare body, which JupyterLab waits for
        seen["modules"] = (sorted(modules), any(m["name"] == "json" for m in modules["body"]["modules"]))
        info = debug("debugInfo")["body"]
        seen["debugInfo"] = {k: v for k, v in info.items() if k != "tmpFilePrefix"}
        path = debug("dumpCell", {"code": CELL})["body"]["sourcePath"]
        seen["cell file"] = path.startswith(info["tmpFilePrefix"]) and path.endswith(".py")
        breakpoints = debug("setBreakpoints", {"breakpoints": [{"line": 2}], "source": {"path": path}, "sourceModified": False})
        seen["breakpoints"] = [(b["verified"], b["line"]) for b in breakpoints["body"]["breakpoints"]]
        seen["configurationDone"] = debug("configurationDone")["success"]
        run = kernel.kc.execute(CELL)
        stopped = debug.event("stopped")["body"]
        seen["stopped"] = (stopped["reason"], stopped["allThreadsStopped"])
        thread = stopped["threadId"]
        seen["stoppedThreads"] = thread in debug("debugInfo")["body"]["stoppedThreads"]
        frames = debug("stackTrace", {"threadId": thread})["body"]["stackFrames"]
        seen["stack"] = [(f["name"], f["line"], f["source"]["path"] == path) for f in frames]
        scopes = debug("scopes", {"frameId": frames[0]["id"]})["body"]["scopes"]
        seen["scopes"] = [s["name"] for s in scopes]
        local = next(s for s in scopes if s["name"] == "Locals")["variablesReference"]
        seen["locals"] = [
            (v["name"], v["value"], v["type"]) for v in debug("variables", {"variablesReference": local})["body"]["variables"]
        ]
        seen["next"] = debug("next", {"threadId": thread})["success"]
        seen["stepped"] = debug.event("stopped")["body"]["reason"]
        frames = debug("stackTrace", {"threadId": thread})["body"]["stackFrames"]
        seen["line after step"] = frames[0]["line"]
        scopes = debug("scopes", {"frameId": frames[0]["id"]})["body"]["scopes"]
        local = next(s for s in scopes if s["name"] == "Locals")["variablesReference"]
        seen["locals after step"] = [
            (v["name"], v["value"]) for v in debug("variables", {"variablesReference": local})["body"]["variables"]
        ]
        rich = debug("richInspectVariables", {"variableName": "c", "frameId": frames[0]["id"]})
        seen["rich at breakpoint"] = (rich["success"], rich["body"])
        copied = debug("copyToGlobals", {"srcVariableName": "c", "dstVariableName": "c_copy", "srcFrameId": frames[0]["id"]})
        seen["copyToGlobals"] = (copied["success"], copied["command"], copied["body"])
        source = debug("source", {"source": {"path": path}})
        seen["source"] = (source["success"], source["body"]["content"])
        seen["continue"] = debug("continue", {"threadId": thread})["success"]
        seen["continued"] = debug.event("continued")["body"]
        kernel.wait_for(lambda m: m["parent_header"].get("msg_id") == run and m["content"].get("execution_state") == "idle")
        seen["cell output"] = "".join(
            m["content"]["text"] for m in kernel.stray if m["parent_header"].get("msg_id") == run and m["msg_type"] == "stream"
        )
        seen["threads go on"] = debug.until_running()
        seen["inspectVariables"] = [v["name"] for v in debug("inspectVariables")["body"]["variables"]]
        rich = debug("richInspectVariables", {"variableName": "c_copy"})
        seen["rich idle"] = (rich["success"], rich["body"])
        seen["c_copy"] = kernel.execute("c_copy").of_type("execute_result")[0]["data"]
        seen["disconnect"] = debug("disconnect", {"restart": False, "terminateDebuggee": True})["success"]
        seen["after disconnect"] = kernel.execute("print(c_copy * 2)").text()
        seen["debugpy"] = kernel.execute("import debugpy, os\nprint(os.path.dirname(os.path.dirname(debugpy.__file__)))").text()
    return seen


def test_a_breakpoint_in_a_cell_stops_it_and_the_debugger_answers_as_ipykernels(kernel_name: str) -> None:
    ours = session(kernel_name)
    stock = session("python3")
    assert ours["stopped"] == ("breakpoint", True)
    assert ours["locals"] == [("a", "2", "int"), ("b", "3", "int")]
    assert ours["line after step"] == 3
    assert ours["locals after step"] == [("a", "2"), ("b", "3"), ("c", "5")]
    assert ours["rich at breakpoint"] == (True, {"data": {"text/plain": "5"}, "metadata": {}})
    assert ours["c_copy"] == {"text/plain": "5"}
    assert ours["cell output"] == "before\nafter\n"
    assert ours == stock


@pytest.fixture
def bare_emulator(tmp_path: Path):  # type: ignore[no-untyped-def]
    """An emulator whose sandboxes run a Python with only the standard library, as Daytona's default image
    has neither IPython nor debugpy."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    missing = subprocess.run([str(python), "-c", "import debugpy"], capture_output=True)
    assert missing.returncode != 0, "the bare venv must not see debugpy"
    emu = DaytonaEmulator(tmp_path / "emu", python=str(python)).start()
    yield emu
    emu.close()


@pytest.mark.slow
def test_a_sandbox_without_debugpy_gets_the_kernels(
    bare_emulator: DaytonaEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    kernel_home = os.environ.get("HOME", "")
    monkeypatch.setenv("HOME", str(home))  # the emulated sandboxes' Python sees this home; the kernel keeps its own
    folder = tmp_path / "nb"
    folder.mkdir()
    seen = session("daytona", env=dict(bare_emulator.env(), HOME=kernel_home), cwd=str(folder))
    assert seen["initialize"] and seen["stopped"] == ("breakpoint", True)
    assert seen["locals after step"] == [("a", "2"), ("b", "3"), ("c", "5")]
    assert seen["c_copy"] == {"text/plain": "5"} and seen["after disconnect"] == "10\n"
    assert seen["debugpy"].strip().startswith(str(home / ".cache" / "daytona-kernel" / "debugpy-"))


def test_a_kernel_without_a_session_says_why_its_debugger_is_off() -> None:
    with Kernel("daytona") as kernel:  # no DAYTONA_API_KEY: the kernel runs, its cells say what to set
        assert "debugger" not in kernel.request("kernel_info")["supported_features"]
        reply = Debugging(kernel)("initialize", INITIALIZE)
        assert reply["success"] is False and "DAYTONA_API_KEY" in reply["message"]
        assert kernel.request("kernel_info")["status"] == "ok"


def test_an_interrupt_while_paused_at_a_breakpoint_keeps_the_variables() -> None:
    """A traced cell unwinds slowly (2-3 s here, under ipykernel too): with the debugger on, the watchdog gives it
    30 s before it replaces the context, whatever ``interrupt_grace`` says (half a second here)."""
    with Kernel("daytona-local", env={"DAYTONA_KERNEL_INTERRUPT_GRACE": "0.5"}) as kernel:
        kernel.execute("kept = 41")
        debug = Debugging(kernel)
        assert debug("initialize", INITIALIZE)["success"] and debug("attach")["success"]
        path = debug("dumpCell", {"code": CELL})["body"]["sourcePath"]
        debug("setBreakpoints", {"breakpoints": [{"line": 2}], "source": {"path": path}, "sourceModified": False})
        debug("configurationDone")
        run = kernel.kc.execute(CELL)
        debug.event("stopped")
        kernel.interrupt()
        kernel.wait_for(lambda m: m["parent_header"].get("msg_id") == run and m["content"].get("execution_state") == "idle")
        errors = [
            m["content"]["ename"] for m in kernel.stray if m["msg_type"] == "error" and m["parent_header"].get("msg_id") == run
        ]
        assert errors == ["KeyboardInterrupt"]
        assert kernel.execute("print(kept + 1)").text() == "42\n"


HELPERS = "def double(n):\n    m = n * 2\n    return m\n"


def module_session(name: str, folder: Path) -> dict[str, Any]:
    """A breakpoint set in the user's own module (the mirrored copy runs in the sandbox), as JupyterLab sets one
    in a file it opened: what the breakpoint, the stack and the source request name."""
    with Kernel(name, cwd=str(folder)) as kernel:
        kernel.execute("pass")  # the project's files are in the sandbox
        debug = Debugging(kernel)
        assert debug("initialize", INITIALIZE)["success"] and debug("attach")["success"]
        user_file = str(folder / "helpers.py")
        placed = debug("setBreakpoints", {"breakpoints": [{"line": 2}], "source": {"path": user_file}, "sourceModified": False})
        debug("configurationDone")
        run = kernel.kc.execute("import helpers\nhelpers.double(21)")
        thread = debug.event("stopped")["body"]["threadId"]
        top = debug("stackTrace", {"threadId": thread})["body"]["stackFrames"][0]
        source = debug("source", {"source": {"path": top["source"]["path"]}})
        debug("continue", {"threadId": thread})
        kernel.wait_for(lambda m: m["parent_header"].get("msg_id") == run and m["content"].get("execution_state") == "idle")
        return {
            "breakpoint": [(b["verified"], b["line"], b["source"]["path"]) for b in placed["body"]["breakpoints"]],
            "top": (top["name"], top["line"], top["source"]["path"]),
            "source": (source["success"], source["body"]["content"]),
        }


def test_a_breakpoint_in_the_users_own_module_names_the_users_file(kernel_name: str, tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (folder / "helpers.py").write_text(HELPERS)
    ours = module_session(kernel_name, folder)
    user_file = str(folder / "helpers.py")
    assert ours == {"breakpoint": [(True, 2, user_file)], "top": ("double", 2, user_file), "source": (True, HELPERS)}
    assert ours == module_session("python3", folder)
