"""``daytona-kernel gc``, ``doctor`` and ``config``: housekeeping outside a kernel."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from jupyter_core.paths import jupyter_config_dir, jupyter_config_path, jupyter_runtime_dir

from .config import ENV_PREFIX, MASK, SECTION, DaytonaKernelConfig, config_outside_kernel, has_credentials, masked
from .config import load_config as load_config_files
from .errors import DaytonaKernelError

log = logging.getLogger("daytona_kernel.admin")

Out = Callable[[str], None]
API_KEYS_PAGE = "https://app.daytona.io/dashboard/keys"
DEFAULT_API_URL = "https://app.daytona.io/api"
NO_KEY = (
    "DAYTONA_API_KEY is not set",
    f"export DAYTONA_API_KEY=... (create a key at {API_KEYS_PAGE}), or run on this machine without an "
    "account: pick the 'Python (Daytona local)' kernel (daytona-local) or set DAYTONA_KERNEL_BACKEND=local",
)
# Sandbox states gc may act on. Anything else is a transition (starting, stopping, archiving,
# creating, pausing, resuming, restoring ...), and stopping or deleting then races the platform.
SETTLED_STATES = frozenset({"started", "stopped", "archived", "paused", "error", "build_failed"})
PAUSED_MAX_AGE_S = 7 * 86400.0  # gc stops a sandbox paused (idle) this long: as long as Daytona keeps a stopped one unarchived
GONE_STATES = frozenset({"destroyed", "destroying"})


# -- configuration --------------------------------------------------------------------


def load_config_with_sources(kernel: str | None = None) -> tuple[DaytonaKernelConfig, dict[str, str]]:
    """The configuration a kernel started now would get, and where each set value came from; with
    ``kernel``, a kernel started from that kernelspec (its kernel.json's environment on top)."""
    sources: dict[str, str] = {}
    if kernel is None:
        return config_outside_kernel(load_config_files(sources=sources)), sources
    from . import kernelspec

    spec_env = kernelspec.all_specs()[kernel]["spec"].get("env", {})
    config = load_config_files(sources=sources, environ={**os.environ, **spec_env})
    for name in DaytonaKernelConfig.class_trait_names(config=True):
        if ENV_PREFIX + name.upper() in spec_env:
            sources[name] = f"kernelspec {kernel}"
    return config_outside_kernel(config), sources


def load_config() -> DaytonaKernelConfig:
    """The configuration a kernel started now would get (config files, then environment)."""
    return config_outside_kernel()


def show_config(out: Out, kernel: str | None = None) -> int:
    """Print every setting with its effective value and where that value came from (in a kernel
    started from the kernelspec ``kernel``, when given)."""
    config, sources = load_config_with_sources(kernel)
    problems = config.validate(check_credentials=False)
    out(f"# daytona-kernel configuration (config files: {', '.join(jupyter_config_path())})")
    if kernel is not None:
        out(f"# as a kernel started from the kernelspec {kernel} gets it (its kernel.json's env on top)")
    for name in sorted(DaytonaKernelConfig.class_trait_names(config=True)):
        value = getattr(config, name)
        if name == "env":  # the sandbox's environment: its values are often tokens
            value = dict.fromkeys(value, MASK)
        origin = sources.get(name, "default")
        out(f"{name} = {masked(value)!r}  # {origin}")
    out("# Daytona credentials (the SDK's own variables; never stored by this kernel)")
    out(f"DAYTONA_API_KEY: {'set' if os.environ.get('DAYTONA_API_KEY') else 'not set'}")
    api_url = config.api_url or os.environ.get("DAYTONA_API_URL") or DEFAULT_API_URL
    url_origin = "api_url" if config.api_url else "DAYTONA_API_URL" if os.environ.get("DAYTONA_API_URL") else "default"
    out(f"API URL: {masked(api_url)}  # {url_origin}")
    target = config.target or os.environ.get("DAYTONA_TARGET") or "(your organization's default)"
    out(f"target: {target}")
    from .identity import owner_id_path

    out(f"owner id file: {owner_id_path()}")
    for problem in problems:
        out(f"problem: {problem}")
    return 1 if problems else 0


def config_template() -> str:
    """A commented daytona_kernel_config.py listing every setting with its help and default."""
    section: type[DaytonaKernelConfig] = type(SECTION, (DaytonaKernelConfig,), {"__doc__": DaytonaKernelConfig.__doc__})
    body = section.class_config_section()
    header = (
        "# Configuration file for daytona-kernel.\n"
        "#\n"
        "# Every setting can also be given as an environment variable DAYTONA_KERNEL_<NAME>\n"
        "# (which beats this file), or on the kernel's command line (--DaytonaKernel.<name>=...).\n"
        "# Credentials are not set here: export DAYTONA_API_KEY (and DAYTONA_API_URL, DAYTONA_TARGET).\n"
        "# `daytona-kernel config` shows the values in effect and where each one came from.\n\n"
        "c = get_config()  # noqa\n\n"
    )
    return header + body


def generate_config(out: Out, force: bool, confirm: Callable[[str], bool]) -> int:
    path = Path(jupyter_config_dir()) / "daytona_kernel_config.py"
    if path.exists() and not force and not confirm(f"Overwrite {path} with the default config?"):
        out(f"Kept {path}.")
        return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_template())
    out(f"Wrote a commented config template to {path}")
    return 0


# -- gc ---------------------------------------------------------------------------


@dataclass
class Orphan:
    sandbox: Any
    reason: str
    action: str  # "delete" or "stop"


@dataclass
class Skipped:
    sandbox: Any
    reason: str


def running_kernel_ids() -> set[str]:
    """Ids of daytona kernels running on this machine.

    A kernel's id is the stem of its connection file (``kernel-<id>.json``). Running
    processes of the kernel (``... -f FILE``) are found through /proc where it
    exists; connection files in Jupyter's runtime folder count as running too.
    """
    from .compose import kernel_id_of

    ids = {kernel_id_of(path) for path in Path(jupyter_runtime_dir()).glob("kernel-*.json")}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue  # the process ended while we looked
        if any(b"daytona_kernel" in arg for arg in argv) and b"-f" in argv[:-1]:
            ids.add(kernel_id_of(argv[argv.index(b"-f") + 1].decode(errors="replace")))
    return ids


async def find_orphans(
    client: Any,
    older_than_s: float,
    owner: str,
    delete_stopped: bool = False,
    paused_older_than_s: float | None = PAUSED_MAX_AGE_S,
) -> tuple[list[Orphan], list[Skipped]]:
    """This installation's kernel sandboxes whose kernel is gone, or idle past the threshold; with
    ``delete_stopped``, also stopped or archived ones idle past it (they count against the disk quota);
    paused ones idle past ``paused_older_than_s`` (None: never) are stopped: Daytona never archives or
    deletes a paused sandbox, which holds its disk (billed, and counted against the quota) for good."""
    from daytona import ListSandboxesQuery

    from .backends.daytona.api import LABEL_APP, LABEL_KERNEL, LABEL_OWNER, LABEL_POLICY, parse_time, state_name

    alive = running_kernel_ids()
    orphans: list[Orphan] = []
    skipped: list[Skipped] = []
    async for sandbox in client.list(ListSandboxesQuery(labels={LABEL_APP: "true", LABEL_OWNER: owner})):
        if sandbox.labels.get(LABEL_OWNER) != owner:  # the label filter is the server's; check it here too
            continue
        state = state_name(sandbox)
        if state in GONE_STATES:
            continue
        ephemeral = sandbox.labels.get(LABEL_POLICY) == "ephemeral"
        action = "delete" if ephemeral else "stop"
        last = parse_time(sandbox.last_activity_at) or parse_time(sandbox.updated_at)
        idle = time.time() - last if last is not None else None
        kernel = sandbox.labels.get(LABEL_KERNEL, "")
        if kernel not in alive and (state == "started" or ephemeral):
            reason = f"its kernel {kernel or '(unknown)'} no longer runs here"
        elif idle is not None and idle > older_than_s and state == "started":
            reason = f"idle for {idle / 3600:.1f} h"
        elif delete_stopped and idle is not None and idle > older_than_s and state in ("stopped", "archived"):
            reason, action = f"{state} for {idle / 86400:.1f} d (stopped sandboxes count against the disk quota)", "delete"
        elif paused_older_than_s is not None and idle is not None and idle > paused_older_than_s and state == "paused":
            reason = (
                f"paused for {idle / 86400:.1f} d (its disk is billed and held against the quota, and Daytona never "
                "archives or deletes a paused sandbox; stopping keeps its files, its variables are lost)"
            )
        else:
            continue
        if state not in SETTLED_STATES:
            skipped.append(Skipped(sandbox, f"it is {state}; run gc again once that has finished"))
        else:
            orphans.append(Orphan(sandbox, reason, action))
    return orphans, skipped


async def reclaim_sessions(client: Any, owner: str, config: DaytonaKernelConfig, dry_run: bool, out: Out) -> set[str]:
    """End detached sessions idle past ``detached_idle_minutes`` in this installation's started
    sandboxes (docs/reattach.md); returns the ids of sandboxes that keep one."""
    from daytona import ListSandboxesQuery
    from daytona.common.errors import DaytonaError

    from .backends.daytona.api import LABEL_APP, LABEL_OWNER, api_url_of, state_name
    from .backends.daytona.toolbox import DaytonaToolbox, FoundSandbox
    from .config import SANDBOX_WORKDIR, DaytonaSettings, settings_from
    from .journal import reclaim_detached

    api_url = api_url_of(settings_from(DaytonaSettings, config))
    holding = set()
    async for sandbox in client.list(ListSandboxesQuery(labels={LABEL_APP: "true", LABEL_OWNER: owner})):
        if sandbox.labels.get(LABEL_OWNER) != owner or state_name(sandbox) != "started":
            continue
        try:
            toolbox = DaytonaToolbox(FoundSandbox(sandbox, api_url), SANDBOX_WORKDIR)
            if await reclaim_detached(toolbox, sandbox.id, SANDBOX_WORKDIR, config.detached_idle_minutes, dry_run, out):
                holding.add(sandbox.id)
        except (DaytonaError, DaytonaKernelError) as exc:  # one sandbox's toolbox failing must not stop the others' cleanup
            out(f"error: could not look at the sessions in {sandbox.id}: {exc}")
            holding.add(sandbox.id)  # unknown: do not stop it from under a session
    return holding


async def gc(
    older_than_s: float,
    dry_run: bool,
    out: Out,
    volumes_older_than_s: float = 30 * 86400,
    delete_stopped: bool = False,
    paused_older_than_s: float | None = PAUSED_MAX_AGE_S,
    local: bool = False,
) -> int:
    """Clean up after kernels that are gone: Daytona sandboxes, or the local backend's leftovers (with
    ``local``, or when the backend is local; without Daytona credentials too, saying Daytona was skipped)."""
    config = load_config()
    if local or config.backend == "local":
        return gc_local(older_than_s, volumes_older_than_s, dry_run, out, config)
    if not has_credentials():
        status = gc_local(older_than_s, volumes_older_than_s, dry_run, out, config)
        out(f"skipped: Daytona sandboxes: {NO_KEY[0]}. To clean them up too, export it (create a key at {API_KEYS_PAGE}).")
        return status
    return await gc_daytona(config, older_than_s, dry_run, out, delete_stopped, paused_older_than_s)


async def gc_daytona(
    config: DaytonaKernelConfig,
    older_than_s: float,
    dry_run: bool,
    out: Out,
    delete_stopped: bool = False,
    paused_older_than_s: float | None = PAUSED_MAX_AGE_S,
) -> int:
    from daytona import AsyncDaytona
    from daytona.common.errors import DaytonaError

    from .backends.daytona.api import client_config, translate_error
    from .config import DaytonaSettings, settings_from
    from .identity import owner_id

    then = "then run `daytona-kernel gc` again"
    try:
        owner = owner_id()
        client = AsyncDaytona(client_config(settings_from(DaytonaSettings, config)))
    except DaytonaKernelError as exc:
        out(f"error: {exc}")
        return 2
    except DaytonaError as exc:
        out(f"error: {translate_error(exc, 'connect to Daytona', then)}")
        return 2
    try:
        try:
            holding = await reclaim_sessions(client, owner, config, dry_run, out)
            orphans, skipped = await find_orphans(client, older_than_s, owner, delete_stopped, paused_older_than_s)
        except DaytonaError as exc:
            out(f"error: {translate_error(exc, 'list sandboxes', then)}")
            return 1
        for orphan in [o for o in orphans if o.action == "stop" and o.sandbox.id in holding]:
            orphans.remove(orphan)
            skipped.append(Skipped(orphan.sandbox, f"{orphan.reason}, but it holds a detached session (see above)"))
        for skip in skipped:
            out(f"skipped {skip.sandbox.id}: {skip.reason}")
        if not orphans:
            out("No orphaned daytona-kernel sandboxes.")
        return 1 if await _reclaim_orphans(orphans, dry_run, out, then) else 0
    finally:
        await client.close()


async def _reclaim_orphans(orphans: list[Orphan], dry_run: bool, out: Out, then: str) -> int:
    """Stop or delete each orphan by its action (or say what would be done); returns how many failed."""
    from daytona.common.errors import DaytonaError

    from .backends.daytona.api import translate_error

    failed = 0
    for orphan in orphans:
        if dry_run:
            out(f"would {orphan.action} {orphan.sandbox.id}: {orphan.reason}")
            continue
        try:
            if orphan.action == "delete":
                await orphan.sandbox.delete()
            else:
                await orphan.sandbox.stop()
        except DaytonaError as exc:  # one failure must not leave the others running
            failed += 1
            out(f"error: could not {orphan.action} {orphan.sandbox.id}: {translate_error(exc, orphan.action + ' it', then)}")
            continue
        out(f"{'deleted' if orphan.action == 'delete' else 'stopped'} {orphan.sandbox.id}: {orphan.reason}")
    return failed


# -- gc for the local backend ----------------------------------------------------------


def _age_s(path: Path) -> float:
    """Seconds since anything in ``path`` (a file, or a folder's direct entries) last changed."""
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for entry in os.scandir(path):
            newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return time.time() - newest


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def _inbox_in_use(path: Path) -> bool:
    """An input() inbox is named daytona-kernel-inbox-<pid of its interpreter>-<random>; the folder of a
    kernel's %%daytona map engines' mirror records daytona-kernel-fanout-<pid of the kernel>-<random>."""
    match = re.fullmatch(r"daytona-kernel-(?:inbox|fanout)-(\d+)-.*", path.name)
    return match is not None and _pid_alive(int(match.group(1)))


def _remove(path: Path, what: str, dry_run: bool, out: Out) -> bool:
    if dry_run:
        out(f"would remove {what} {path}")
        return True
    try:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    except OSError as exc:
        out(f"error: could not remove {what} {path}: {exc}")
        return False
    out(f"removed {what} {path}")
    return True


def gc_local(older_than_s: float, volumes_older_than_s: float, dry_run: bool, out: Out, config: DaytonaKernelConfig) -> int:
    """The local backend's leftovers: ephemeral sandboxes and inbox/doctor folders of kernels that are
    gone, and working copies (with their mirror manifests) unused for ``volumes_older_than_s``."""
    from .backends.local.sandbox import local_root

    root = local_root()
    candidates: list[tuple[Path, str]] = []
    sandboxes = root / "sandboxes"
    if sandboxes.is_dir():
        for path in sandboxes.iterdir():  # ephemeral ones are named local-<12 hex>; reuse ones keep theirs
            if re.fullmatch(r"local-[0-9a-f]{12}", path.name) and _age_s(path) > older_than_s:
                candidates.append((path, "ephemeral local sandbox"))
    volumes = root / "volumes"
    if volumes.is_dir():
        for volume in volumes.iterdir():
            for workdir in volume.iterdir() if volume.is_dir() else ():
                if _age_s(workdir) > volumes_older_than_s:
                    candidates.append((workdir, f"working copy (volume {volume.name})"))
                    manifest = root / "manifests" / f"local-{volume.name}-{workdir.name}.json"
                    if manifest.exists():
                        candidates.append((manifest, "mirror manifest"))
    tmp = Path(tempfile.gettempdir())
    # Local sandboxes keep their temporary files in their own tmp/ (older versions used the system's).
    places = [tmp, *(path / "tmp" for path in (sandboxes.iterdir() if sandboxes.is_dir() else ()) if (path / "tmp").is_dir())]
    removed_whole = [path for path, _ in candidates]
    for place in places:
        if any(place.is_relative_to(whole) for whole in removed_whole):
            continue  # inside a sandbox that goes as a whole
        patterns = (
            ("daytona-kernel-inbox-*", "input() inbox"),
            ("daytona-kernel-doctor-*", "doctor folder"),
            ("daytona-kernel-fanout-*", "map engines' mirror records"),
        )
        for pattern, what in patterns:
            for path in place.glob(pattern):
                try:
                    mine = path.lstat().st_uid == os.getuid()
                except OSError:
                    continue  # gone while we looked
                if not mine or _inbox_in_use(path):
                    continue
                if re.fullmatch(r"daytona-kernel-(?:inbox|fanout)-\d+-.*", path.name) or _age_s(path) > older_than_s:
                    candidates.append((path, what))
    if not candidates:
        out(f"Nothing to clean up for the local backend (under {root} and {tmp}).")
        return 0
    failed = sum(not _remove(path, what, dry_run, out) for path, what in candidates)
    return 1 if failed else 0


# -- doctor -------------------------------------------------------------------------


class Checks:
    """Collects one line per check: ``ok: ...`` or ``FAIL: ... fix: ...`` (one fix per failure)."""

    def __init__(self, out: Out) -> None:
        self._out = out
        self.failed = 0

    def ok(self, what: str) -> None:
        self._out(f"ok: {what}")

    def fail(self, what: str, fix: str) -> None:
        self.failed += 1
        self._out(f"FAIL: {what.rstrip('.')}. fix: {fix}")


def _split_fix(problem: str) -> tuple[str, str]:
    """A validate() message is 'what. Fix it with ...': keep the two parts apart."""
    what, sep, fix = problem.partition(" Fix it with ")
    if sep:
        return what, "set it with " + fix
    return problem, "correct that setting (`daytona-kernel config` shows where each value comes from)"


async def _round_trip(config: DaytonaKernelConfig, checks: Checks) -> None:
    """Run one cell in a throwaway sandbox, the way a kernel does, and remove everything after."""
    import secrets

    from .backends.local.sandbox import local_root
    from .cell import Cell, Recorder
    from .compose import build_session

    config.sandbox_policy = "ephemeral"
    config.workspace_key = f"doctor-{secrets.token_hex(6)}"
    folder = tempfile.mkdtemp(prefix="daytona-kernel-doctor-")
    root = local_root()
    created = [p for p in (root / "volumes" / config.volume_name, root / "volumes", root / "sandboxes", root) if not p.exists()]
    session = build_session(config, folder, "doctor", log, mirror=False)
    frontend = Recorder()
    try:
        outcome = await session.execute(Cell("print(6 * 7)", 1), frontend)
        text = frontend.text()
        if outcome.error is None and text == "42\n":
            checks.ok(f"a cell ran in {session.sandbox.description}")
        else:
            detail = outcome.error["evalue"] if outcome.error else f"unexpected output {text!r}"
            checks.fail(f"a test cell did not run: {detail}", "see the message, then run `daytona-kernel doctor` again")
    finally:
        try:
            await session.shutdown()
        except DaytonaKernelError as exc:
            checks.fail(f"the test sandbox could not be removed: {exc}", "delete it in the Daytona dashboard")
        shutil.rmtree(folder, ignore_errors=True)
        if config.backend == "local":
            shutil.rmtree(root / "volumes" / config.volume_name / config.workspace_key, ignore_errors=True)
        for path in created:  # the local backend's folders, if this run made them (and they are empty)
            try:
                path.rmdir()
            except OSError:
                log.debug("kept %s: not empty", path)


async def doctor(out: Out, round_trip: bool = True) -> int:
    from . import kernelspec

    checks = Checks(out)
    try:
        config = load_config()
    except Exception as exc:  # a config file that does not even load: report it, whatever it raised
        checks.fail(f"configuration could not be loaded: {exc}", "correct daytona_kernel_config.py / jupyter_config")
        return 1
    problems = config.validate(check_credentials=False)
    for problem in problems:
        what, fix = _split_fix(problem)
        checks.fail(f"configuration: {what}", fix)
    if not problems:
        checks.ok(f"configuration (backend={config.backend})")
    specs = kernelspec.ours()
    for name in kernelspec.DEFAULT_SPECS:
        spec = specs.get(name)
        if spec is None:
            checks.fail(f"kernelspec {name} is not installed", "reinstall daytona-kernel, or run `daytona-kernel install --user`")
        elif kernelspec.uses_old_launcher(spec["spec"]):
            checks.fail(
                f"kernelspec {name} ({spec['resource_dir']}) uses the old launcher, which imports modules from the notebook's folder",
                "run `daytona-kernel install --user` (or the install command you used) again",
            )
        elif os.path.isabs(spec["spec"]["argv"][0]) and not os.path.exists(spec["spec"]["argv"][0]):
            checks.fail(
                f"kernelspec {name} points at a missing Python {spec['spec']['argv'][0]}",
                "run `daytona-kernel install --user` again",
            )
        else:
            checks.ok(f"kernelspec {name} ({spec['resource_dir']})")
    if config.backend == "daytona" and not has_credentials():
        out(f"skipped: Daytona checks: {NO_KEY[0]}. To test Daytona too: {NO_KEY[1]}; the local kernel is tested instead")
        config.backend = "local"
    elif config.backend == "daytona":
        await _check_daytona(config, checks)
    if round_trip and not checks.failed:
        await _round_trip(config, checks)
    return 1 if checks.failed else 0


async def _check_daytona(config: DaytonaKernelConfig, checks: Checks) -> None:
    from daytona import AsyncDaytona, ListSandboxesQuery
    from daytona.common.errors import DaytonaError

    from .backends.daytona.api import client_config, state_name, translate_error
    from .config import DaytonaSettings, settings_from

    then = "then run `daytona-kernel doctor` again"
    checks.ok("credentials: DAYTONA_API_KEY is set")
    try:
        client = AsyncDaytona(client_config(settings_from(DaytonaSettings, config)))
    except DaytonaError as exc:
        checks.fail(f"credentials: {translate_error(exc, 'connect', then)}", "check DAYTONA_API_KEY / DAYTONA_API_URL")
        return
    try:
        try:
            async for _ in client.list(ListSandboxesQuery(limit=1)):
                break
            checks.ok(f"API reachable at {masked(config.api_url or os.environ.get('DAYTONA_API_URL') or DEFAULT_API_URL)}")
        except DaytonaError as exc:
            checks.fail(
                f"API: {translate_error(exc, 'list sandboxes', then)}", "check DAYTONA_API_KEY, DAYTONA_API_URL and your network"
            )
            return
        if config.snapshot:
            try:
                await client.snapshot.get(config.snapshot)
                checks.ok(f"snapshot {config.snapshot} exists")
            except DaytonaError as exc:
                checks.fail(f"snapshot {config.snapshot}: {exc}", "set DAYTONA_KERNEL_SNAPSHOT to an existing snapshot")
        try:
            volume = await client.volume.get(config.volume_name)
            state = state_name(volume)
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
