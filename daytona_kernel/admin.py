"""``daytona-kernel gc`` and ``daytona-kernel doctor``: housekeeping outside a kernel."""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from jupyter_core.paths import jupyter_runtime_dir

from .config import DaytonaKernelConfig, config_outside_kernel, has_credentials
from .errors import DaytonaKernelError

log = logging.getLogger("daytona_kernel.admin")


def load_config() -> DaytonaKernelConfig:
    """The configuration a kernel started now would get (config files, then environment)."""
    return config_outside_kernel()


# -- gc ---------------------------------------------------------------------------


@dataclass
class Orphan:
    sandbox: Any
    reason: str
    action: str  # "delete" or "stop"


def running_kernel_ids() -> set[str]:
    """Ids of daytona kernels running on this machine.

    A kernel's id is the stem of its connection file (``kernel-<id>.json``). Running
    processes of ``python -m daytona_kernel -f FILE`` are found through /proc where it
    exists; connection files in Jupyter's runtime folder count as running too.
    """
    from .compose import kernel_id_of

    ids = {kernel_id_of(path) for path in Path(jupyter_runtime_dir()).glob("kernel-*.json")}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue  # the process ended while we looked
        if b"daytona_kernel" in argv and b"-f" in argv[:-1]:
            ids.add(kernel_id_of(argv[argv.index(b"-f") + 1].decode(errors="replace")))
    return ids


async def find_orphans(client: Any, older_than_s: float) -> list[Orphan]:
    """Kernel sandboxes of this user and host whose kernel is gone, or idle past the threshold."""
    from daytona import ListSandboxesQuery

    from .backends.daytona import LABEL_APP, LABEL_KERNEL, LABEL_OWNER, LABEL_POLICY, parse_time

    me = f"{getpass.getuser()}@{socket.gethostname()}"
    alive = running_kernel_ids()
    orphans = []
    async for sandbox in client.list(ListSandboxesQuery(labels={LABEL_APP: "true", LABEL_OWNER: me})):
        state = str(getattr(sandbox.state, "value", sandbox.state))
        if state in ("destroyed", "destroying"):
            continue
        ephemeral = sandbox.labels.get(LABEL_POLICY) == "ephemeral"
        action = "delete" if ephemeral else "stop"
        last = parse_time(sandbox.last_activity_at) or parse_time(sandbox.updated_at)
        idle = time.time() - last if last is not None else None
        kernel = sandbox.labels.get(LABEL_KERNEL, "")
        if kernel not in alive and (state == "started" or ephemeral):
            orphans.append(Orphan(sandbox, f"its kernel {kernel or '(unknown)'} no longer runs here", action))
        elif idle is not None and idle > older_than_s and state == "started":
            orphans.append(Orphan(sandbox, f"idle for {idle / 3600:.1f} h", action))
    return orphans


async def gc(older_than_s: float, dry_run: bool, out: Callable[[str], None]) -> int:
    from daytona import AsyncDaytona

    from daytona.common.errors import DaytonaError

    from .backends.daytona import translate_error

    try:
        client = AsyncDaytona()
    except DaytonaError as exc:
        out(f"error: {translate_error(exc, 'connect to Daytona')}")
        return 2
    try:
        orphans = await find_orphans(client, older_than_s)
        if not orphans:
            out("No orphaned daytona-kernel sandboxes.")
        for orphan in orphans:
            verb = f"would {orphan.action}" if dry_run else {"delete": "deleted", "stop": "stopped"}[orphan.action]
            if not dry_run:
                if orphan.action == "delete":
                    await orphan.sandbox.delete()
                else:
                    await orphan.sandbox.stop()
            out(f"{verb} {orphan.sandbox.id}: {orphan.reason}")
        return 0
    except DaytonaError as exc:
        out(f"error: {translate_error(exc, 'clean up sandboxes')}")
        return 1
    finally:
        await client.close()


# -- doctor -------------------------------------------------------------------------


class Checks:
    """Collects one line per check: ``ok: ...`` or ``FAIL: ... fix: ...``."""

    def __init__(self, out: Callable[[str], None]) -> None:
        self._out = out
        self.failed = 0

    def ok(self, what: str) -> None:
        self._out(f"ok: {what}")

    def fail(self, what: str, fix: str) -> None:
        self.failed += 1
        self._out(f"FAIL: {what} fix: {fix}")


async def _round_trip(config: DaytonaKernelConfig, checks: Checks) -> None:
    """Start a throwaway sandbox context and run one cell, the way a kernel does."""
    from .cell import Cell, Recorder
    from .compose import build_session

    config.sandbox_policy = "ephemeral"
    session = build_session(config, tempfile.mkdtemp(prefix="daytona-kernel-doctor-"), "doctor", log, mirror=False)
    frontend = Recorder()
    try:
        outcome = await session.execute(Cell("print(6 * 7)", 1), frontend)
        text = frontend.text()
        if outcome.error is None and text == "42\n":
            checks.ok(f"a cell ran in {session.sandbox.description}")
        else:
            detail = outcome.error["evalue"] if outcome.error else f"unexpected output {text!r}"
            checks.fail(f"a test cell did not run: {detail}", "see the message; `daytona-kernel doctor` again after fixing it")
    finally:
        try:
            await session.shutdown()
        except DaytonaKernelError as exc:
            checks.fail(f"the test sandbox could not be removed: {exc}", "delete it in the Daytona dashboard")


async def doctor(out: Callable[[str], None], round_trip: bool = True) -> int:
    from . import kernelspec

    checks = Checks(out)
    try:
        config = load_config()
    except Exception as exc:  # a config file that does not even load
        checks.fail(f"configuration could not be loaded: {exc}", "correct daytona_kernel_config.py / jupyter_config")
        return 1
    problems = config.validate(check_credentials=False)
    if problems:
        for problem in problems:
            checks.fail(f"configuration: {problem}", "see the message above")
    else:
        checks.ok(f"configuration (backend={config.backend})")
    specs = kernelspec.ours()
    for name in kernelspec.DEFAULT_SPECS:
        spec = specs.get(name)
        if spec is None:
            checks.fail(f"kernelspec {name} is not installed", "run `daytona-kernel install --user`")
        elif not os.path.exists(spec["spec"]["argv"][0]):
            checks.fail(f"kernelspec {name} points at a missing Python {spec['spec']['argv'][0]}", "run `daytona-kernel install --user` again")
        else:
            checks.ok(f"kernelspec {name} ({spec['resource_dir']})")
    if config.backend == "daytona":
        await _check_daytona(config, checks)
    if round_trip and not checks.failed:
        await _round_trip(config, checks)
    return 1 if checks.failed else 0


async def _check_daytona(config: DaytonaKernelConfig, checks: Checks) -> None:
    from daytona import AsyncDaytona, ListSandboxesQuery
    from daytona.common.errors import DaytonaError

    from .backends.daytona import translate_error

    if not has_credentials():
        checks.fail("credentials: DAYTONA_API_KEY is not set", "export DAYTONA_API_KEY=... (from the Daytona dashboard)")
        return
    checks.ok("credentials: DAYTONA_API_KEY is set")
    try:
        client = AsyncDaytona()
    except DaytonaError as exc:
        checks.fail(f"credentials: {translate_error(exc, 'connect')}", "check DAYTONA_API_KEY / DAYTONA_API_URL")
        return
    try:
        try:
            async for _ in client.list(ListSandboxesQuery(limit=1)):
                break
            checks.ok(f"API reachable at {config.api_url or os.environ.get('DAYTONA_API_URL') or 'https://app.daytona.io/api'}")
        except DaytonaError as exc:
            checks.fail(f"API: {translate_error(exc, 'list sandboxes')}", "check DAYTONA_API_KEY, DAYTONA_API_URL and your network")
            return
        if config.snapshot:
            try:
                await client.snapshot.get(config.snapshot)
                checks.ok(f"snapshot {config.snapshot} exists")
            except DaytonaError as exc:
                checks.fail(f"snapshot {config.snapshot}: {exc}", "set DAYTONA_KERNEL_SNAPSHOT to an existing snapshot")
        try:
            volume = await client.volume.get(config.volume_name)
            state = str(getattr(volume.state, "value", volume.state))
            if state == "error":
                checks.fail(f"volume {config.volume_name} is in the error state", "delete it or set DAYTONA_KERNEL_VOLUME_NAME")
            else:
                checks.ok(f"volume {config.volume_name} ({state})")
        except DaytonaError:
            checks.ok(f"volume {config.volume_name} does not exist yet; the first kernel creates it")
    finally:
        await client.close()


def run(coro: Any) -> int:
    return int(asyncio.run(coro))
