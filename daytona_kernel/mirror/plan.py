"""What the mirror moves, decided without touching a file: pure functions of the change report, the
scan and the settings, tested in-process. ``WorkdirMirror`` (mirror/mirror.py) does the reading and writing.

``why_not_down`` is the one place that decides whether a path the sandbox reports may be written
into the notebook's folder.
"""

from __future__ import annotations

import enum
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..config import MirrorSettings
from ..errors import MirrorError
from ..protocol import FileChanges
from ..runtime.pathrules import SECRET_REASON, MirrorRules, path_key
from .localfs import safe_relpath, shown

Stat = tuple[int, int, int]  # size, mtime in ns, permission bits
MB = 1024 * 1024
MAX_REPORTED_PATHS = 100_000

# -- the valve: code never comes down (docs/security.md, "The rule: data flows both ways, code flows only up") --
# Data flows both ways, code only up: nothing the sandbox writes may be run by this machine later without
# the user choosing to. ``code_refusal`` decides it from the path and the ``Landing`` (what the folders on
# its way hold here, in the change report and with the file itself); no setting and no .gitignore can widen
# it. Every name is compared by its ``name_key``: as a Windows or macOS disk would open it.
#
# Hidden names are configuration: a dot-named file or folder is read by some tool (an editor, a shell, a coding
# agent, a package manager, a debugger) and none is data a cell means to hand back, so they are refused as a
# class, but for these, which no tool runs:
HIDDEN_DATA = frozenset({".gitignore", ".gitkeep", ".keep"})
# Folders whose files Python imports in place of the sources: bytecode caches and installed packages.
CODE_FOLDERS = frozenset({"__pycache__", "site-packages", "dist-packages", "conda-meta"})
# Files that run by their name alone: every Python runs sitecustomize/usercustomize from its site-packages; a
# pyvenv.cfg makes its folder an environment that editors and tools pick up and run; opencode starts the MCP
# servers of its opencode.json; Bun preloads bunfig.toml's scripts; Vim on Windows reads _vimrc and _exrc;
# mise runs the hooks and tasks of mise.toml, mise.<env>.toml, mise.local.toml and mise/config.toml.
CODE_NAMES = frozenset(
    {"sitecustomize.py", "usercustomize.py", "pyvenv.cfg", "opencode.json", "opencode.jsonc", "bunfig.toml", "_vimrc", "_gvimrc", "_exrc"}
)  # fmt: skip
MISE_CONFIG = re.compile(r"mise(?:\.[^/]*)?\.toml|mise/config(?:\.[^/]*)?\.toml")  # on the name, or on folder/name
# Coding agents take these as their instructions, and they run commands: a sandbox's AGENTS.md is a prompt
# injection with the user's shell (the hidden ones, .cursorrules, .clinerules ..., are refused as a class).
AGENT_FILES = frozenset(
    {"agents.md", "agent.md", "claude.md", "claude.local.md", "gemini.md", "qwen.md", "crush.md", "copilot-instructions.md"}
)  # fmt: skip
# .pth (run at start), bytecode (imported in place of a source with the same header), compiled extension
# modules and shared libraries (loaded by name: libx.so.1 too), editor workspaces.
CODE_SUFFIXES = (".pth", ".pyc", ".pyo", ".so", ".pyd", ".dylib", ".dll", ".code-workspace", ".sublime-project")
SHARED_LIBRARY = re.compile(r".*\.so(?:\.[0-9]+)+")
# Windows opens a short (8.3) name as the long name it was made for: GIT~1 is .git, VSCODE~1 is .vscode. The
# long form of any such name may be a hidden one (Windows drops the leading dot), so every one is refused.
SHORT_NAME = re.compile(r"([^.~]{1,7}~[0-9]{1,7})(?:\.[^.~]{1,3})?")
ENV_MARKERS = frozenset({"pyvenv.cfg", "conda-meta"})  # a folder holding one of these is a Python environment
# Beside a HEAD: a folder git takes for a repository (objects/ and refs/, or a commondir), or one a config makes
# dangerous as soon as git does (core.fsmonitor, hooksPath ...): any of them with a HEAD is refused.
GIT_MARKERS = frozenset({"objects", "refs", "commondir", "config"})
MARKER_FOLDERS = frozenset({"conda-meta", "objects", "refs"})  # markers that are folders; the others are files
MARKERS = ENV_MARKERS | GIT_MARKERS | {"head"}


# With sync_code_down off, only data comes back: these are code (sources, scripts, notebooks, pages that
# run scripts, build files), and so is anything with an execute bit.
# fmt: off
CODE_EXTENSIONS = frozenset([
    "py", "pyw", "pyx", "pxd", "pyi", "ipynb", "sh", "bash", "zsh", "fish", "ksh", "csh", "ps1", "psm1", "bat", "cmd",
    "vbs", "js", "mjs", "cjs", "ts", "tsx", "jsx", "rb", "pl", "pm", "php", "lua", "r", "jl", "go", "rs", "c", "h", "cc",
    "cpp", "hpp", "java", "kt", "scala", "swift", "mk", "cmake", "gradle", "nix", "exe", "dll", "dylib", "jar", "whl",
    "egg", "command", "desktop", "applescript", "scpt", "appimage", "run", "deb", "rpm", "msi", "pkg", "dmg", "html",
    "htm", "xhtml",
])
BUILD_NAMES = frozenset([
    "makefile", "gnumakefile", "dockerfile", "containerfile", "justfile", "rakefile", "gemfile", "procfile",
    "vagrantfile", "jenkinsfile", "snakefile", "build", "build.bazel", "workspace", "pyproject.toml", "setup.cfg",
    "tox.ini", "package.json", "cargo.toml", "azure-pipelines.yml",
])
# fmt: on


def data_only_refusal(rel: str, mode: int) -> str | None:
    """Why ``rel`` (with the reported permission bits ``mode``, -1 unknown) is code rather than data (hidden
    names, CI settings under .github/ among them, are refused before this is asked)."""
    name = path_key(rel).rsplit("/", 1)[-1]
    if mode > 0 and mode & 0o111:
        return "it is executable"
    if name.rpartition(".")[2] in CODE_EXTENSIONS and "." in name or name in BUILD_NAMES:
        return "it is code"
    return None


@dataclass(frozen=True)
class Landing:
    """What the folders a path comes down into hold: for each folder (its ``path_key``, "" for the mirrored
    folder), the markers in it (``MARKERS``: a pyvenv.cfg, a conda-meta/, a HEAD, objects/ ...), here, in the
    change report and in the path itself. ``a | b`` is both together: what the folder will hold once written."""

    markers: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __or__(self, other: Landing) -> Landing:
        merged = dict(self.markers)
        for folder, found in other.markers.items():
            merged[folder] = merged.get(folder, frozenset()) | found
        return Landing(merged)

    @property
    def envs(self) -> frozenset[str]:
        """Python environments: a pyvenv.cfg or a conda-meta/ in them."""
        return frozenset(folder for folder, found in self.markers.items() if is_environment(found))

    @property
    def repos(self) -> frozenset[str]:
        """Folders git takes, or may take, for a repository: a HEAD beside objects/, refs/, commondir or config."""
        return frozenset(folder for folder, found in self.markers.items() if is_repository(found))


def is_environment(found: frozenset[str]) -> bool:
    """A folder with these markers is a Python environment: a pyvenv.cfg or a conda-meta/ in it."""
    return bool(found & ENV_MARKERS)


def is_repository(found: frozenset[str]) -> bool:
    """A folder with these markers is (or may be taken for) a repository: a HEAD beside objects/, refs/,
    commondir or config."""
    return "head" in found and bool(found & GIT_MARKERS)


def folders_above(rel: str) -> list[str]:
    """``a/b/c.txt`` -> ``["", "a", "a/b"]``."""
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts))]


def landing_of(paths: Iterable[str]) -> Landing:
    """The markers these files make (the change report's, or a path's own): a file named pyvenv.cfg, HEAD,
    commondir or config, a folder named conda-meta, objects or refs on the way; keyed by ``path_key``."""
    markers: dict[str, set[str]] = {}
    for path in paths:
        for folder, name in markers_on_the_way(path_key(path).split("/")):
            markers.setdefault(folder, set()).add(name)
    return Landing({folder: frozenset(found) for folder, found in markers.items()})


def markers_on_the_way(parts: list[str]) -> list[tuple[str, str]]:
    """(folder key, marker) for the markers a keyed path's names make in the folders it goes through."""
    last = len(parts) - 1
    return [
        ("/".join(parts[:i]), name) for i, name in enumerate(parts) if name in MARKERS and (name in MARKER_FOLDERS) == (i < last)
    ]


def code_refusal(rel: str, landing: Landing) -> str | None:
    """Why the sandbox's file ``rel`` would be code this machine may run later, so it is never written
    here (nor deleted by the sandbox), whatever any setting or .gitignore says; None if it is not.
    ``landing`` is what the folders will hold: here, in the report and ``rel`` itself (``landing_of``)."""
    parts = path_key(rel).split("/")
    own = markers_on_the_way(parts)  # the file itself: a HEAD completes a repository as much as objects/ do
    for i in range(len(parts)):  # one lookup each: a report of N files costs N, not N times every folder
        folder = "/".join(parts[:i])
        found = landing.markers.get(folder, frozenset()).union(name for where, name in own if where == folder)
        where = f"{folder}/" if folder else "the mirrored folder"
        if is_environment(found):
            return f"{where} is a Python environment, and every python from it would run it"
        if is_repository(found):
            return f"{where} is a git repository, and git runs its hooks and config"
    for part in parts:
        if not part:
            return "a name in it is empty without its trailing dots, spaces or invisible characters, as Windows and macOS read it"
        short = SHORT_NAME.fullmatch(part)
        if short and len(short.group(1)) <= 8:
            return f"{part} has the shape of a Windows short name, which Windows opens as its long name (GIT~1 is .git)"
    hidden = next((part for part in parts if part.startswith(".") and part not in HIDDEN_DATA), None)
    if hidden is not None:
        return f"{hidden} is a hidden name: hidden files and folders configure editors, agents and tools"
    code_folder = next((part for part in parts[:-1] if part in CODE_FOLDERS), None)
    if code_folder is not None:
        return f"{code_folder}/ holds files that Python imports in place of the sources"
    if parts[-1] in AGENT_FILES:
        return "coding agents take this file as instructions, and they run commands"
    if runs_by_name(parts):
        return "editors, tools or Python run a file with this name by themselves"
    return None


def runs_by_name(parts: list[str]) -> bool:
    """A file (the names of its path, keyed) that a tool runs or loads by its name alone."""
    name = parts[-1]
    if name in CODE_NAMES or name.endswith(CODE_SUFFIXES) or SHARED_LIBRARY.fullmatch(name):
        return True
    return bool(MISE_CONFIG.fullmatch(name) or MISE_CONFIG.fullmatch("/".join(parts[-2:])))


@dataclass
class SyncReport:
    """What one sync moved, and what it did not and why."""

    up: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    bytes_up: int = 0
    bytes_down: int = 0
    deleted: list[str] = field(default_factory=list)  # deleted in the sandbox because they were deleted here
    trashed: list[str] = field(default_factory=list)  # moved to this machine's trash because the sandbox deleted them
    kept: list[str] = field(default_factory=list)  # deleted by the sandbox but changed here: kept, and sent up again
    conflicts: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)  # kept here because they look like secrets
    secrets_down: list[str] = field(default_factory=list)  # left in the sandbox for the same reason
    code_kept: list[str] = field(default_factory=list)  # code left in the sandbox: sync_code_down is off
    waiting: list[str] = field(default_factory=list)  # not sent up: this sync's sync_max_total_mb was reached
    waiting_bytes: int = 0
    waiting_note: str = ""  # what the user is told about them (``not_yet_synced``)
    held: list[str] = field(default_factory=list)  # new files past a cell's NEW_FILES_PER_CELL, left in the sandbox
    disk_full: str = ""  # why a download stopped before it filled this disk
    left_behind: list[tuple[str, str]] = field(default_factory=list)  # (path, why) not written here
    refused: list[tuple[str, str]] = field(default_factory=list)  # (reported path, why) never written

    def summary(self) -> str:
        parts = [
            f"{len(self.up)} up ({size_text(self.bytes_up)})",
            f"{len(self.down)} down ({size_text(self.bytes_down)})",
            f"{len(self.conflicts)} conflicts",
            f"{len(self.skipped) + len(self.secrets) + len(self.secrets_down) + len(self.code_kept)} skipped",
        ]
        if self.left_behind:
            parts.append(f"{len(self.left_behind)} failed")
        if self.deleted or self.trashed:
            parts.append(f"{len(self.deleted) + len(self.trashed)} deleted")
        return "sync: " + ", ".join(parts)

    def notices(self) -> str:
        """Lines the user must see: conflicts, skipped and failed files, with the reason."""
        lines = [
            f"Conflict: {path} changed both here and in the sandbox; your copy is kept and the sandbox's is {copy}."
            for path, copy in self.conflicts
        ]
        if self.trashed:
            lines.append(
                f"Moved to your trash because a cell deleted them in the sandbox: {listing(self.trashed)}. Restore them from "
                "the trash if you need them; DaytonaKernel.sync_deletes=False (DAYTONA_KERNEL_SYNC_DELETES=false) keeps such files."
            )
        if self.kept:
            lines.append(
                f"Kept here though a cell deleted them in the sandbox, because they changed here since the last sync: "
                f"{listing(self.kept)}. They go back to the sandbox before the next cell."
            )
        lines += [f"Not synced: {path}: {reason}" for path, reason in self.skipped]
        if self.waiting_note:
            lines.append(f"Not in the sandbox yet: {self.waiting_note}")
        if self.secrets:
            first = min(self.secrets).rstrip("/")
            lines.append(
                f"Not sent to the sandbox because they look like secrets: {listing(self.secrets)}. "
                f"To send one, add it to DaytonaKernel.sync_include (for example "
                f"DAYTONA_KERNEL_SYNC_INCLUDE='[\"{first}\"]'), or send it once with %upload {first}"
            )
        if self.secrets_down:
            lines.append(
                f"Not copied from the sandbox because they look like secrets: {listing(self.secrets_down)}. "
                f"Fetch one with %download {min(self.secrets_down)}"
            )
        if self.code_kept:
            lines.append(
                f"Not copied from the sandbox because they are code and sync_code_down is off: {listing(self.code_kept)}. "
                f"Fetch one with %download {min(self.code_kept)}"
            )
        if self.held:
            lines.append(
                f"This cell made {len(self.held)} more new files than one cell brings back; they stay in the sandbox, in "
                f"{folders_of(self.held)}. Fetch them all with %sync, or one with %download {min(self.held)}"
            )
        if self.disk_full:
            lines.append(f"Not copied from the sandbox: {self.disk_full}")
        lines += [f"Not copied from the sandbox: {path}: {reason}" for path, reason in self.left_behind]
        lines += refusal_lines(self.refused)
        return "".join(line + "\n" for line in lines)

    def merge(self, other: SyncReport) -> None:
        """Add a pull's report to a push's (for %sync)."""
        self.down += other.down
        self.bytes_down += other.bytes_down
        self.conflicts += other.conflicts
        self.skipped += other.skipped
        self.secrets_down += other.secrets_down
        self.code_kept += other.code_kept
        self.left_behind += other.left_behind
        self.refused += other.refused
        self.held += other.held
        self.disk_full = self.disk_full or other.disk_full
        self.deleted += other.deleted
        self.trashed += other.trashed
        self.kept += other.kept


def not_yet_synced(waiting: list[str], waiting_bytes: int, max_total_mb: float) -> str:
    """What the user is told about local files one sync's budget left out (a cell does not run on such a folder)."""
    return (
        f"{len(waiting)} file(s) of your project folder ({size_text(waiting_bytes)}) are not in the sandbox yet, because one "
        f"sync sends at most sync_max_total_mb={max_total_mb:g} MB: {listing(waiting)}. Run the cell again to send the "
        f"next part, raise DaytonaKernel.sync_max_total_mb (DAYTONA_KERNEL_SYNC_MAX_TOTAL_MB), or leave them out with sync_exclude."
    )


def folders_of(paths: list[str], limit: int = 3) -> str:
    """The folders that hold most of ``paths``: ``out/ (199500)``, ``logs/ (3)``; ``the project folder`` for its top."""
    counts: dict[str, int] = {}
    for path in paths:
        folder = posixpath.dirname(path)
        counts[folder] = counts.get(folder, 0) + 1
    top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    shown = [f"{folder + '/' if folder else 'the project folder'} ({n})" for folder, n in top[:limit]]
    return ", ".join(shown) + (f" and {len(top) - limit} more folders" if len(top) > limit else "")


FLOOD = 10  # more refusals than this for one reason are named in one line


def refusal_lines(refused: list[tuple[str, str]]) -> list[str]:
    """A line for each refused path, but one line for each reason shared by more than ``FLOOD`` of them (the
    files of a venv or a .tox/ a cell made), in the order they were refused."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for path, reason in refused:
        shared = reason.replace(f"Fetch it with %download {path} ", "Fetch one with %download PATH ")
        groups.setdefault(shared, []).append((path, reason))
    lines = []
    for shared, members in groups.items():
        if len(members) > FLOOD:
            paths = [path for path, _ in members]
            lines.append(f"Refused {len(members)} paths the sandbox reported ({listing(paths)}): {shared}")
        else:
            lines += [f"Refused a path the sandbox reported: {path}: {reason}" for path, reason in members]
    return lines


def over_the_cap(size: int, config: MirrorSettings) -> str:
    """Why a file is not moved: over ``sync_max_file_mb`` (and, on this disk, it could not be shared)."""
    return f"{size_text(size)} is over sync_max_file_mb={config.sync_max_file_mb:g}"


def size_text(n: int) -> str:
    return f"{n / MB:.1f} MB" if n >= MB else f"{n / 1024:.1f} KB" if n >= 1024 else f"{n} B"


def listing(paths: list[str], limit: int = 20) -> str:
    paths = sorted(paths)
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def conflict_name(rel: str) -> str:
    """``data/table.csv`` -> ``data/table.sandbox-conflict.csv``."""
    head, tail = posixpath.split(rel)
    stem, dot, ext = tail.rpartition(".")
    name = f"{stem}.sandbox-conflict.{ext}" if dot and stem else f"{tail}.sandbox-conflict"
    return posixpath.join(head, name) if head else name


@dataclass
class UpPlan:
    """What the next upload would do; computed without any request."""

    todo: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    total: int = 0  # bytes to upload
    waiting: list[tuple[str, int]] = field(default_factory=list)  # (path, size) past this sync's sync_max_total_mb
    placed: list[str] = field(default_factory=list)  # over sync_max_file_mb, for a sandbox on this disk (Toolbox.place)


class Refusal(enum.Enum):
    """Why a file the sandbox reports is not written here."""

    REFUSED = "refused"  # named in the notices as refused
    SECRET = "secret"  # named once as a secret left in the sandbox
    EXCLUDED = "excluded"  # excluded by the mirror's rules: acknowledged without a word
    CODE = "code"  # code, with sync_code_down off: named once, like a secret


def why_not_down(
    rel: str, rules: MirrorRules, landing: Landing, data_only: bool = False, mode: int = -1
) -> tuple[Refusal, str] | None:
    """May the sandbox's file ``rel`` (already through ``safe_relpath``) be written here? None if it may,
    else what kind of refusal and why. The planner and the writer both ask it; ``landing`` says what the
    folders on the way hold (``landing_of`` the report, and what they hold here), to which the file's own
    path is added; names are compared by their ``name_key``."""
    reason = rules.check(rel, False)
    if reason == SECRET_REASON:
        return Refusal.SECRET, reason
    if reason is not None:
        return Refusal.EXCLUDED, reason  # excluded anyway (.git, a default exclude ...): nothing to say
    why = code_refusal(rel, landing)
    if why is not None:
        return Refusal.REFUSED, f"it could run code here: {why}. Fetch it with %download {rel} if you trust it"
    why = data_only_refusal(rel, mode) if data_only else None
    if why is not None:
        return Refusal.CODE, f"{why}, and sync_code_down is off; fetch it with %download {rel}"
    return None


def reported_paths(
    changes: FileChanges, report: SyncReport, say_truncated: bool = True
) -> tuple[list[tuple[str, Stat]], list[str]]:
    """(changed, deleted) of the runtime's change report, which ``protocol.file_changes`` has checked (paths,
    whole numbers); a report of more than ``MAX_REPORTED_PATHS`` paths is named and nothing is planned.
    ``say_truncated``: name a scan the sandbox cut short (the caller says it once, not after every cell)."""
    if len(changes.changed) + len(changes.deleted) > MAX_REPORTED_PATHS:
        report.refused.append(("(change report)", f"it lists more than {MAX_REPORTED_PATHS} paths; nothing was copied"))
        return [], []
    if changes.truncated and say_truncated:
        report.skipped.append(
            (
                "(sandbox folder)",
                "too many files to scan after each cell: the files already synced are still checked, but "
                "new files in the folders not reached are not looked at. Add sync_exclude patterns.",
            )
        )
    changed = [(rel, (stat[0], stat[1], stat[2] if len(stat) == 3 else -1)) for rel, stat in changes.changed.items()]
    return sorted(changed), list(changes.deleted)


@dataclass
class DownPlan:
    """The files to download, and the reported changes decided without a download."""

    wanted: list[tuple[str, str, Stat]] = field(default_factory=list)  # (path here, path reported, stat)
    acked: list[tuple[str, Stat]] = field(default_factory=list)  # (path reported, stat): handled, not to be reported again
    placed: list[tuple[str, str, Stat]] = field(default_factory=list)  # like wanted, over sync_max_file_mb (Toolbox.fetch)


def plan_down(
    changed: list[tuple[str, Stat]],
    report: SyncReport,
    config: MirrorSettings,
    rules: MirrorRules,
    failed: dict[str, Stat],
    secrets_noticed: set[str],
    landing: Landing = Landing(),
    on_this_disk: bool = False,
) -> DownPlan:
    """Decide what of a change report to download. ``failed``: files that failed before in a way a retry
    would repeat (skipped while unchanged); ``secrets_noticed``: secrets already named to the user;
    ``on_this_disk`` (the local backend): files over sync_max_file_mb are placed, not refused."""
    max_file = int(config.sync_max_file_mb * MB)
    budget = int(config.sync_max_total_mb * MB)
    plan = DownPlan()
    for raw, reported in changed:
        try:
            rel = safe_relpath(raw)
        except MirrorError as exc:
            report.refused.append((shown(raw), str(exc)))
            plan.acked.append((raw, reported))
            continue
        if failed.get(raw) == reported:
            continue  # failed before in a way a retry would repeat, and named then
        refusal = why_not_down(rel, rules, landing, not config.sync_code_down, reported[2])
        if refusal is not None:
            kind, why = refusal
            if kind is Refusal.REFUSED:
                report.refused.append((rel, why))
            elif kind in (Refusal.SECRET, Refusal.CODE) and rel not in secrets_noticed and rel not in report.secrets_down:
                (report.secrets_down if kind is Refusal.SECRET else report.code_kept).append(rel)
            plan.acked.append((raw, reported))
            continue
        if reported[0] > max_file and on_this_disk:  # no transfer: cloned or linked (Toolbox.fetch)
            plan.placed.append((rel, raw, reported))
            continue
        if reported[0] > max_file:
            report.skipped.append((rel, over_the_cap(reported[0], config)))
            plan.acked.append((raw, reported))
            continue
        if reported[0] > budget:  # not acknowledged: it comes with a later cell
            report.left_behind.append(
                (rel, f"this sync would pass sync_max_total_mb={config.sync_max_total_mb:g}; it comes after a later cell")
            )
            continue
        budget -= reported[0]
        plan.wanted.append((rel, raw, reported))
    return plan


def choose_up(plan: UpPlan, changed: list[tuple[str, int]], config: MirrorSettings, on_this_disk: bool = False) -> None:
    """Add to ``plan`` the changed local files (path, size) that fit the limits; name the others.
    ``on_this_disk`` (the local backend): files over sync_max_file_mb are placed, not refused."""
    max_file = int(config.sync_max_file_mb * MB)
    budget = int(config.sync_max_total_mb * MB)
    for rel, size in changed:
        if size > max_file and on_this_disk:
            plan.placed.append(rel)
            continue
        if size > max_file:
            plan.skipped.append((rel, over_the_cap(size, config)))
            continue
        if size > int(config.sync_max_total_mb * MB):  # never fits one sync
            plan.skipped.append((rel, f"{size_text(size)} is over sync_max_total_mb={config.sync_max_total_mb:g}"))
            continue
        if size > budget:  # goes with the next sync; the cell is told (``not_yet_synced``)
            plan.waiting.append((rel, size))
            continue
        budget -= size
        plan.todo.append(rel)
        plan.total += size


def describe_up(plan: UpPlan, mode: str, local_root: str, workdir: str, sync_deletes: bool) -> str:
    """``%sync status``: the mode, and what the next upload would do."""
    lines = [f"sync mode: {mode}; {local_root} <-> {workdir}"]
    lines.append(f"would upload {len(plan.todo)} file(s)" + (": " + ", ".join(plan.todo[:20]) if plan.todo else ""))
    if len(plan.todo) > 20:
        lines.append(f"  ... and {len(plan.todo) - 20} more")
    if plan.deleted:
        verb = "would delete in the sandbox" if sync_deletes else "deleted here (sync_deletes is off, kept there)"
        lines.append(f"{verb}: " + ", ".join(plan.deleted[:20]))
    if plan.secrets:
        lines.append(f"would keep here (they look like secrets; see sync_include): {listing(plan.secrets)}")
    if plan.waiting:
        lines.append(f"would leave for the next sync (over sync_max_total_mb): {listing([rel for rel, _ in plan.waiting])}")
    lines += [f"would skip {path}: {reason}" for path, reason in plan.skipped]
    return "\n".join(lines) + "\n"
