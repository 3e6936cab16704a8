"""The first cell after a restart runs before the daytona SDK has loaded in the new kernel process
(docs/reattach.md, "The first cell after a restart"), and every doubt falls back to the normal start:
real kernels, the unmodified SDK, the emulator.

The proof that the SDK has not loaded: a ``sitecustomize`` on the kernel's path holds the import of the
SDK's client (``daytona._async.daytona``, the module's code) until the test opens a gate file, so no request to Daytona's
API can be made before; the emulator's ``sequence`` shows which requests came, in order.
"""

from __future__ import annotations

import contextlib
import json
import stat
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from kernels import Kernel, result_text
from test_lifecycle_daytona import end_context, only_sandbox

from daytona_kernel.backends.daytona.restart_handoff import handoff_path
from daytona_kernel.compose import kernel_id_of

pytestmark = pytest.mark.slow  # the emulator and kernels run as subprocesses
EXECUTE = "/process/interpreter/execute"
GATE_CODE = """\
import importlib.abc, importlib.machinery, os, sys, time

class _SdkGate(importlib.abc.MetaPathFinder):
    # test-only: the SDK client's module runs only once the gate file exists (120 s at most); waiting in
    # exec_module holds that module's import lock only (find_spec runs under the global one)
    def find_spec(self, name, path=None, target=None):
        gate = os.environ.get("DK_TEST_SDK_GATE")
        if not gate or name != "daytona._async.daytona":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            deadline = time.monotonic() + 120
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.02)
            run(module)

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _SdkGate())
"""


class Gate:
    def __init__(self, folder: Path) -> None:
        folder.mkdir()
        (folder / "sitecustomize.py").write_text(GATE_CODE)
        self.path = folder / "open"
        self.env = {"PYTHONPATH": str(folder), "DK_TEST_SDK_GATE": str(self.path)}

    def open(self) -> None:
        self.path.touch()

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def quick_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from daytona_emulator import DaytonaEmulator

    emu = DaytonaEmulator(tmp_path_factory.mktemp("restart-quick")).start()
    yield emu
    emu.close()


@pytest.fixture
def emu(quick_emulator: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in quick_emulator.env().items():
        monkeypatch.setenv(key, value)
    quick_emulator.reset_counts()
    return quick_emulator


@pytest.fixture
def gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    """Outside the kernel's project folder: opening or closing it is no change for the mirror to send (which
    would wait for the SDK the gate holds)."""
    return Gate(tmp_path_factory.mktemp("sdk-gate") / "gate")


def handoff_of(k: Kernel) -> Path:
    path = handoff_path(kernel_id_of(k.km.connection_file))
    assert path is not None
    return path


def restart_in_two_steps(k: Kernel, between: Any = None) -> None:
    """What restart_kernel does, with ``between(handoff file)`` run after the old process is gone."""
    k.km.shutdown_kernel(now=False, restart=True)
    if between is not None:
        between(handoff_of(k))
    k.km.start_kernel(**k.km._launch_args)
    k.kc.wait_for_ready(timeout=60)


@contextlib.contextmanager
def quick_restarted(emu: Any, folder: Path, gate: Gate, between: Any = None) -> Iterator[tuple[Kernel, Any]]:
    """A kernel in ``folder`` with a variable, restarted with the SDK held (the gate closed), and its first cell
    run in the next process (``between`` as in ``restart_in_two_steps``); the kernel and its sandbox."""
    gate.open()
    with Kernel("daytona", cwd=str(folder), env=gate.env) as k:
        k.execute("x = 1")
        k.execute("%daytona status")  # it waits for the SDK: a first start runs its first cell before (early)
        sandbox = only_sandbox(emu, folder)
        gate.close()
        restart_in_two_steps(k, between)
        assert result_text(k.execute("y = 2\ny", timeout=20)) == "2"
        yield k, sandbox


def rest_before_first_socket(emu: Any) -> list[str]:
    """The requests to Daytona's API before the first interpreter websocket."""
    first = next(i for i, key in enumerate(emu.sequence) if EXECUTE in key)
    return [key for key in emu.sequence[:first] if "/api/" in key]


def test_a_restarts_first_cell_runs_before_the_sdk_has_loaded(emu: Any, tmp_path: Path, gate: Gate) -> None:
    notebook = tmp_path / "project"
    notebook.mkdir()
    gate.open()
    with Kernel("daytona", cwd=str(notebook), env=gate.env) as k:
        k.execute("x = 1")
        sandbox = only_sandbox(emu, notebook)
        gate.close()  # the next process cannot load the SDK's client until the gate opens

        def check(path: Path) -> None:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
            text = path.read_text()
            assert emu.api_key not in text and "Bearer" not in text  # no credential in the handoff
            emu.reset_counts()

        restart_in_two_steps(k, check)
        left = set(sandbox.contexts)
        first = k.execute("import os\nos.getpid() > 0", timeout=20)
        assert result_text(first) == "True" and first.text("stderr") == ""
        assert k.execute("x", timeout=20).errors[0]["ename"] == "NameError"  # a new interpreter, like ipykernel
        assert [key for key in emu.sequence if "/api/" in key] == []  # no API call: the SDK has not loaded
        assert emu.count(EXECUTE) == 3  # the runtime's install, then the two cells
        assert set(sandbox.contexts) == left  # the context the old process left
        assert not handoff_of(k).exists()  # consumed

        gate.open()  # the SDK loads; files, the mirror and input() work on
        (notebook / "data.txt").write_text("from the laptop")
        run = k.execute(
            "print(open('data.txt').read())\nopen('made.txt', 'w').write(input('name? '))",
            stdin_answer=lambda content: "ada",
            timeout=60,
        )
        assert run.errors == [] and "from the laptop" in run.text()
        assert run.stdin_requests and run.stdin_requests[0]["prompt"] == "name? "
        assert (notebook / "made.txt").read_text() == "ada"  # the mirror brought it back
        assert emu.count("GET /api/sandbox/{sid}") == 1, emu.sequence  # fetched by its id, once: nothing to refresh
    emu.wait_for_state(sandbox.id, "stopped", timeout=30)  # the shutdown, which needs the SDK, released it


def test_restarts_in_a_row_need_no_sdk(emu: Any, tmp_path: Path, gate: Gate) -> None:
    """A restart that comes before the SDK has loaded (a second restart right after the first) leaves the next
    context and deletes its own without it: no restart waits for the SDK, and none leaves a context behind."""
    with quick_restarted(emu, tmp_path, gate, lambda path: emu.reset_counts()) as (k, sandbox):
        restart_in_two_steps(k)  # the SDK is still held
        assert k.execute("y", timeout=20).errors[0]["ename"] == "NameError"
        assert result_text(k.execute("1 + 1", timeout=20)) == "2"
        assert [key for key in emu.sequence if "/api/" in key] == []  # no API call: the SDK never loaded
        assert len(sandbox.contexts) == 1  # each restart's old context was deleted
        pid = k.km.provisioner.process.pid  # type: ignore[union-attr]
        assert "aiohttp" not in Path(f"/proc/{pid}/maps").read_text()  # it loads with the SDK, not before
        gate.open()
        assert result_text(k.execute("import os\nos.path.isdir('.')", timeout=60)) == "True"
    emu.wait_for_state(sandbox.id, "stopped", timeout=30)  # the shutdown waited for the SDK, then released it


def test_a_context_left_before_the_sdk_loaded_is_deleted_when_the_next_process_refuses_it(
    emu: Any, tmp_path: Path, gate: Gate
) -> None:
    """A restart before the SDK has loaded leaves the next context without the label; if the next process
    refuses the handoff (here: the settings changed), it deletes that context, else it would stay alive and
    count as another kernel's at shutdown (the sandbox left running)."""
    with quick_restarted(emu, tmp_path, gate) as (k, sandbox):

        def other_settings(path: Path) -> None:
            assert path.exists()
            k.km._launch_args["env"]["DAYTONA_KERNEL_AUTO_STOP_INTERVAL"] = "17"
            gate.open()

        restart_in_two_steps(k, other_settings)  # the SDK was still held: the next context has no label
        assert result_text(k.execute("1 + 1", timeout=60)) == "2"
        assert only_sandbox(emu, tmp_path).id == sandbox.id
        assert len(sandbox.contexts) == 1  # the kernel's one context: the refused one was deleted
    emu.wait_for_state(sandbox.id, "stopped", timeout=30)  # no context counted as another kernel's


def test_a_shutdown_before_the_sdk_has_loaded_deletes_the_kernels_context_at_once(emu: Any, tmp_path: Path, gate: Gate) -> None:
    """Stopping the sandbox needs the SDK; deleting the kernel's context does not: it goes first, so a kernel that
    Jupyter kills meanwhile (5 s after its shutdown request) leaves no interpreter with the user's variables."""
    with quick_restarted(emu, tmp_path, gate) as (k, sandbox):
        assert len(sandbox.contexts) == 1
    assert sandbox.contexts == {}  # the SDK never loaded: the sandbox is not stopped, but the context is gone
    gate.open()


def stale(path: Path) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "written_at": time.time() - 3600}))


def foreign(path: Path) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "toolbox_url": "https://toolbox.example.com/toolbox"}))


@pytest.mark.parametrize(
    "why", ["stale", "foreign origin", "other settings", "context gone", "sandbox stopped", "sandbox deleted"]
)
def test_a_handoff_that_cannot_be_used_falls_back_and_runs_the_cell_once(emu: Any, tmp_path: Path, why: str) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 1")
        sandbox = only_sandbox(emu, tmp_path)

        def spoil(path: Path) -> None:
            (left,) = sandbox.contexts
            if why == "stale":
                stale(path)
            elif why == "foreign origin":
                foreign(path)
            elif why == "other settings":
                k.km._launch_args["env"]["DAYTONA_KERNEL_AUTO_STOP_INTERVAL"] = "17"
            elif why == "context gone":
                emu.call(end_context(sandbox, left))
            elif why == "sandbox stopped":
                emu.stop_sandbox(sandbox.id)
                emu.wait_for_state(sandbox.id, "stopped")
            else:
                emu.delete_sandbox_now(sandbox.id)
                emu.wait_for_state(sandbox.id, "destroyed")
            assert path.exists()
            emu.reset_counts()

        restart_in_two_steps(k, spoil)
        run = k.execute("import os\nopen('ran.txt', 'a').write('1')\nopen('ran.txt').read()", timeout=60)
        assert result_text(run) == "'1'", run.errors  # the cell ran once
        assert k.execute("x").errors[0]["ename"] == "NameError"
        assert not handoff_of(k).exists()
        if why in ("stale", "foreign origin", "other settings"):
            assert rest_before_first_socket(emu) != []  # the normal start: the API first
        live = only_sandbox(emu, tmp_path)
        assert len(live.contexts) == 1  # the kernel's one context: none left behind
        if why == "sandbox deleted":
            assert live.id != sandbox.id
        elif why == "sandbox stopped":
            assert live.state == "started"
