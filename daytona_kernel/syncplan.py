"""What the mirror moves, decided without touching a file: pure functions of the change report, the
scan and the settings, tested in-process. ``WorkdirMirror`` (sync.py) does the reading and writing.

``why_not_down`` is the one place that decides whether a path the sandbox reports may be written
into the notebook's folder.
"""

from __future__ import annotations

import enum
import posixpath
from dataclasses import dataclass, field

from .config import MirrorSettings
from .errors import MirrorError
from .localfs import safe_relpath, shown
from .protocol import FileChanges
from .runtime.pathrules import SECRET_REASON, MirrorRules

Stat = tuple[int, int, int]  # size, mtime in ns, permission bits
MB = 1024 * 1024
MAX_REPORTED_PATHS = 100_000

# -- the valve: code never comes down (docs/security.md, "The rule: data flows both ways, code flows only up") --
# Data flows both ways, code only up: nothing the sandbox writes may be run by this machine later without
# the user choosing to. ``code_refusal`` decides it from the path and the ``Landing`` (what the folders on
# its way are); no setting and no .gitignore can widen it. Names are compared case-insensitively.
ENV_MARKERS = ("pyvenv.cfg", "conda-meta")  # a folder holding one of these is a Python environment
# Folders whose files run when an editor, an agent or Python opens them: editor settings and tasks
# (a devcontainer's initializeCommand, VS Code's runOn folderOpen, an interpreter path), agent settings
# with hooks and MCP servers, bytecode caches and installed packages (imported instead of the source).
CODE_FOLDERS = frozenset(
    {
        ".vscode", ".idea", ".devcontainer", ".fleet", ".zed", ".theia",
        ".cursor", ".claude", ".gemini", ".continue", ".windsurf",
        "__pycache__", "site-packages", "dist-packages", "conda-meta",
        ".ipython", ".jupyter", ".mise",
    }
)  # fmt: skip
# Files that run by their name alone: every Python runs .pth files and sitecustomize/usercustomize from
# its site-packages; a pyvenv.cfg makes its folder an environment that editors and tools pick up and run;
# direnv runs .envrc and loads .env, autoenv runs .env, zsh-autoenv .autoenv.zsh (VS Code's Python extension
# and docker compose load .env too: an environment
# variable such as PYTHONSTARTUP or LD_PRELOAD is code); pre-commit runs its config's hooks on every
# commit; vim/neovim (exrc), Emacs (dir-locals), mise (hooks), npm and yarn (node-options, yarnPath)
# read theirs from the project; VS Code opens workspaces and devcontainers; Claude Code reads .mcp.json.
CODE_NAMES = frozenset(
    {
        "sitecustomize.py", "usercustomize.py", "pyvenv.cfg",
        ".envrc", ".env", ".devcontainer.json", ".pre-commit-config.yaml",
        ".exrc", ".nvimrc", ".nvim.lua", ".dir-locals.el", ".dir-locals-2.el",
        ".mise.toml", "mise.toml", ".npmrc", ".yarnrc", ".yarnrc.yml", ".mcp.json",
        ".autoenv.zsh", ".autoenv_leave.zsh",
    }
)  # fmt: skip
# .pth (run at start), bytecode (imported in place of a source with the same header), compiled extension
# modules (imported before a .py of the same name), editor workspaces.
CODE_SUFFIXES = (".pth", ".pyc", ".pyo", ".so", ".pyd", ".code-workspace", ".sublime-project")
CODE_PREFIXES = (".env.",)


# With sync_code_down off, only data comes back: these are code (sources, scripts, notebooks, pages that
# run scripts, build and CI files), and so is anything with an execute bit.
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
    "tox.ini", "package.json", "cargo.toml", ".gitattributes", ".gitmodules", ".gitlab-ci.yml", ".travis.yml",
    "azure-pipelines.yml",
])
# fmt: on
CI_FOLDERS = frozenset({".github", ".circleci", ".gitlab"})


def data_only_refusal(rel: str, mode: int) -> str | None:
    """Why ``rel`` (with the reported permission bits ``mode``, -1 unknown) is code rather than data."""
    parts = rel.lower().split("/")
    name = parts[-1]
    if mode > 0 and mode & 0o111:
        return "it is executable"
    if name.rpartition(".")[2] in CODE_EXTENSIONS and "." in name or name in BUILD_NAMES:
        return "it is code"
    if any(part in CI_FOLDERS for part in parts[:-1]):
        return "it is a CI setting"
    return None


@dataclass(frozen=True)
class Landing:
    """What the folders a path comes down into are, here or (from the change report) in the sandbox:
    relative folder paths, "" for the mirrored folder itself."""

    envs: frozenset[str] = frozenset()  # Python environments: a pyvenv.cfg or a conda-meta/ in them
    repos: frozenset[str] = frozenset()  # folders git takes for a repository: HEAD with objects/, refs/ or commondir

    def __or__(self, other: Landing) -> Landing:
        return Landing(self.envs | other.envs, self.repos | other.repos)


def folders_above(rel: str) -> list[str]:
    """``a/b/c.txt`` -> ``["", "a", "a/b"]``."""
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts))]


def sandbox_landing(paths: list[str]) -> Landing:
    """The environments and repositories the sandbox's own files make, from the paths it reports: a folder
    that gets a pyvenv.cfg or a conda-meta/, or a HEAD beside objects/, refs/ or commondir."""
    envs: set[str] = set()
    heads: set[str] = set()
    git_parts: dict[str, set[str]] = {}
    for path in paths:
        parts = path.split("/")
        for i, part in enumerate(parts):
            folder, name, last = "/".join(parts[:i]), part.lower(), i == len(parts) - 1
            if (last and name == "pyvenv.cfg") or (not last and name == "conda-meta"):
                envs.add(folder)
            if last and name == "head":
                heads.add(folder)
            if (not last and name in ("objects", "refs")) or (last and name == "commondir"):
                git_parts.setdefault(folder, set()).add(name)
    return Landing(frozenset(envs), frozenset(f for f in heads if git_parts.get(f)))


def code_refusal(rel: str, landing: Landing) -> str | None:
    """Why the sandbox's file ``rel`` would be code this machine may run later, so it is never written
    here (nor deleted by the sandbox), whatever any setting or .gitignore says; None if it is not."""
    for folder in folders_above(rel):
        where = f"{folder}/" if folder else "the mirrored folder"
        if folder in landing.envs:
            return f"{where} is a Python environment, and every python from it would run it"
        if folder in landing.repos:
            return f"{where} is a git repository, and git runs its hooks and config"
    parts = rel.lower().split("/")
    code_folder = next((part for part in parts[:-1] if part in CODE_FOLDERS), None)
    if code_folder is not None:
        return f"{code_folder}/ holds files that editors, tools or Python run when they open it"
    name = parts[-1]
    if name in CODE_NAMES or name.endswith(CODE_SUFFIXES) or name.startswith(CODE_PREFIXES):
        return "editors, tools or Python run a file with this name by themselves"
    return None


@dataclass
class SyncReport:
    """What one sync moved, and what it did not and why."""

    up: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    bytes_up: int = 0
    bytes_down: int = 0
    deleted: list[str] = field(default_factory=list)
    conflicts: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)  # kept here because they look like secrets
    secrets_down: list[str] = field(default_factory=list)  # left in the sandbox for the same reason
    code_kept: list[str] = field(default_factory=list)  # code left in the sandbox: sync_code_down is off
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
        if self.deleted:
            parts.append(f"{len(self.deleted)} deleted")
        return "sync: " + ", ".join(parts)

    def notices(self) -> str:
        """Lines the user must see: conflicts, skipped and failed files, with the reason."""
        lines = [
            f"Conflict: {path} changed both here and in the sandbox; your copy is kept and the sandbox's is {copy}."
            for path, copy in self.conflicts
        ]
        lines += [f"Not synced: {path}: {reason}" for path, reason in self.skipped]
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
        lines += [f"Not copied from the sandbox: {path}: {reason}" for path, reason in self.left_behind]
        lines += [f"Refused a path the sandbox reported: {path}: {reason}" for path, reason in self.refused]
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
        self.deleted += other.deleted


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
    placed: list[str] = field(default_factory=list)  # over sync_max_file_mb, for a sandbox on this disk (Sandbox.place)


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
    folders on the way are (``sandbox_landing`` of the report, and what they are here)."""
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


def reported_paths(changes: FileChanges, report: SyncReport) -> tuple[list[tuple[str, Stat]], list[str]]:
    """(changed, deleted) of the runtime's change report, which ``protocol.file_changes`` has checked (paths,
    whole numbers); a report of more than ``MAX_REPORTED_PATHS`` paths is named and nothing is planned."""
    if len(changes.changed) + len(changes.deleted) > MAX_REPORTED_PATHS:
        report.refused.append(("(change report)", f"it lists more than {MAX_REPORTED_PATHS} paths; nothing was copied"))
        return [], []
    if changes.truncated:
        report.skipped.append(
            ("(sandbox folder)", "too many files to scan after each cell; the rest was not looked at. Add sync_exclude patterns.")
        )
    changed = [(rel, (stat[0], stat[1], stat[2] if len(stat) == 3 else -1)) for rel, stat in changes.changed.items()]
    return sorted(changed), list(changes.deleted)


@dataclass
class DownPlan:
    """The files to download, and the reported changes decided without a download."""

    wanted: list[tuple[str, str, Stat]] = field(default_factory=list)  # (path here, path reported, stat)
    acked: list[tuple[str, Stat]] = field(default_factory=list)  # (path reported, stat): handled, not to be reported again
    placed: list[tuple[str, str, Stat]] = field(default_factory=list)  # like wanted, over sync_max_file_mb (Sandbox.fetch)


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
        if reported[0] > max_file and on_this_disk:  # no transfer: cloned or linked (Sandbox.fetch)
            plan.placed.append((rel, raw, reported))
            continue
        if reported[0] > max_file:
            report.skipped.append((rel, f"{size_text(reported[0])} is over sync_max_file_mb={config.sync_max_file_mb:g}"))
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
            plan.skipped.append((rel, f"{size_text(size)} is over sync_max_file_mb={config.sync_max_file_mb:g}"))
            continue
        if size > budget:
            plan.skipped.append((rel, f"the total of this sync would pass sync_max_total_mb={config.sync_max_total_mb:g}"))
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
    lines += [f"would skip {path}: {reason}" for path, reason in plan.skipped]
    return "\n".join(lines) + "\n"
