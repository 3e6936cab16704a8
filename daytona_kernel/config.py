"""Configuration: every knob is a traitlet on ``DaytonaKernel``, with help text.

Sources, later ones winning:
1. config files (``jupyter_config.*``, ``daytona_kernel_config.py``);
2. environment variables ``DAYTONA_KERNEL_<TRAIT_NAME_UPPER>``;
3. the command line (``--DaytonaKernel.backend=local``).

Credentials stay the SDK's own: DAYTONA_API_KEY, DAYTONA_API_URL, DAYTONA_TARGET.

A bad value never crashes the kernel: ``checked()`` leaves it out (the default is
kept) and records why, and ``validate()`` reports it so the first cell can show the
user what to fix.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
from copy import deepcopy
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, TypeVar

from traitlets import Bool, Dict, Enum, Float, Int, List, TraitError, Unicode
from traitlets.config import Config, Configurable
from traitlets.config.loader import DeferredConfig, DeferredConfigString

from .runtime.calls import output_limit_chars

ENV_PREFIX = "DAYTONA_KERNEL_"
SECTION = "DaytonaKernel"
CONFIG_FILES = ("jupyter_config", "daytona_kernel_config")
SECRET_ENV_VARS = ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN", "GIT_TOKEN")
SANDBOX_WORKDIR = "/home/daytona/workspace"  # the cell's working directory in a Daytona sandbox, on its own disk
DEFAULT_MOUNT_PATH = "/home/daytona/.daytona-kernel-volume"  # where the volume (mount-s3) is mounted
# Upper bounds: every number has one, so a typo (1e308) is a named config problem, never a crash or a hang.
MAX_CPU = 1024
MAX_WORKERS = 1024
MAX_GPU = 64
MAX_GIB = 1024 * 1024
MAX_MINUTES = 10 * 366 * 24 * 60  # ten years
MAX_SECONDS = 366 * 24 * 3600.0  # a year
MAX_OUTPUT_MB = 10 * 1024.0
MAX_FILE_MB = 100 * 1024.0
MAX_TOTAL_MB = 1024 * 1024.0


# Credentials as they appear in values: user:password@ in a URL, and the token formats of common
# services (GitHub, GitLab, Daytona, Hugging Face, Slack, OpenAI, Stripe, npm, PyPI, AWS, Google,
# Databricks, JWTs, PEM private keys). Used to refuse them in kernel.json and to mask them in output.
URL_USERINFO = re.compile(r"([a-z][a-z0-9+.-]*://)([^/\s@]+)@", re.IGNORECASE)
TOKEN_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9_]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|dtn_[A-Za-z0-9_]{10,}|hf_[A-Za-z0-9_]{20,}|xox[abposr]-[A-Za-z0-9_-]{10,}|sk-[A-Za-z0-9_-]{20,}"
    r"|[sr]k_live_[A-Za-z0-9_]{10,}|npm_[A-Za-z0-9]{30,}|pypi-[A-Za-z0-9_-]{50,}|(?:AKIA|ASIA)[A-Z0-9]{16}"
    r"|AIza[A-Za-z0-9_-]{35}|ya29\.[A-Za-z0-9_-]{20,}|dapi[0-9a-f]{32}|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\."
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----)"
)
MASK = "***"


def masked(value: Any) -> Any:
    """``value`` fit to print: URL credentials and tokens replaced by ***, inside lists and dicts too."""
    if isinstance(value, str):
        return TOKEN_VALUE.sub(MASK, URL_USERINFO.sub(r"\1" + MASK + "@", value))
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


class FiniteFloat(Float):
    """A Float that must be a finite number: nan and inf pass ``min``, but no timer or budget can use them."""

    info_text = "a finite number"

    def validate(self, obj: Any, value: Any) -> float:
        value = super().validate(obj, value)
        if not math.isfinite(value):
            self.error(obj, value)
        return float(value)


class DaytonaKernelConfig(Configurable):
    """The typed, documented knobs. ``DaytonaKernel`` inherits them."""

    backend = Enum(
        ["daytona", "local"],
        default_value="daytona",
        help="Where cells run: 'daytona' (a Daytona sandbox) or 'local' "
        "(a worker process on this machine; for trying out, CI and offline work, "
        "NOT a security boundary).",
    ).tag(config=True)

    sandbox_policy = Enum(
        ["reuse", "ephemeral"],
        default_value="reuse",
        help="'reuse': find the sandbox of this notebook's folder again and stop it at "
        "shutdown. 'ephemeral': a new sandbox per kernel, deleted at shutdown.",
    ).tag(config=True)

    workspace_key = Unicode(
        "",
        help="Key that 'reuse' finds a sandbox by and that names the working directory "
        "on the volume. Empty: derived from the notebook's folder.",
    ).tag(config=True)

    volume_name = Unicode(
        "daytona-kernel",
        help="Volume that holds the working directory, so files outlive the sandbox.",
    ).tag(config=True)

    mount_path = Unicode(
        DEFAULT_MOUNT_PATH,
        help=f"Where the volume is mounted in the sandbox. The cell's working directory ({SANDBOX_WORKDIR}) is on "
        "the sandbox's own disk, not under it; the volume keeps a volume copy of it, written as whole files. "
        f"A mount_path that is or contains {SANDBOX_WORKDIR} (where the volume used to be mounted) is replaced "
        "by the default, with a notice.",
    ).tag(config=True)

    snapshot = Unicode(
        "",
        help="Daytona snapshot to create the sandbox from (empty: Daytona's default Python snapshot).",
    ).tag(config=True)

    image = Unicode(
        "",
        help="Container image to build the sandbox from, e.g. 'python:3.12-slim'. Set this or "
        "snapshot, not both. cpu/memory/disk/gpu apply to image-based sandboxes.",
    ).tag(config=True)

    cpu = Int(0, min=0, max=MAX_CPU, help="CPU cores for an image-based sandbox (0 = Daytona's default).").tag(config=True)
    memory = Int(0, min=0, max=MAX_GIB, help="Memory in GiB for an image-based sandbox (0 = default).").tag(config=True)
    disk = Int(0, min=0, max=MAX_GIB, help="Disk in GiB for an image-based sandbox (0 = default).").tag(config=True)
    gpu = Int(0, min=0, max=MAX_GPU, help="GPUs for an image-based sandbox (0 = none).").tag(config=True)

    labels = Dict(
        value_trait=Unicode(),
        default_value={},
        help="Extra labels for the sandbox, e.g. {'team': 'research'}.",
    ).tag(config=True)

    idle_action = Enum(
        ["pause", "stop"],
        default_value="pause",
        help="What Daytona does with an idle sandbox, and what a shutdown does under sandbox_policy 'reuse'. "
        "'pause': pause it after auto_pause_interval minutes (memory and processes are kept, so your "
        "variables survive; only the disk is billed, and Daytona never archives a paused sandbox), where "
        "its class supports pausing; "
        "elsewhere, and for ephemeral sandboxes, it stops as with 'stop'. 'stop': stop it after "
        "auto_stop_interval minutes (only the disk is kept and billed; variables are lost unless "
        "checkpoint_on_idle saves them). Fixed when the sandbox is created. See docs/idle.md.",
    ).tag(config=True)

    auto_pause_interval = Int(
        15,
        min=0,
        max=MAX_MINUTES,
        help="Minutes of inactivity after which Daytona pauses the sandbox, when idle_action is 'pause' and "
        "the sandbox can pause (0 = never pause: the sandbox stops after auto_stop_interval instead).",
    ).tag(config=True)

    auto_stop_interval = Int(
        15,
        min=0,
        max=MAX_MINUTES,
        help="Minutes of inactivity after which Daytona stops the sandbox (0 = never), when it does not "
        "pause (see idle_action). This bounds the cost of a sandbox whose kernel was killed.",
    ).tag(config=True)

    auto_archive_interval = Int(
        0, min=0, max=MAX_MINUTES, help="Minutes a stopped sandbox waits before it is archived (0 = Daytona's maximum)."
    ).tag(config=True)

    auto_delete_interval = Int(
        -1, min=-1, max=MAX_MINUTES, help="Minutes a stopped sandbox waits before it is deleted (-1 = never, 0 = at stop)."
    ).tag(config=True)

    network_block_all = Bool(False, help="Block all network access from the sandbox.").tag(config=True)

    api_url = Unicode(
        "",
        help="Daytona API URL (empty: DAYTONA_API_URL, else https://app.daytona.io/api).",
    ).tag(config=True)

    target = Unicode("", help="Daytona target region (empty: DAYTONA_TARGET, else the organization's default).").tag(config=True)

    sync = Enum(
        ["both", "up", "down", "off"],
        default_value="both",
        help="Mirror between the notebook's folder and the sandbox's working directory: 'both', "
        "'up' (local changes go to the sandbox), 'down' (files cells write come back) or 'off'.",
    ).tag(config=True)

    sync_root = Unicode(
        "",
        help="The project folder to mirror (absolute, ~, or relative to the notebook's folder; it must contain "
        "the notebook). Empty: the git repository's root, else the nearest folder with a project marker "
        "(pyproject.toml, setup.py, setup.cfg, requirements.txt, environment.yml, Pipfile, .project-root, .here), "
        "else the notebook's folder; never the home folder or one that holds it.",
    ).tag(config=True)

    sync_exclude = List(
        Unicode(),
        default_value=[],
        help="More .gitignore-style patterns the mirror skips (on top of .gitignore and the "
        "defaults: .git, .ipynb_checkpoints, virtualenvs, __pycache__, node_modules ...).",
    ).tag(config=True)

    sync_include = List(
        Unicode(),
        default_value=[],
        help="Files the mirror sends even though they look like secrets or are ignored, as .gitignore-style "
        "patterns (for example ['.env']). By default .env, .envrc, .npmrc, .pypirc, .git-credentials, "
        "credentials.json, kaggle.json, id_rsa*, id_ed25519*, kubeconfig, secrets.toml, *.pem, *.key, .ssh/ ... "
        "(in any case; docs/security.md lists them all) never leave this machine; a notice names each one skipped. "
        "%upload PATH sends one file once.",
    ).tag(config=True)

    sync_code_down = Bool(
        True,
        help="Whether code a cell writes comes back with the mirror: source files and scripts (.py, .sh, .js ...), "
        "notebooks, build files (Makefile, pyproject.toml ...) and anything executable. False: only "
        "data comes back (tables, plots, models ...); what stays in the sandbox is named once, and %download fetches "
        "it. Either way, what this machine would run by itself (Python environments, .pth files, git repositories, "
        "hidden files and folders such as editor and tool settings, agent instructions) never comes back: see "
        "docs/security.md.",
    ).tag(config=True)

    sync_deletes = Bool(
        True,
        help="Deletions travel both ways: a file deleted here is deleted in the sandbox, and one a cell deletes goes to "
        "this machine's trash (never a notebook, code, or a file changed here since the last sync). False: a deleted "
        "file stays on the other side.",
    ).tag(config=True)

    sync_max_file_mb = FiniteFloat(
        100.0, min=0.0, max=MAX_FILE_MB, help="Files larger than this (MB) are not mirrored; a notice says so."
    ).tag(config=True)

    sync_max_total_mb = FiniteFloat(
        1024.0, min=0.0, max=MAX_TOTAL_MB, help="At most this much (MB) is uploaded in one sync; the rest waits, with a notice."
    ).tag(config=True)

    repo_url = Unicode(
        "",
        help="Git repository cloned into the working directory when the sandbox first starts. "
        "Credentials come from GIT_USERNAME / GIT_TOKEN in the kernel's environment.",
    ).tag(config=True)

    repo_ref = Unicode("", help="Branch or tag of repo_url to clone (empty: the default branch).").tag(config=True)

    env = Dict(
        value_trait=Unicode(),
        default_value={},
        help="Environment variables set in the sandbox, e.g. {'MY_VAR': 'x'}. The Daytona "
        "API key is never passed unless you list it here.",
    ).tag(config=True)

    cell_timeout = FiniteFloat(
        0.0,
        min=0.0,
        max=MAX_SECONDS,
        help="Seconds a cell may run before the sandbox stops it (0 = no limit).",
    ).tag(config=True)

    interrupt_grace = FiniteFloat(
        3.0,
        min=0.1,
        max=3600.0,
        help="Seconds to wait for a cell to yield to an interrupt before the context is restarted (which loses its variables).",
    ).tag(config=True)

    output_limit_mb = FiniteFloat(
        20.0,
        min=0.0,
        max=MAX_OUTPUT_MB,
        help="Most stream output (MB) one cell may send; the rest is dropped with a notice, so a "
        "runaway print loop cannot swamp the browser (0 = no limit).",
    ).tag(config=True)

    output_policy = Enum(
        ["auto", "safe", "trusted"],
        default_value="auto",
        help="What the sandbox's output may do in your browser. 'safe': scripts are removed "
        "(application/javascript, widget and plotly views, <script> and on*= handlers in HTML, SVG "
        "and markdown) and set_next_input may not replace your cell, because a script in an output "
        "runs with your Jupyter token. 'trusted': output is shown as ipykernel would show it; only "
        "for a sandbox you trust. 'auto': 'safe' on the daytona backend, 'trusted' on the local "
        "backend (its cells already run as you, on your machine). See docs/security-output.md.",
    ).tag(config=True)

    widget_modules = List(
        Unicode(),
        default_value=[],
        help="Widget modules (an ipywidgets model's _model_module/_view_module, such as 'jupyter-matplotlib' "
        "for ipympl) and comm targets allowed to reach your browser under the 'safe' output policy, besides "
        "ipywidgets' own. Such modules run their own JavaScript: list only those you trust.",
    ).tag(config=True)

    checkpoint_on_idle = Bool(
        False,
        help="Checkpoint the variables (%daytona checkpoint) shortly before auto_stop_interval "
        "would stop an idle sandbox, so %daytona restore can bring them back.",
    ).tag(config=True)

    attach = Enum(
        ["ask", "auto", "never"],
        default_value="ask",
        help="A kernel that starts for a notebook whose previous session still lives in the sandbox (its "
        "kernel was killed, or the laptop slept): 'ask' says so in one line and `%daytona attach` continues it "
        "(namespace, execution count, the last cell's output); 'auto' attaches before the first cell; 'never' "
        "does not look. A restart always gives a fresh namespace. See docs/reattach.md.",
    ).tag(config=True)

    detached_idle_minutes = FiniteFloat(
        1440.0,
        min=0.0,
        max=MAX_MINUTES,
        help="A detached session (no kernel owns it) whose last cell ended this many minutes ago is ended by "
        "the next kernel that starts in the sandbox and by `daytona-kernel gc`. A cell still running is never "
        "ended this way.",
    ).tag(config=True)

    fan_out_max = Int(
        8,
        min=1,
        max=MAX_WORKERS,
        help="Most engines one `%%daytona map N` cell may start (each is a sandbox of the main sandbox's "
        "size, billed while it runs; on the local backend, a worker process). See docs/fanout.md.",
    ).tag(config=True)

    local_python = Unicode(
        sys.executable,
        help="Python interpreter that runs cells on the local backend.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        self.config_problems: dict[str, str] = {}  # setting -> why its value was refused (see checked())
        super().__init__(**kwargs)

    def validate(self, check_credentials: bool = True) -> list[str]:
        """Every problem with the configuration, each with what to set."""
        problems = [
            f"{msg}. Fix it with --DaytonaKernel.{name}=..., {ENV_PREFIX}{name.upper()}, or daytona_kernel_config.py."
            for name, msg in sorted(self.config_problems.items())
        ]
        if check_credentials and self.backend == "daytona" and not has_credentials():
            problems.append(
                "No Daytona credentials: set DAYTONA_API_KEY (from https://app.daytona.io, "
                "Keys page) in the environment Jupyter starts kernels with, or choose the "
                "'Python (Daytona local)' kernel / DAYTONA_KERNEL_BACKEND=local to run locally."
            )
        if self.snapshot and self.image:
            problems.append("Both snapshot and image are set; choose one (DAYTONA_KERNEL_SNAPSHOT or DAYTONA_KERNEL_IMAGE).")
        if not self.mount_path.startswith("/"):
            problems.append(f"mount_path must be an absolute path, got {self.mount_path!r}.")
        return problems


def has_credentials(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the Daytona SDK will find credentials (an API key or a JWT) in the environment."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("DAYTONA_API_KEY") or environ.get("DAYTONA_JWT_TOKEN"))


def load_config(
    log: logging.Logger | None = None, sources: dict[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> Config:
    """Config from the files on the Jupyter config path (``jupyter_config.*``, then
    ``daytona_kernel_config.*``), then ``DAYTONA_KERNEL_*`` variables on top.

    The kernel application and the CLI (``doctor``, ``gc``, ``config``) all read it from
    here. ``sources``, when given, receives where each DaytonaKernel setting came from; ``environ``
    stands for ``os.environ`` (a kernelspec's environment on top of it, for ``config --kernel``).
    """
    from jupyter_core.paths import jupyter_config_path
    from traitlets.config.application import Application

    config = Config()
    found = {} if sources is None else sources
    for basename in CONFIG_FILES:
        for loaded, filename in Application._load_config_files(basename, path=jupyter_config_path(), log=log):
            if log is not None:
                log.debug("loaded config file %s", filename)
            found.update(dict.fromkeys(loaded.get(SECTION, {}), filename))
            config.merge(loaded)
    from_env = env_config(environ)
    found.update({name: f"environment {ENV_PREFIX}{name.upper()}" for name in from_env.get(SECTION, {})})
    config.merge(from_env)
    return config


def config_outside_kernel(config: Config | None = None) -> DaytonaKernelConfig:
    """The knobs a kernel started now would get, for the CLI (its ``DaytonaKernel`` section applies)."""
    good, problems = checked(load_config() if config is None else config)
    knobs = DaytonaKernelConfig(config=Config({"DaytonaKernelConfig": good.get(SECTION, Config())}))
    knobs.config_problems.update(problems)
    return knobs


def checked(config: Config) -> tuple[Config, dict[str, str]]:
    """``config`` without the values of our settings that do not validate, and why each was refused.

    A bad value must never crash the kernel: it is left out (the default applies) and
    reported in the first cell. Values are checked as traitlets would check them.
    """
    traits = DaytonaKernelConfig.class_traits(config=True)
    probe = DaytonaKernelConfig()
    section = Config(config.get(SECTION, Config()))
    problems: dict[str, str] = {}
    for name, value in list(section.items()):
        trait: Any = traits.get(name)
        if trait is None:
            continue  # not ours: traitlets reports unknown names as usual
        try:
            parsed = value.get_value(trait) if isinstance(value, DeferredConfig) else value
            trait.validate(probe, deepcopy(parsed))
        except (TraitError, ValueError, SyntaxError) as exc:
            problems[name] = f"{name} = {_shown(value)!r} is invalid: {str(exc).rstrip('.')}"
            del section[name]
    good = Config(config)
    good[SECTION] = section
    return good, problems


def _shown(value: object) -> object:
    return masked(str(value) if isinstance(value, DeferredConfigString) else value)


def env_config(environ: Mapping[str, str] | None = None) -> Config:
    """Config from ``DAYTONA_KERNEL_<TRAIT>`` variables (values parsed like the CLI's)."""
    environ = os.environ if environ is None else environ
    section = Config()
    traits = DaytonaKernelConfig.class_traits(config=True)
    for name, trait in traits.items():
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        if isinstance(trait, (List, Dict)):
            try:
                section[name] = json.loads(raw)
            except ValueError:
                section[name] = [s.strip() for s in raw.split(",") if s.strip()] if isinstance(trait, List) else raw
        elif isinstance(trait, Bool):
            section[name] = DeferredConfigString(raw.strip().lower())
        else:
            section[name] = DeferredConfigString(raw)
    return Config({SECTION: section}) if section else Config()


def env_problems(environ: Mapping[str, str]) -> list[str]:
    """What is wrong with the ``DAYTONA_KERNEL_*`` variables of ``environ``: a name that is no setting
    (with the closest one), or a value the setting refuses. Other variables are not looked at."""
    import difflib

    names = {ENV_PREFIX + name.upper() for name in DaytonaKernelConfig.class_trait_names(config=True)}
    problems = []
    for key in sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in names):
        close = difflib.get_close_matches(key, names, n=1)
        hint = f"; did you mean {close[0]}?" if close else "; `daytona-kernel config --help-all` lists the settings"
        problems.append(f"{key} is not a setting of this kernel{hint}")
    _, refused = checked(env_config(environ))
    problems.extend(refused[name] for name in sorted(refused))
    return problems


# -- narrow settings: what each component reads, frozen ------------------------------

S = TypeVar("S")


def settings_from(cls: type[S], config: DaytonaKernelConfig) -> S:
    """The settings dataclass ``cls``, filled from the traitlets of the same names."""
    return cls(**{f.name: deepcopy(getattr(config, f.name)) for f in fields(cls)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class SessionSettings:
    """What the session, its supervisor and its magics read."""

    backend: str = "daytona"
    cell_timeout: float = 0.0
    interrupt_grace: float = 3.0
    output_limit_mb: float = 20.0
    output_policy: str = "auto"
    widget_modules: list[str] = field(default_factory=list)
    auto_stop_interval: int = 15
    checkpoint_on_idle: bool = False
    repo_url: str = ""
    repo_ref: str = ""
    attach: str = "ask"
    detached_idle_minutes: float = 1440.0
    fan_out_max: int = 8

    @property
    def output_limit_chars(self) -> int:
        """``output_limit_mb`` as the characters a cell may print (0: no limit), converted here once."""
        return output_limit_chars(self.output_limit_mb)

    @property
    def run_timeout(self) -> float | None:
        """``cell_timeout`` as the timeout of a run of user code (a cell, a comm handler, a debug call): None for none."""
        return self.cell_timeout or None

    @property
    def output_trusted(self) -> bool:
        """Whether the sandbox's output is shown as it is (see ``output_policy``)."""
        return self.output_policy == "trusted" or (self.output_policy == "auto" and self.backend == "local")


@dataclass(frozen=True)
class MirrorSettings:
    """What the workdir mirror reads."""

    sync: str = "both"
    sync_exclude: list[str] = field(default_factory=list)
    sync_include: list[str] = field(default_factory=list)
    sync_deletes: bool = True
    sync_code_down: bool = True
    sync_max_file_mb: float = 100.0
    sync_max_total_mb: float = 1024.0


@dataclass(frozen=True)
class LocalSettings:
    """What the local backend reads."""

    sandbox_policy: str
    volume_name: str
    env: dict[str, str]
    local_python: str


@dataclass(frozen=True)
class DaytonaSettings:
    """What the Daytona backend reads."""

    sandbox_policy: str
    volume_name: str
    mount_path: str
    snapshot: str
    image: str
    cpu: int
    memory: int
    disk: int
    gpu: int
    labels: dict[str, str]
    idle_action: str
    auto_pause_interval: int
    auto_stop_interval: int
    checkpoint_on_idle: bool
    auto_archive_interval: int
    auto_delete_interval: int
    network_block_all: bool
    api_url: str
    target: str
    env: dict[str, str]
