"""Test setup: kernelspecs installed into a throwaway prefix, data in a temp dir.

Every test that talks to a kernel starts a real one through jupyter_client,
from the kernelspec our own installer wrote.

Tiers: a test is ``slow`` when it starts a kernel, the Daytona emulator or a
subprocess (it uses one of SLOW_FIXTURES, its class derives from one of SLOW_BASES,
or its body calls one of SLOW_CALLS),
and ``fast`` otherwise; ``python -m pytest -m fast`` runs the fast tier in
seconds. A fast test that starts a kernel or the emulator anyway fails with a
message saying to mark it ``@pytest.mark.slow``, so the tiers cannot drift.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SLOW_FIXTURES = {"kernel", "kernel_name", "emulator", "daytona_env", "browser", "local"}  # local: a worker process
SLOW_BASES = {"KernelTests"}  # jupyter_kernel_test's conformance suite starts its kernel in setUpClass
SLOW_CALLS = {
    "Kernel",
    "KernelManager",
    "DaytonaEmulator",
    "cli",
    "console",
    "pexpect",
    "subprocess",
    "papermill",
    "nbclient",
    "_run_allowing_errors",
}

_ROOT = Path(tempfile.mkdtemp(prefix="daytona-kernel-tests-"))
os.environ["JUPYTER_DATA_DIR"] = str(_ROOT / "data")
os.environ["JUPYTER_PATH"] = str(_ROOT / "prefix" / "share" / "jupyter") + os.pathsep + os.environ.get("JUPYTER_PATH", "")
os.environ["JUPYTER_CONFIG_DIR"] = str(_ROOT / "config")
os.environ["JUPYTER_PLATFORM_DIRS"] = "1"
os.environ["XDG_DATA_HOME"] = str(_ROOT / "xdg")  # the trash that files a sandbox deletes go to (send2trash)
# A real key is kept aside for the daytona_e2e tests only; everything else runs without one.
REAL_DAYTONA_ENV = {k: os.environ.pop(k) for k in ("DAYTONA_API_KEY", "DAYTONA_API_URL", "DAYTONA_TARGET") if k in os.environ}

sys.path.insert(0, str(Path(__file__).parent))

from daytona_kernel import kernelspec  # noqa: E402

kernelspec.install(prefix=str(_ROOT / "prefix"))


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A notebook folder to start kernels in."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# The shared emulator makes these transitions at once, to keep the run short; the tests about
# transitions run an emulator of their own with real ones (test_lifecycle_daytona,
# test_emulator_control_plane) or set transition_s themselves. (The SDK learns of each state change
# from the emulator's Socket.IO events, as from Daytona's, so a transition costs what it lasts.)
INSTANT_TRANSITIONS = ("creating", "starting", "stopping", "destroying")


@pytest.fixture(scope="session")
def emulator(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One Daytona emulator for the whole run (of each xdist worker), on 127.0.0.1."""
    from daytona_emulator import DaytonaEmulator

    emu = DaytonaEmulator(tmp_path_factory.mktemp("emulator")).start()
    emu.transition_s.update(dict.fromkeys(INSTANT_TRANSITIONS, 0.0))
    yield emu
    emu.close()


@pytest.fixture
def daytona_env(emulator, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Point kernels started by this test at the emulator."""
    for key, value in emulator.env().items():
        monkeypatch.setenv(key, value)
    emulator.reset_counts()
    return emulator


@pytest.fixture(params=["daytona-local", "daytona"])
def kernel_name(request, emulator, monkeypatch):  # type: ignore[no-untyped-def]
    """Run the test on both backends: local, and Daytona against the emulator."""
    if request.param == "daytona":
        for key, value in emulator.env().items():
            monkeypatch.setenv(key, value)
    emulator.reset_counts()
    return request.param


def sandboxes_of(emulator, folder):  # type: ignore[no-untyped-def]
    """The emulator's sandboxes of one notebook folder."""
    from daytona_kernel.backends import workspace_key_for

    key = workspace_key_for(str(folder))
    return [s for s in emulator.sandboxes.values() if s.labels.get("daytona-kernel-workspace") == key]


def _is_slow(item: pytest.Item) -> bool:
    if any(any(item.iter_markers(name)) for name in ("slow", "browser", "daytona_e2e")):
        return True
    if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    cls = getattr(item, "cls", None)
    if cls is not None and any(base.__name__ in SLOW_BASES for base in cls.__mro__):
        return True
    function = getattr(item, "function", None)
    return bool(function is not None and SLOW_CALLS & set(function.__code__.co_names))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` (pyproject's addopts): the fast tier runs in one process, where starting workers would
    cost more than they save; anything else gets xdist's choice (the cores, capped by --maxprocesses)."""
    return 0 if config.option.markexpr == "fast" else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.slow if _is_slow(item) else pytest.mark.fast)


@pytest.fixture(autouse=True)
def _fast_tests_stay_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test in the fast tier may not start a kernel, the emulator, a console or a local worker."""
    if request.node.get_closest_marker("fast") is None:
        return
    from jupyter_client.manager import KernelManager

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            f"{request.node.nodeid} starts a kernel, the emulator or a console but is in the fast tier: mark it @pytest.mark.slow"
        )

    monkeypatch.setattr(KernelManager, "start_kernel", refuse)
    from daytona_emulator import DaytonaEmulator

    monkeypatch.setattr(DaytonaEmulator, "start", refuse)
    import pexpect

    monkeypatch.setattr(pexpect, "spawn", refuse)
    monkeypatch.setattr(asyncio, "create_subprocess_exec", refuse)  # a local worker process


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A bare git repository: branch `main` (version.txt "2"), tag `v1` (not a branch) on its first
    commit (version.txt "1"), whose id is ``first``."""
    root = tmp_path_factory.mktemp("git")
    work = root / "work"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(work)]
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    (work / "version.txt").write_text("1")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    subprocess.run([*git, "tag", "v1"], check=True)
    first = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (work / "version.txt").write_text("2")
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    bare = root / "project.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    return {"url": str(bare), "first": first}
