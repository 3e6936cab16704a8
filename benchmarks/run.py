"""daytona-kernel benchmarks: every figure beside its baseline, measured in the same run.

    python -m benchmarks            # full run: benchmarks/results.json, and docs/benchmarks.md's table and chart
    python -m benchmarks --quick    # smoke size, only to show the suite still works (its page goes beside --out)

Each figure is a median over repetitions after a warm-up, with min and max. Times
on shared machines are noise, so the verdicts use ratios against the baseline
measured moments before in the same process.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import dataclasses
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from daytona_emulator import TRANSITION_S, DaytonaEmulator  # noqa: E402
from kernels import Kernel  # noqa: E402


@dataclass
class Figure:
    name: str
    unit: str
    ours: dict[str, float]
    baseline: dict[str, float] | None = None
    baseline_name: str = ""
    goal: str = ""
    verdict: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if not self.baseline or not self.baseline.get("median"):
            return None
        return self.ours["median"] / self.baseline["median"]


@dataclass
class Report:
    machine: str
    started: str
    quick: bool
    figures: list[Figure] = field(default_factory=list)
    stopped: str = ""  # why the run stopped before its last figure ("": it did not)


def stats(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples)}


def in_turns(*measures: Callable[[int], dict[str, float]], reps: int) -> list[dict[str, float]]:
    """Each measure taken one sample at a time, in turns, so that a figure and its baseline see the same
    minutes of a shared machine (a block of one then a block of the other drifted apart by a third)."""
    samples: list[list[float]] = [[] for _ in measures]
    for _ in range(reps):
        for taken, measure in zip(samples, measures):
            taken.append(measure(1)["median"])
    return [stats(taken) for taken in samples]


def timed(fn: Callable[[], Any], reps: int, warmup: int = 3) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return stats(samples)


def ms(d: dict[str, float]) -> dict[str, float]:
    return {k: (v * 1000 if k != "n" else v) for k, v in d.items()}


# -- kernels --------------------------------------------------------------------------


def noop_latency(k: Kernel, reps: int) -> dict[str, float]:
    return ms(timed(lambda: k.execute("pass"), reps))


def first_output_latency(k: Kernel, reps: int) -> dict[str, float]:
    samples = []
    for i in range(reps + 2):
        seen: dict[str, float] = {}

        def on_message(msg: dict, seen: dict[str, float] = seen) -> None:
            if msg["msg_type"] == "stream" and "at" not in seen:
                seen["at"] = time.time()
                seen["sent"] = float(msg["content"]["text"].split()[0])

        k.execute("import time\nprint(time.time(), flush=True)\ntime.sleep(0.05)", on_message=on_message)
        if i >= 2:
            samples.append(seen["at"] - seen["sent"])
    return ms(stats(samples))


def throughput(k: Kernel, megabytes: int, reps: int) -> dict[str, float]:
    code = f"line = 'x' * 1023\nfor _ in range({megabytes} * 1024):\n    print(line)"
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run = k.execute(code, timeout=600)
        elapsed = time.perf_counter() - t0
        got = len(run.text())
        assert got == megabytes * 1024 * 1024, f"lost output: {got} bytes"
        samples.append(megabytes / elapsed)
    return stats(samples)


MAKE_PNG = "import os, base64\npng = base64.b64encode(os.urandom(2 * 1024 * 1024)).decode()"
# The same bytes through a bare run_code: printed in pieces, since one 2.7 MB line would pass the daemon's 1 MiB line cap
PRINT_PNG = "for i in range(0, len(png), 262144):\n    print(png[i : i + 262144], end='', flush=True)"


def rich_display(k: Kernel, reps: int) -> dict[str, float]:
    k.execute(MAKE_PNG)
    return ms(timed(lambda: k.execute("display({'image/png': png}, raw=True)"), reps, warmup=1))


def interrupt_latency(k: Kernel, reps: int) -> dict[str, float]:
    samples = []
    for _ in range(reps):
        fired: dict[str, float] = {}

        def fire(fired: dict[str, float] = fired) -> None:
            time.sleep(0.5)
            fired["t"] = time.perf_counter()
            k.interrupt()

        thread = threading.Thread(target=fire)
        thread.start()
        k.execute("import time\ntime.sleep(30)")
        samples.append(time.perf_counter() - fired["t"])
        thread.join()
    return ms(stats(samples))


SLIDER = "import time, ipywidgets as w\ns = w.IntSlider()\ns.observe(lambda change: print(time.time(), flush=True), 'value')\ns"
STOP_LOOP = "clicked.clear()\nwhile not clicked:\n    await asyncio.sleep(0.005)\nprint(time.time(), flush=True)"


def _widget_id(run: Any) -> str:
    return str(run.of_type("execute_result")[0]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"])


def slider_to_observer(k: Kernel, reps: int) -> dict[str, float]:
    """From the frontend's slider update to the observer's output in the kernel's iopub."""
    slider = _widget_id(k.execute(SLIDER))
    samples = []
    for i in range(reps + 2):
        time.sleep(0.1)  # one update, as after a pause: not held by the 50 ms spacing of the one before
        t0 = time.perf_counter()
        sent = k.comm(
            "comm_msg", {"comm_id": slider, "data": {"method": "update", "state": {"value": i + 1}, "buffer_paths": []}}
        )
        k.wait_for(lambda m, sent=sent: m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == sent)
        if i >= 2:
            samples.append(time.perf_counter() - t0)
    return ms(stats(samples))


def click_to_awaiting_loop(k: Kernel, reps: int) -> dict[str, float]:
    """From a Button click to the awaiting loop in the running cell seeing it (its print's timestamp)."""
    button = _widget_id(
        k.execute("import asyncio, time, ipywidgets as w\nclicked = []\nb = w.Button()\nb.on_click(clicked.append)\nb")
    )
    samples = []
    for i in range(reps + 1):
        msg_id = k.kc.execute(STOP_LOOP)
        k.wait_for(
            lambda m, msg_id=msg_id: (
                m["msg_type"] == "status"
                and m["content"]["execution_state"] == "busy"
                and m["parent_header"].get("msg_id") == msg_id
            )
        )
        time.sleep(0.2)  # the loop is awaiting
        clicked_at = time.time()
        k.comm("comm_msg", {"comm_id": button, "data": {"method": "custom", "content": {"event": "click"}}})
        seen = k.wait_for(lambda m, msg_id=msg_id: m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == msg_id)
        k.wait_for(
            lambda m, msg_id=msg_id: (
                m["msg_type"] == "status"
                and m["content"]["execution_state"] == "idle"
                and m["parent_header"].get("msg_id") == msg_id
            )
        )
        if i >= 1:
            samples.append(float(seen["content"]["text"].split()[0]) - clicked_at)
    return ms(stats(samples))


def tqdm_notebook_loop(k: Kernel, reps: int) -> dict[str, float]:
    """The loop's own time in the kernel's (or sandbox's) Python: what the progress widget's updates cost it."""
    k.execute("import time\nfrom tqdm.notebook import tqdm")
    code = "t0 = time.perf_counter()\nfor i in tqdm(range(10_000)):\n    pass\nprint(time.perf_counter() - t0)"
    return stats([float(k.execute(code).text().split()[-1]) for _ in range(reps)])


def widget_figures(stock: Kernel, local: Kernel, remote: Kernel, raw_noop: dict[str, float], few: int) -> list[Figure]:
    base_click = click_to_awaiting_loop(stock, few)
    loops = few * 5  # a loop is 10-20 ms, where one scheduling delay is the whole difference: more samples, cheaply
    base_tqdm = tqdm_notebook_loop(stock, loops)
    return [
        Figure(
            "slider update to its observer, daytona (emulator) vs one raw run_code",
            "ms",
            slider_to_observer(remote, few * 2),
            raw_noop,
            "AsyncSandbox.code_interpreter.run_code('pass')",
            "≤ baseline + 50 ms",
            note="while idle, a batch of frontend messages is one short call of its own",
        ),
        Figure(
            "Button click to an awaiting loop, daytona-local vs ipykernel",
            "ms",
            click_to_awaiting_loop(local, few),
            base_click,
            "ipykernel",
            "≤ 200 ms",
            note="while a cell runs, a batch is one file upload to the runtime's inbox, polled every 20 ms",
        ),
        Figure(
            "Button click to an awaiting loop, daytona (emulator) vs ipykernel",
            "ms",
            click_to_awaiting_loop(remote, few),
            base_click,
            "ipykernel",
        ),
        Figure(
            "tqdm.notebook loop of 10,000 iterations, daytona-local vs ipykernel",
            "s",
            tqdm_notebook_loop(local, loops),
            base_tqdm,
            "ipykernel",
            "≤ 1.5×",
        ),
        Figure(
            "tqdm.notebook loop of 10,000 iterations, daytona (emulator) vs ipykernel",
            "s",
            tqdm_notebook_loop(remote, loops),
            base_tqdm,
            "ipykernel",
            "≤ 1.5×",
        ),
    ]


def start_to_first_result(name: str, reps: int, env: dict[str, str] | None = None, cwd: str | None = None) -> dict[str, float]:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        with Kernel(name, env=env, cwd=cwd) as k:
            k.execute("1")
            samples.append(time.perf_counter() - t0)
    return stats(samples)


def ready_to_first_result(name: str, reps: int, env: dict[str, str] | None = None, cwd: str | None = None) -> dict[str, float]:
    """A new kernel's first cell, timed from when it answers kernel_info (JupyterLab shows it idle) to its result."""
    samples = []
    for _ in range(reps):
        with Kernel(name, env=env, cwd=cwd) as k:
            t0 = time.perf_counter()
            k.execute("1")
            samples.append(time.perf_counter() - t0)
    return stats(samples)


def shipped_ipython_start(reps: int, data_dir: Path) -> dict[str, float]:
    """A cold start in a new sandbox whose Python has no IPython (and an empty cache), so the kernel
    ships its own in one upload before the first cell: what a first start on a bare image costs."""
    venv = data_dir / "bare-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    emu = DaytonaEmulator(data_dir / "bare-emulator", python=str(venv / "bin" / "python")).start()
    kernel_home = os.environ.get("HOME", "")
    env = dict(emu.env(), DAYTONA_KERNEL_SANDBOX_POLICY="ephemeral", HOME=kernel_home)
    samples = []
    try:
        for _ in range(reps):
            os.environ["HOME"] = tempfile.mkdtemp(prefix="bench-sandbox-home-")  # the sandboxes' home: no cached IPython
            uploads = emu.count("bulk-upload")
            t0 = time.perf_counter()
            with Kernel("daytona", env=env, cwd=tempfile.mkdtemp(prefix="bench-bare-nb-")) as k:
                k.execute("1")
                samples.append(time.perf_counter() - t0)
            if emu.count("bulk-upload") == uploads:
                raise RuntimeError("the bare sandbox got no IPython upload: this figure would measure something else")
    finally:
        os.environ["HOME"] = kernel_home
        emu.close()
    return stats(samples)


def resume_to_first_result(emu: DaytonaEmulator, env: dict[str, str], cwd: str, reps: int) -> dict[str, float]:
    """A kernel whose sandbox was paused (by auto-pause, or the dashboard): the time of its next cell,
    which resumes the sandbox and answers from the same interpreter."""
    from daytona_kernel.backends import workspace_key_for

    samples = []
    with Kernel("daytona", env=env, cwd=cwd) as k:
        k.execute("x = 1")
        key = workspace_key_for(cwd)
        sid = next(s.id for s in emu.live_sandboxes() if s.labels.get("daytona-kernel-workspace") == key)
        for _ in range(reps):
            emu.pause_sandbox(sid)
            emu.wait_for_state(sid, "paused")
            t0 = time.perf_counter()
            run = k.execute("x")
            samples.append(time.perf_counter() - t0)
            assert "resumed the paused sandbox" in run.text("stderr"), run.text("stderr")
    return stats(samples)


def map_of_sleepers(name: str, reps: int, env: dict[str, str] | None = None) -> dict[str, float]:
    """``%%daytona map 4`` of cells that sleep 3 s, once the pool exists: the wall time of the cell."""
    with Kernel(name, env=env, cwd=tempfile.mkdtemp(prefix="bench-map-nb-")) as k:
        k.execute("%%daytona map 4\npass", timeout=300)  # the pool is made here, not measured
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run = k.execute("%%daytona map 4\nimport time\ntime.sleep(3)", timeout=300)
            samples.append(time.perf_counter() - t0)
            assert run.reply["content"]["status"] == "ok", run.errors
    return stats(samples)


def worker_creation(emu: DaytonaEmulator, n: int, reps: int) -> dict[str, float]:
    """What the pool does to create n workers, in this process: n worker sandboxes started at once (create,
    wait for started, working directory), next to a started main sandbox whose SDK client they share."""
    from daytona_kernel.backends import open_engine_sandbox, open_sandbox
    from daytona_kernel.config import DaytonaKernelConfig

    saved = {k: os.environ.get(k) for k in emu.env()}
    os.environ.update(emu.env())
    folder = tempfile.mkdtemp(prefix="bench-workers-nb-")

    async def measure() -> list[float]:
        config = DaytonaKernelConfig()
        main = open_sandbox(config, folder, "bench-kernel")
        await main.start(lambda text: None)
        samples = []
        for _ in range(reps):
            workers = [open_engine_sandbox(config, folder, "bench-kernel", serial, main) for serial in range(n)]
            t0 = time.perf_counter()
            await asyncio.gather(*(w.start(lambda text: None) for w in workers))
            samples.append(time.perf_counter() - t0)
            await asyncio.gather(*(w.shutdown() for w in workers))
        await main.shutdown()
        return samples

    try:
        return stats(asyncio.run(measure()))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def pool_creation(emu: DaytonaEmulator, env: dict[str, str], n: int, reps: int) -> dict[str, float]:
    """The first ``%%daytona map n`` cell of a kernel whose main sandbox is up: n worker sandboxes created,
    started and bootstrapped (closed again after each sample)."""
    samples = []
    with Kernel("daytona", env=env, cwd=tempfile.mkdtemp(prefix="bench-pool-nb-")) as k:
        k.execute("pass")
        for _ in range(reps):
            t0 = time.perf_counter()
            run = k.execute(f"%%daytona map {n}\npass", timeout=300)
            samples.append(time.perf_counter() - t0)
            assert run.reply["content"]["status"] == "ok", run.errors
            k.execute("%daytona map --close", timeout=300)
    return stats(samples)


def restart_to_first_result(k: Kernel, reps: int) -> dict[str, float]:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        k.restart()
        k.execute("1")
        samples.append(time.perf_counter() - t0)
    return stats(samples)


def after_restart_to_first_result(k: Kernel, reps: int) -> dict[str, float]:
    """The first cell after a restart, timed from when the new process answers kernel_info to its result."""
    samples = []
    for _ in range(reps):
        k.restart()
        t0 = time.perf_counter()
        k.execute("1")
        samples.append(time.perf_counter() - t0)
    return stats(samples)


PRINTING_LOOP = "i = 0\nwhile True:\n    print(i)\n    i += 1"


def printing_loop_interrupt(k: Kernel, reps: int) -> dict[str, float]:
    """Interrupt a loop that prints as fast as it can: from the interrupt_request to the cell's reply."""
    samples = []
    for _ in range(reps):
        fired: dict[str, float] = {}

        def fire(fired: dict[str, float] = fired) -> None:
            time.sleep(0.5)
            fired["t"] = time.perf_counter()
            k.interrupt()

        thread = threading.Thread(target=fire)
        thread.start()
        run = k.execute(PRINTING_LOOP, timeout=120)
        samples.append(time.perf_counter() - fired["t"])
        thread.join()
        assert run.status == "error", run.reply
    return ms(stats(samples))


def rss_kb(k: Kernel) -> int:
    pid = k.km.provisioner.process.pid  # type: ignore[union-attr]
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# -- the raw SDK on the emulator ------------------------------------------------------


def raw_sdk_noop(emu: DaytonaEmulator, reps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median of a bare run_code('pass'), and of its first-output latency, on the same emulator."""
    from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams, DaytonaConfig

    async def go() -> tuple[dict[str, float], dict[str, float]]:
        client = AsyncDaytona(DaytonaConfig(api_key=emu.api_key, api_url=emu.api_url, target="us"))
        sandbox = await client.create(CreateSandboxFromSnapshotParams(labels={"bench": "raw"}, auto_delete_interval=0))
        ctx = await sandbox.code_interpreter.create_context()
        for _ in range(5):
            await sandbox.code_interpreter.run_code("pass", context=ctx)
        noop = []
        for _ in range(reps):
            t0 = time.perf_counter()
            await sandbox.code_interpreter.run_code("pass", context=ctx)
            noop.append(time.perf_counter() - t0)
        first = []
        for _ in range(max(5, reps // 5)):
            seen: dict[str, float] = {}

            def on_stdout(msg: Any, seen: dict[str, float] = seen) -> None:
                if "at" not in seen:
                    seen["at"] = time.time()
                    seen["sent"] = float(msg.output.split()[0])

            await sandbox.code_interpreter.run_code(
                "import time\nprint(time.time(), flush=True)\ntime.sleep(0.05)", context=ctx, on_stdout=on_stdout
            )
            first.append(seen["at"] - seen["sent"])
        await sandbox.delete()
        await client.close()
        return ms(stats(noop)), ms(stats(first))

    return asyncio.run(go())


def raw_sdk_print(emu: DaytonaEmulator, reps: int) -> dict[str, float]:
    """A bare run_code that prints the 2 MB PNG's base64 (the same bytes as the display figure), on the same emulator."""
    from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams, DaytonaConfig

    async def go() -> dict[str, float]:
        client = AsyncDaytona(DaytonaConfig(api_key=emu.api_key, api_url=emu.api_url, target="us"))
        sandbox = await client.create(CreateSandboxFromSnapshotParams(labels={"bench": "raw-print"}, auto_delete_interval=0))
        ctx = await sandbox.code_interpreter.create_context()
        await sandbox.code_interpreter.run_code(MAKE_PNG, context=ctx)
        samples = []
        for i in range(reps + 1):
            t0 = time.perf_counter()
            result = await sandbox.code_interpreter.run_code(PRINT_PNG, context=ctx)
            if i:
                samples.append(time.perf_counter() - t0)
            assert len(result.stdout) == 2796204, f"lost output: {len(result.stdout)} bytes"
        await sandbox.delete()
        await client.close()
        return ms(stats(samples))

    return asyncio.run(go())


RAW_START = """
import asyncio, sys
from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams

async def main():
    client = AsyncDaytona()  # DAYTONA_API_KEY / DAYTONA_API_URL / DAYTONA_TARGET, as for the kernel
    sandbox = await client.create(CreateSandboxFromSnapshotParams(labels={"bench": "raw-start"}, auto_delete_interval=0))
    result = await sandbox.code_interpreter.run_code("print(1 + 1)")
    print(result.stdout.strip(), flush=True)  # the first result: the benchmark stops its clock here
    await sandbox.delete()
    await client.close()

asyncio.run(main())
"""


def check_context_lock() -> None:
    """The restart figure is taken under the daemon's context lock (interpreter/manager.go: create, delete, get and
    list of contexts hold one lock per sandbox while a worker starts or exits). The emulator always holds it
    (``EmuSandbox.context_lock``; tests/test_daytona_harsh.py shows a create waiting for a deletion under way);
    this stops the run if an emulator without it were ever measured."""
    from daytona_emulator import EmuSandbox

    if "context_lock" not in {f.name for f in dataclasses.fields(EmuSandbox)}:
        raise RuntimeError("this emulator has no per-sandbox context lock: the restart figure would not be Daytona's")


class TimedRequests(list[str]):
    """The emulator's request log (``sequence``: "METHOD /route" in order) with when each came, on this process's
    clock (the emulator runs in a thread of the benchmark's process)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[tuple[float, str]] = []

    def append(self, key: str) -> None:
        self.at.append((time.perf_counter(), key))
        super().append(key)

    def first(self, since: float, route: str = "") -> float | None:
        """Seconds from ``since`` to the first request (whose "METHOD /route" is ``route``) after it; None if none came."""
        return next((t - since for t, key in self.at if t >= since and (not route or key == route)), None)


START_STAGES = {  # stage -> the emulator's "METHOD /route" that marks it ("" for the first API request of any kind)
    "first API request sent": "",
    "create sent": "POST /api/sandbox",
    "first context made": "POST /toolbox/{sid}/process/interpreter/context",
}


def cold_start_stages(
    emu: DaytonaEmulator, env: dict[str, str], cwd: str, reps: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """The kernel's cold start (a new sandbox) and the raw SDK's create-and-run, in turns, each from its process's
    spawn: the first result, and the stages on the way (kernel_info answered, first API request, create, first
    context), from the emulator's request log."""
    log = emu.sequence = TimedRequests()
    ours: dict[str, list[float]] = {}
    raw: dict[str, list[float]] = {}
    for _ in range(reps):
        t0 = time.perf_counter()
        with Kernel("daytona", env=env, cwd=cwd) as k:
            ours.setdefault("kernel_info answered (the client's wait_for_ready)", []).append(time.perf_counter() - t0)
            k.execute("1")
            ours.setdefault("first result", []).append(time.perf_counter() - t0)
        for taken, since in ((ours, t0), (raw, time.perf_counter())):
            if taken is raw:
                raw.setdefault("first result", []).append(raw_sdk_start(emu, 1)["median"])
            for stage, route in START_STAGES.items():
                at = log.first(since, route)
                if at is not None:  # the raw SDK's run_code makes no context of its own (the daemon's default one)
                    taken.setdefault(stage, []).append(at)
    return ours, raw


def start_figures(emu: DaytonaEmulator, env: dict[str, str], cwd: str, reps: int, base_start: dict[str, float]) -> list[Figure]:
    ours, raw = cold_start_stages(emu, env, cwd, reps)
    cold, raw_start = stats(ours["first result"]), stats(raw["first result"])
    raw_name = "a new Python process: import daytona, create, run_code"
    figures = [
        Figure("start to first result, daytona (emulator), cold: new sandbox, vs ipykernel", "s", cold, base_start, "ipykernel"),
        Figure(
            "start to first result, daytona (emulator), cold, vs the raw SDK creating a sandbox and running print(1 + 1)",
            "s",
            cold,
            raw_start,
            raw_name,
            "≤ 0.8×",
            note="taken in turns with its baseline; the stages below are from the same runs",
        ),
        Figure(
            "start stage: kernel_info answered, daytona (emulator), cold",
            "s",
            stats(ours["kernel_info answered (the client's wait_for_ready)"]),
            note="from the kernel process's spawn to the client's wait_for_ready",
        ),
    ]
    for stage in START_STAGES:
        base = stats(raw[stage]) if stage in raw else None
        name = f"start stage: {stage}, daytona (emulator), cold" + (", vs the raw SDK's" if base else "")
        figures.append(
            Figure(
                name,
                "s",
                stats(ours[stage]),
                base,
                raw_name if base else "",
                note="from the process's spawn, by the emulator's request log",
            )
        )
    return figures


def raw_sdk_start(emu: DaytonaEmulator, reps: int) -> dict[str, float]:
    """A fresh Python process that imports the SDK, creates a sandbox and runs print(1 + 1) in it: what the
    kernel's start does, minus Jupyter (the kernel's figure counts its process start too)."""
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", RAW_START], env={**os.environ, **emu.env()}, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        samples.append(time.perf_counter() - t0)
        assert first.strip() == "2", first
        proc.wait(60)
    return stats(samples)


def raw_sdk_resume(emu: DaytonaEmulator, reps: int) -> dict[str, float]:
    """The platform's own resume: a paused sandbox's start() through the SDK, then run_code('x') in the
    context that was paused with it."""
    from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams, DaytonaConfig

    async def go() -> dict[str, float]:
        client = AsyncDaytona(DaytonaConfig(api_key=emu.api_key, api_url=emu.api_url, target="us"))
        sandbox = await client.create(CreateSandboxFromSnapshotParams(labels={"bench": "raw-resume"}, auto_delete_interval=0))
        ctx = await sandbox.code_interpreter.create_context()
        await sandbox.code_interpreter.run_code("x = 1", context=ctx)
        samples = []
        for _ in range(reps):
            await asyncio.to_thread(emu.pause_sandbox, sandbox.id)
            await asyncio.to_thread(emu.wait_for_state, sandbox.id, "paused")
            t0 = time.perf_counter()
            await sandbox.start()
            result = await sandbox.code_interpreter.run_code("print(x)", context=ctx)
            samples.append(time.perf_counter() - t0)
            assert result.stdout.strip() == "1", result.stdout
        await sandbox.delete()
        await client.close()
        return stats(samples)

    return asyncio.run(go())


def session_layer_noop(emu: DaytonaEmulator, reps: int) -> tuple[dict[str, float], dict[str, float]]:
    """A cell through SandboxSession (runtime wrapper, frames, mirror check) vs a bare run_code, one context."""
    import logging

    from daytona_kernel.cell import Cell, Recorder
    from daytona_kernel.compose import build_session
    from daytona_kernel.config import DaytonaKernelConfig

    os.environ.update(emu.env())

    async def go() -> tuple[dict[str, float], dict[str, float]]:
        config = DaytonaKernelConfig(sandbox_policy="ephemeral", workspace_key="bench-layer")
        session = build_session(config, tempfile.mkdtemp(), "bench", logging.getLogger())
        live = await session.ready()

        async def sample(fn: Callable[[], Any]) -> dict[str, float]:
            for _ in range(5):
                await fn()
            xs = []
            for _ in range(reps):
                t0 = time.perf_counter()
                await fn()
                xs.append(time.perf_counter() - t0)
            return ms(stats(xs))

        ours = await sample(lambda: session.execute(Cell("pass", 1), Recorder()))
        raw = await sample(lambda: live.context.run_code("pass", lambda text: None, lambda text: None))
        await session.shutdown()
        return ours, raw

    return asyncio.run(go())


def session_layer_png(emu: DaytonaEmulator, reps: int) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """The 2 MB PNG display at the session layer (no Jupyter messages), its large string in a file fetched
    with one download, and the same through the line protocol (``blob_chars`` 0), against a bare
    ``run_code`` printing the same bytes in a plain context of the same sandbox; taken in turns."""
    import logging

    from daytona_kernel.cell import Cell, Recorder
    from daytona_kernel.compose import build_session
    from daytona_kernel.config import DaytonaKernelConfig

    os.environ.update(emu.env())
    display = "display({'image/png': png}, raw=True)"

    async def go() -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        config = DaytonaKernelConfig(sandbox_policy="ephemeral", workspace_key="bench-layer-png")
        session = build_session(config, tempfile.mkdtemp(), "bench", logging.getLogger())
        await session.ready()
        lines = build_session(config, tempfile.mkdtemp(), "bench-lines", logging.getLogger())
        lines.supervisor._runtime_options = dataclasses.replace(
            lines.supervisor._runtime_options, blob_chars=0
        )  # every byte through the daemon's lines
        await lines.ready()
        plain = await session.sandbox.toolbox.create_context()
        for s in (session, lines):
            await s.execute(Cell(MAKE_PNG, 1), Recorder())
        await plain.run_code(MAKE_PNG, lambda text: None, lambda text: None)
        samples: dict[str, list[float]] = {"file": [], "lines": [], "raw": []}
        for i in range(reps + 1):
            for name, s in (("file", session), ("lines", lines)):
                front = Recorder()
                t0 = time.perf_counter()
                await s.execute(Cell(display, i + 2), front)
                if i:
                    samples[name].append(time.perf_counter() - t0)
                assert len(front.outputs[0][1]["data"]["image/png"]) == 2796204, "lost output"
            got: list[str] = []
            t0 = time.perf_counter()
            await plain.run_code(PRINT_PNG, got.append, got.append)
            if i:
                samples["raw"].append(time.perf_counter() - t0)
            assert sum(map(len, got)) == 2796204, "lost output"
        await plain.close()
        for s in (session, lines):
            await s.shutdown()
        return ms(stats(samples["file"])), ms(stats(samples["lines"])), ms(stats(samples["raw"]))

    return asyncio.run(go())


def raw_bulk_upload(emu: DaytonaEmulator, files: list[tuple[bytes, str]]) -> float:
    from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams, DaytonaConfig, FileUpload

    async def go() -> float:
        client = AsyncDaytona(DaytonaConfig(api_key=emu.api_key, api_url=emu.api_url, target="us"))
        sandbox = await client.create(CreateSandboxFromSnapshotParams(labels={"bench": "upload"}, auto_delete_interval=0))
        uploads = [FileUpload(source=content, destination=f"raw/{name}") for content, name in files]
        t0 = time.perf_counter()
        await sandbox.fs.upload_files(uploads)
        elapsed = time.perf_counter() - t0
        await sandbox.delete()
        await client.close()
        return elapsed

    return asyncio.run(go())


# -- the run --------------------------------------------------------------------------


def compile_package(package: Path = ROOT / "daytona_kernel") -> None:
    """Byte-compile this checkout's package, as pip does when it installs one: an editable install on a
    machine that sets PYTHONDONTWRITEBYTECODE (this one does) compiled its 39 modules from source at every
    kernel start and restart (0.15 s each here), which an installed kernel never does."""
    compileall.compile_dir(str(package), quiet=1)


def install_kernelspecs(prefix: Path) -> None:
    """This checkout's kernelspecs, in a throwaway prefix that Jupyter searches first."""
    from daytona_kernel import kernelspec

    kernelspec.install(prefix=str(prefix))
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter") + os.pathsep + os.environ.get("JUPYTER_PATH", "")


STOPPING_S = 3.0  # how long a Daytona sandbox takes to stop and to start, roughly
STARTING_S = 2.0
POOL_CREATING_S = 1.0  # how long creating a sandbox takes in the pool figure


def run(quick: bool) -> Report:
    reps = 15 if quick else 200
    few = 2 if quick else 5
    report = Report(
        f"{platform.node()} ({os.cpu_count()} cores, Python {platform.python_version()})",
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        quick,
    )
    add = report.figures.append
    data_dir = tempfile.mkdtemp(prefix="daytona-kernel-bench-")
    os.environ["JUPYTER_DATA_DIR"] = data_dir
    install_kernelspecs(Path(data_dir) / "prefix")
    compile_package()
    emu = DaytonaEmulator(Path(data_dir) / "emulator").start()
    emu_env = emu.env()
    work = Path(tempfile.mkdtemp(prefix="bench-nb-"))
    try:
        stock, local = (
            Kernel("python3", cwd=str(work)),
            Kernel("daytona-local", cwd=str(work), env={"DAYTONA_KERNEL_OUTPUT_LIMIT_MB": "0"}),
        )
        remote = Kernel("daytona", cwd=str(work), env={**emu_env, "DAYTONA_KERNEL_OUTPUT_LIMIT_MB": "0"})
        for k in (stock, local, remote):
            k.execute("pass")
        base_noop = noop_latency(stock, reps)
        add(Figure("no-op cell, daytona-local vs ipykernel", "ms", noop_latency(local, reps), base_noop, "ipykernel", "≤ 1.5×"))
        raw_noop, raw_first = raw_sdk_noop(emu, reps)
        emu.reset_counts()
        remote_noop = noop_latency(remote, reps)
        requests = sum(emu.counts.values()) / (reps + 3)
        add(
            Figure(
                "no-op cell, daytona (emulator) vs raw run_code",
                "ms",
                remote_noop,
                raw_noop,
                "AsyncSandbox.code_interpreter.run_code('pass')",
                "≤ 1.2× + 2 ms",
                note="end to end through jupyter_client: includes the Jupyter protocol round trip, which is what stock ipykernel's whole no-op costs",
            )
        )
        layer, raw_layer = session_layer_noop(emu, reps)
        add(
            Figure(
                "no-op cell at the session layer vs raw run_code, same context",
                "ms",
                layer,
                raw_layer,
                "the backend's run_code('pass')",
                "≤ 1.2× + 2 ms",
                note="our own cost per cell: wrapping, framing, sync check, decoding",
            )
        )
        add(
            Figure(
                "requests per plain cell (emulator)",
                "requests",
                {"median": requests, "min": requests, "max": requests, "n": reps + 3},
                goal="exactly 1",
            )
        )
        n_first = max(5, reps // 10)
        base_first = first_output_latency(stock, n_first)
        add(
            Figure(
                "first output, daytona-local vs ipykernel",
                "ms",
                first_output_latency(local, n_first),
                base_first,
                "ipykernel",
                "≤ 50 ms",
            )
        )
        add(
            Figure(
                "first output, daytona (emulator) vs raw run_code",
                "ms",
                first_output_latency(remote, n_first),
                raw_first,
                "raw run_code on_stdout",
                "≤ 50 ms",
            )
        )
        mb = 5 if quick else 50
        base_tp = throughput(stock, mb, 1 if quick else 2)
        add(
            Figure(
                f"stream throughput, {mb} MB in 1 KB lines, daytona-local vs ipykernel",
                "MB/s",
                throughput(local, mb, 1 if quick else 2),
                base_tp,
                "ipykernel",
                "≥ 0.5×",
            )
        )
        add(
            Figure(
                f"stream throughput, {mb} MB in 1 KB lines, daytona (emulator) vs ipykernel",
                "MB/s",
                throughput(remote, mb, 1 if quick else 2),
                base_tp,
                "ipykernel",
                "≥ 0.5×",
            )
        )
        base_png = rich_display(stock, few * 2)
        add(
            Figure(
                "2 MB PNG display, daytona-local vs ipykernel",
                "ms",
                rich_display(local, few * 2),
                base_png,
                "ipykernel",
                "≤ 1.5×",
            )
        )
        remote_png = rich_display(remote, few * 2)
        add(Figure("2 MB PNG display, daytona (emulator) vs ipykernel", "ms", remote_png, base_png, "ipykernel"))
        add(
            Figure(
                "2 MB PNG display, daytona (emulator) vs raw run_code printing the same bytes",
                "ms",
                remote_png,
                raw_sdk_print(emu, few * 2),
                "run_code printing the 2.7 MB of base64 in 256 KiB pieces",
                "≤ 1.3×",
                note="the raw run_code pays no Jupyter message: the kernel's own JSON encoding and signing of the 2.7 MB display, and the client's decoding, are in ours only",
            )
        )
        png_file, png_lines, png_raw = session_layer_png(emu, few * 2)
        add(
            Figure(
                "2 MB PNG display at the session layer (its string in a file, one download) vs raw run_code printing the same bytes",
                "ms",
                png_file,
                png_raw,
                "the backend's run_code printing them in a plain context",
                "≤ 1.3×",
                note="what the kernel adds before Jupyter: the runtime, the file, the download, the output policy",
            )
        )
        add(
            Figure(
                "2 MB PNG display at the session layer, through the daemon's lines (blob_chars 0) vs a file and one download",
                "ms",
                png_lines,
                png_file,
                "the same display through a file",
            )
        )
        base_int = interrupt_latency(stock, few)
        add(
            Figure(
                "interrupt to error reply, daytona-local vs ipykernel",
                "ms",
                interrupt_latency(local, few),
                base_int,
                "ipykernel",
                "≤ 1 s",
            )
        )
        add(
            Figure(
                "interrupt to error reply, daytona (emulator) vs ipykernel",
                "ms",
                interrupt_latency(remote, few),
                base_int,
                "ipykernel",
                "≤ 1 s",
            )
        )
        loop_int, base_loop_int = in_turns(
            lambda n: printing_loop_interrupt(local, n), lambda n: printing_loop_interrupt(stock, n), reps=few
        )
        add(
            Figure(
                "interrupt a printing loop to error reply, daytona-local vs ipykernel",
                "ms",
                loop_int,
                base_loop_int,
                "ipykernel",
                "≤ 1.5×",
                note="taken in turns with its baseline",
            )
        )
        comp_reps = max(10, reps // 4)
        stock.execute("alpha_value = 1")
        local.execute("alpha_value = 1")
        base_comp = ms(timed(lambda: stock.request("complete", "alpha_v", 7), comp_reps))
        add(
            Figure(
                "complete_request, daytona-local vs ipykernel",
                "ms",
                ms(timed(lambda: local.request("complete", "alpha_v", 7), comp_reps)),
                base_comp,
                "ipykernel",
                "≤ 30 ms",
            )
        )
        base_isc = ms(timed(lambda: stock.request("is_complete", "for i in x:"), comp_reps))
        add(
            Figure(
                "is_complete_request, daytona-local vs ipykernel",
                "ms",
                ms(timed(lambda: local.request("is_complete", "for i in x:"), comp_reps)),
                base_isc,
                "ipykernel",
                "≤ 5 ms",
            )
        )
        rss = {}
        for i in range(100 if quick else 1000):
            local.execute(f"v{i % 10} = [{i}] * 100\nprint({i})")
            if i + 1 in (100, 1000):
                rss[i + 1] = rss_kb(local)
        endurance = {
            "median": rss.get(1000, rss[100]) / 1024,
            "min": rss[100] / 1024,
            "max": rss.get(1000, rss[100]) / 1024,
            "n": len(rss),
        }
        add(
            Figure(
                "kernel RSS after 100 cells (min) and after 1,000 cells (median, max)",
                "MB",
                endurance,
                goal="within 20% of cell 100",
            )
        )
        base_restart = restart_to_first_result(stock, few)
        add(
            Figure(
                "restart to first result, daytona-local vs ipykernel",
                "s",
                restart_to_first_result(local, few),
                base_restart,
                "ipykernel",
            )
        )
        after, base_after = in_turns(
            lambda n: after_restart_to_first_result(local, n), lambda n: after_restart_to_first_result(stock, n), reps=few
        )
        add(
            Figure(
                "first cell after a restart, from kernel_info answered, daytona-local vs ipykernel",
                "s",
                after,
                base_after,
                "ipykernel",
                "≤ 1.5×",
                note="taken in turns with its baseline; the restart itself is the figure above",
            )
        )
        emu.transition_s.update(stopping=STOPPING_S, starting=STARTING_S)  # a restart that stopped its sandbox would pay these
        check_context_lock()
        add(
            Figure(
                "restart to first result, daytona (emulator), reused sandbox",
                "s",
                restart_to_first_result(remote, few),
                base_restart,
                "ipykernel",
                "≤ 1 s",
                note=f"the emulator's stop takes {STOPPING_S:g} s and its start {STARTING_S:g} s, as on Daytona: a restart keeps the sandbox running; "
                "its contexts are made and deleted under the daemon's per-sandbox lock (interpreter/manager.go), checked before the figure",
            )
        )
        emu.transition_s.update(stopping=TRANSITION_S, starting=TRANSITION_S)
        report.figures += widget_figures(stock, local, remote, raw_noop, few)
        for k in (stock, local, remote):
            k.close()
        base_start = start_to_first_result("python3", few)
        add(
            Figure(
                "start to first result, daytona-local vs ipykernel",
                "s",
                start_to_first_result("daytona-local", few),
                base_start,
                "ipykernel",
                "≤ 2 s",
            )
        )
        first, base_first_cell = in_turns(
            lambda n: ready_to_first_result("daytona-local", n), lambda n: ready_to_first_result("python3", n), reps=few
        )
        add(
            Figure(
                "first cell of a new kernel, from kernel_info answered, daytona-local vs ipykernel",
                "s",
                first,
                base_first_cell,
                "ipykernel",
                "≤ 1.5×",
                note="taken in turns with its baseline: what a user waits after JupyterLab shows the kernel idle",
            )
        )
        cold_env = {**emu_env, "DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral"}
        starts = start_figures(emu, cold_env, str(work), few * 2, base_start)
        report.figures += starts
        cold = starts[0].ours
        add(
            Figure(
                "start to first result, daytona (emulator), cold, IPython shipped to a sandbox without it",
                "s",
                shipped_ipython_start(few, Path(data_dir)),
                cold,
                "cold start with IPython in the sandbox",
                "≤ baseline + 2 s",
            )
        )
        warm = start_to_first_result("daytona", few, emu_env, str(work))
        add(Figure("start to first result, daytona (emulator), warm: reused sandbox", "s", warm, base_start, "ipykernel"))
        emu.sandbox_class = "linux-vm"  # a class that pauses
        paused_nb = tempfile.mkdtemp(prefix="bench-paused-nb-")
        raw_resume = raw_sdk_resume(emu, few)
        add(
            Figure(
                "resume to first result after a pause, daytona (emulator), vs the raw SDK's start() and run_code",
                "s",
                resume_to_first_result(emu, emu_env, paused_nb, few),
                raw_resume,
                "SDK start() of the paused sandbox, then run_code",
                "≤ baseline + 0.3 s",
                note=f"the emulator's resuming takes {TRANSITION_S:g} s; both learn it ended from the Socket.IO state event",
            )
        )
        emu.sandbox_class = "container"
        report.figures += sync_figures(emu, quick)
        report.figures += fanout_figures(emu, emu_env, few)
    except Exception as exc:  # the figures taken so far still make a page (which says the run stopped), and main fails
        traceback.print_exc()
        report.stopped = f"{type(exc).__name__}: {exc}"
    finally:
        emu.close()
    judge(report)
    return report


def sync_figures(emu: DaytonaEmulator, quick: bool) -> list[Figure]:
    """The mirror's no-change check on 10,000 files, and its first upload against one raw bulk upload,
    in a scratch folder of their own (the folders and the mirror's manifests), removed afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    try:
        return _sync_figures(emu, quick, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _sync_figures(emu: DaytonaEmulator, quick: bool, scratch: Path) -> list[Figure]:
    import logging

    from daytona_kernel.backends.daytona.sandbox import DaytonaSandbox
    from daytona_kernel.config import DaytonaKernelConfig, DaytonaSettings, settings_from
    from daytona_kernel.mirror.mirror import WorkdirMirror

    figures = []
    tree = scratch / "tree"
    tree.mkdir()
    for i in range(10000):
        sub = tree / f"d{i // 500:02d}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i:05d}.txt").write_text("x" * 100)
    # A project that exists before the kernel starts: files written an hour ago. The manifest hashes a file
    # whose mtime was within RACY_WINDOW_NS (2 s) of its recording (a same-size rewrite in the same second
    # would keep size and mtime), so a tree written just now would time that window, not the check.
    settled = time.time_ns() - 3600 * 10**9
    for path in tree.glob("*/*.txt"):
        os.utime(path, ns=(settled, settled))
    config = DaytonaKernelConfig()
    mirror = WorkdirMirror(str(tree), _NoNetwork(), config, scratch / "manifests" / "tree.json", logging.getLogger())  # type: ignore[arg-type]
    asyncio.run(mirror.push())
    plan = mirror.plan_up()
    if plan.todo or plan.deleted:  # then the figure would time an upload's planning, not the no-change check
        raise RuntimeError(f"the no-change check found {len(plan.todo)} file(s) to send and {len(plan.deleted)} deleted")
    check = ms(timed(lambda: mirror.plan_up(), 3 if quick else 10, warmup=1))
    figures.append(Figure("sync no-change check, 10,000 files", "ms", check, goal="≤ 100 ms, 0 requests"))

    small = scratch / "small"
    small.mkdir()
    files = []
    for i in range(1000):
        content = os.urandom(10 * 1024)
        (small / f"f{i:04d}.bin").write_bytes(content)
        files.append((content, f"f{i:04d}.bin"))
    raw = raw_bulk_upload(emu, files)
    os.environ.update(emu.env())
    config = DaytonaKernelConfig()
    config.sandbox_policy = "ephemeral"
    sandbox = DaytonaSandbox(settings_from(DaytonaSettings, config), "bench-sync", "bench")

    async def first_sync() -> tuple[float, int]:
        await sandbox.start(lambda text: None)
        mirror = WorkdirMirror(str(small), sandbox, config, scratch / "manifests" / "small.json", logging.getLogger())
        emu.reset_counts()
        t0 = time.perf_counter()
        await mirror.push()
        elapsed = time.perf_counter() - t0
        uploads = emu.count("files/bulk-upload")
        await sandbox.shutdown()
        return elapsed, uploads

    elapsed, uploads = asyncio.run(first_sync())
    mb = 1000 * 10 / 1024
    ours = {"median": mb / elapsed, "min": mb / elapsed, "max": mb / elapsed, "n": 1}
    base = {"median": mb / raw, "min": mb / raw, "max": mb / raw, "n": 1}
    figures.append(
        Figure(
            f"first sync, 1,000 × 10 KB files ({uploads} bulk request(s))", "MB/s", ours, base, "one raw upload_files", "≥ 0.5×"
        )
    )
    return figures


class _NoNetwork:
    """A sandbox for the pure no-change check: the first push records the manifest locally."""

    workdir = "/remote"
    generation = 0  # one sandbox throughout (the mirror resets its manifest when this changes)
    on_this_disk = False  # a remote sandbox: files go up as bytes

    @property
    def toolbox(self) -> _NoNetwork:
        return self  # its own toolbox

    async def upload(self, files: list[tuple[bytes, str]]) -> None:
        return None


GOAL_RATIO = re.compile(r"(≤|≥) ([\d.]+)×(?: \+ ([\d.]+) (ms|s))?")
GOAL_PLUS = re.compile(r"≤ baseline \+ ([\d.]+) (ms|s)")
GOAL_ABSOLUTE = re.compile(r"≤ ([\d.]+) (ms|s)(, 0 requests)?")
OTHER_GOALS: dict[str, Callable[[Figure], bool]] = {
    "exactly 1": lambda f: abs(f.ours["median"] - 1) < 0.01,
    "within 20% of cell 100": lambda f: f.ours["max"] <= 1.2 * f.ours["min"],
}


def _in_unit(value: float, unit: str, figure_unit: str) -> float:
    return value * 1000 if (unit, figure_unit) == ("s", "ms") else value / 1000 if (unit, figure_unit) == ("ms", "s") else value


def goal_line(f: Figure) -> tuple[float, bool] | None:
    """The goal as a ratio to the figure's baseline, and whether a lower ratio is better (None: no such line)."""
    base = f.baseline["median"] if f.baseline else None
    if not base:
        return None
    if m := GOAL_RATIO.fullmatch(f.goal):
        extra = _in_unit(float(m[3]), m[4], f.unit) / base if m[3] else 0.0
        return float(m[2]) + extra, m[1] == "≤"
    if m := GOAL_PLUS.fullmatch(f.goal):
        return (base + _in_unit(float(m[1]), m[2], f.unit)) / base, True
    if m := GOAL_ABSOLUTE.fullmatch(f.goal):
        return _in_unit(float(m[1]), m[2], f.unit) / base, True
    return None


def fanout_figures(emu: DaytonaEmulator, env: dict[str, str], few: int) -> list[Figure]:
    """``%%daytona map``: parallel work once the pool exists, and what making a pool of 8 costs."""
    one_sleeper = {"median": 3.0, "min": 3.0, "max": 3.0, "n": 1}
    figures = [
        Figure(
            "%%daytona map 4 of 3 s sleeps, pool existing, daytona-local",
            "s",
            map_of_sleepers("daytona-local", few),
            one_sleeper,
            "one 3 s sleep",
            "≤ 4 s",
        ),
        Figure(
            "%%daytona map 4 of 3 s sleeps, pool existing, daytona (emulator)",
            "s",
            map_of_sleepers("daytona", few, env),
            one_sleeper,
            "one 3 s sleep",
            "≤ 4 s",
        ),
    ]
    emu.transition_s.update(creating=POOL_CREATING_S)  # a create that takes time, as on Daytona, so a queue would show
    figures.append(
        Figure(
            "creating 8 worker sandboxes at once vs 1, daytona (emulator)",
            "s",
            worker_creation(emu, 8, few),
            worker_creation(emu, 1, few),
            "creating 1",
            "≤ 1.5×",
            note=f"the emulator's creating takes {POOL_CREATING_S:g} s; create, wait for started, working directory",
        )
    )
    figures.append(
        Figure(
            "first %%daytona map 8 vs map 1, daytona (emulator)",
            "s",
            pool_creation(emu, env, 8, few),
            pool_creation(emu, env, 1, few),
            "map 1",
            note="includes starting IPython in each worker: on the emulator the 8 workers' processes share this "
            "machine's cores, where on Daytona each sandbox has its own",
        )
    )
    emu.transition_s.update(creating=TRANSITION_S)
    return figures


def judge(report: Report) -> None:
    """Compare each figure with its goal; a missed goal is shown as missed, never hidden."""
    for f in report.figures:
        line, m = goal_line(f), f.ours["median"]
        if line is not None and f.ratio is not None:
            met = f.ratio <= line[0] if line[1] else f.ratio >= line[0]
        elif goal := GOAL_ABSOLUTE.fullmatch(f.goal):
            met = m <= _in_unit(float(goal[1]), goal[2], f.unit)
        elif f.goal in OTHER_GOALS:
            met = OTHER_GOALS[f.goal](f)
        else:
            if f.goal:
                raise ValueError(f"no rule judges the goal {f.goal!r} of {f.name!r}")
            continue
        f.verdict = "met" if met else "MISSED"


def table(report: Report) -> str:
    lines = [
        f"daytona-kernel benchmarks — {report.machine}, {report.started}{' (quick)' if report.quick else ''}",
        "",
        "| figure | ours (median [min–max]) | baseline (median) | ratio | goal | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for f in report.figures:
        o = f.ours
        ours = f"{o['median']:.2f} [{o['min']:.2f}–{o['max']:.2f}] {f.unit}"
        base = f"{f.baseline['median']:.2f} {f.unit} ({f.baseline_name})" if f.baseline else "—"
        ratio = f"{f.ratio:.2f}×" if f.ratio is not None else "—"
        lines.append(f"| {f.name} | {ours} | {base} | {ratio} | {f.goal or '—'} | {f.verdict or '—'} |")
    return "\n".join(lines)


def chart(report: Report, path: Path) -> None:
    """Every figure that has a ratio, against its goal line (log scale: 1× is the baseline)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [f for f in report.figures if f.ratio is not None]
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(shown) + 1.6))
    for y, f in enumerate(shown):
        colour = {"met": "#3a923a", "MISSED": "#c0392b"}.get(f.verdict, "#8c8c8c")
        ax.barh(y, f.ratio, color=colour, height=0.6)
        ax.annotate(f"{f.ratio:.2f}×", (f.ratio, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
        line = goal_line(f)
        if line is not None:
            ax.plot([line[0], line[0]], [y - 0.42, y + 0.42], color="black", linewidth=2.2)
    ax.set_xscale("log")
    ax.axvline(1.0, color="#555555", linewidth=0.8, linestyle=":")
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([textwrap.shorten(f.name, 95, placeholder="…") for f in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ours ÷ baseline (log scale)\nblack tick: the goal; green: met, red: missed, grey: no goal", fontsize=9)
    fig.suptitle(f"daytona-kernel benchmarks\n{report.machine}, {report.started}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


BEGIN, END = "<!-- begin: written by python -m benchmarks -->", "<!-- end: written by python -m benchmarks -->"


def write_page(report: Report, page: Path, load: tuple[float, float]) -> None:
    """The page's generated part (machine, date, load, the table, the chart), between its markers;
    the rest of the page (how to read it, the profiles) is left as it is."""
    image = page.with_suffix(".png")
    chart(report, image)
    cores = os.cpu_count() or 1
    busy = f"The machine's 1-minute load average was {load[0]:.1f} at the start and {load[1]:.1f} at the end ({cores} cores)"
    busy += (
        ": other work loaded it, so absolute times are inflated; the ratios compare figures taken moments apart."
        if max(load) > 0.5 * cores
        else "."
    )
    stopped = (
        f"**The run stopped before its last figure** ({report.stopped}); the figures after it are missing.\n\n"
        if report.stopped
        else ""
    )
    block = "\n".join(
        [BEGIN, "", table(report), "", stopped + busy, "", f"![every ratio against its goal]({image.name})", "", END]
    )
    text = page.read_text() if page.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        raise ValueError(f"{page} has no {BEGIN} … {END} block to replace")
    head, rest = text.split(BEGIN, 1)
    page.write_text(head + block + rest.split(END, 1)[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few repetitions: a smoke test of the suite")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results.json"), help="where to write the JSON")
    parser.add_argument(
        "--page",
        help="the page to write the table and chart into (default: docs/benchmarks.md for a full "
        "run; beside --out for --quick, so a smoke run never touches the docs)",
    )
    args = parser.parse_args(argv)
    page = Path(args.page) if args.page else Path(args.out).with_suffix(".md") if args.quick else ROOT / "docs" / "benchmarks.md"
    load_start = os.getloadavg()[0]
    report = run(args.quick)
    load = (load_start, os.getloadavg()[0])
    print(table(report))
    Path(args.out).write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    write_page(report, page, load)
    print(f"\nwrote {args.out}, {page} and {page.with_suffix('.png')}")
    if report.stopped:
        print(f"the run stopped early: {report.stopped}", file=sys.stderr)
        return 1
    return 0
