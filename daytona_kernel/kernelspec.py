"""Kernelspecs: get_kernel_dict -> write_kernel_spec -> install, as ipykernel does.

The two default specs ship as package data (``share/jupyter/kernels/daytona*`` in the wheel,
from the top-level ``kernelspec/`` folder), so ``pip install`` alone makes them appear in
JupyterLab and VS Code. ``daytona-kernel install`` writes the same specs with this
interpreter's absolute path, for ``--user``, named and ``--env`` specs.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

from .config import ENV_PREFIX, TOKEN_VALUE, URL_USERINFO, DaytonaKernelConfig

# The launcher drops the working directory (the notebook's folder, which holds files the
# sandbox wrote) from sys.path before anything is imported; ``python -m`` would import this
# very package from there. ``python -P`` would do it too, but only from Python 3.11 on.
LAUNCH_CODE = "import sys; sys.path[0] == '' and sys.path.pop(0); from daytona_kernel.__main__ import launch; launch()"
# As ipykernel's spec: without it debugpy warns about frozen modules on the first cell.
PYTHON_ARGS = ["-Xfrozen_modules=off"]
KERNEL_PROTOCOL_VERSION = "5.3"

DEFAULT_SPECS = {
    "daytona": ("Python (Daytona)", {ENV_PREFIX + "BACKEND": "daytona"}),
    "daytona-local": ("Python (Daytona local)", {ENV_PREFIX + "BACKEND": "local"}),
}
RESOURCES = ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg")

SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
SECRET_NAME_WORDS = ("PAT", "PWD", "PASS", "AUTH", "PRIVATE")  # whole words: GITHUB_PAT, BASIC_AUTH; not PATH, GIT_AUTHOR_NAME
_TOKEN_PREFIXES = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "dtn_")  # a token as a URL's user


def template_dir(name: str = "daytona") -> Path:
    """A shipped spec folder: packaged in the wheel, or beside the source tree."""
    packaged = Path(__file__).with_name("kernelspec")
    root = packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "kernelspec"
    return root / name


# Names other kernels own: a spec of ours under one of them silently takes their place in every client that asks
# for it by name (JupyterLab's default kernel, papermill, MCP servers for Jupyter that hard-code python3).
SHADOWED_NAMES = ("python3", "python", "python2")


def shadows(name: str) -> str | None:
    """Why installing a spec named ``name`` would be a surprise, or None."""
    if name.lower() not in SHADOWED_NAMES:
        return None
    return (
        f"a kernelspec named {name} takes the place of ipykernel's own Python kernel: every client that asks for "
        f"{name} (JupyterLab's default kernel, papermill, MCP servers for Jupyter) would run on daytona-kernel "
        "instead, and notebooks saved that way say python3 for outputs daytona-kernel made"
    )


class SecretInSpecError(ValueError):
    """Refused: a credential would have been written into kernel.json."""


def _looks_secret(name: str) -> bool:
    upper = name.upper()
    if upper.startswith(ENV_PREFIX) and upper[len(ENV_PREFIX) :].lower() in DaytonaKernelConfig.class_trait_names(config=True):
        return False  # the kernel's own settings (workspace_key ...) are not secrets; their values are checked below
    words = re.split(r"[^A-Z0-9]+", upper)
    return any(part in upper for part in SECRET_NAME_PARTS) or any(word in words for word in SECRET_NAME_WORDS)


def _has_url_credentials(value: str) -> bool:
    return any(":" in m.group(2) or m.group(2).lower().startswith(_TOKEN_PREFIXES) for m in URL_USERINFO.finditer(value))


def secret_problems(env: dict[str, str]) -> list[str]:
    """Why each entry of ``env`` must not go into kernel.json (names only, never values).

    A secret is refused by its name (``..._TOKEN``, ``GITHUB_PAT``), by credentials in a URL
    (``user:password@``, a token as the user) and by a token in the value, wherever it sits
    (a JSON value of ``DAYTONA_KERNEL_ENV`` or ``DAYTONA_KERNEL_LABELS`` too)."""
    problems = []
    for name, value in env.items():
        if _looks_secret(name):
            problems.append(f"{name} looks like a secret")
        elif _has_url_credentials(value):
            problems.append(f"the value of {name} holds credentials in a URL (user:token@)")
        elif TOKEN_VALUE.search(value):
            problems.append(f"the value of {name} holds what looks like a token")
        if name.upper() == ENV_PREFIX + "ENV":  # the sandbox's environment, as JSON
            try:
                inner = json.loads(value)
            except ValueError:
                continue
            if isinstance(inner, dict):
                problems += [f"{name} sets {p}" for p in secret_problems({str(k): str(v) for k, v in inner.items()})]
    return problems


def get_kernel_dict(display_name: str, env: dict[str, str], executable: str | None = None) -> dict[str, Any]:
    """kernel.json content; argv[0] is this interpreter's absolute path unless given."""
    problems = secret_problems(env)
    if problems:
        raise SecretInSpecError(
            f"Refusing to write into kernel.json, where anyone who can read your Jupyter folders would see it: "
            f"{'; '.join(problems)}. Set it in the environment Jupyter starts from instead "
            "(e.g. export it in your shell before `jupyter lab`)."
        )
    return {
        "argv": [executable or sys.executable, *PYTHON_ARGS, "-c", LAUNCH_CODE, "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "message",
        "env": dict(env),
        "metadata": {"debugger": True},  # the debugger runs in the sandbox (docs/debugger.md)
        "kernel_protocol_version": KERNEL_PROTOCOL_VERSION,
    }


def write_kernel_spec(path: Path, display_name: str, env: dict[str, str]) -> Path:
    """Write kernel.json and the logos into ``path``."""
    spec = get_kernel_dict(display_name, env)
    path.mkdir(parents=True, exist_ok=True)
    for resource in RESOURCES:
        shutil.copy(template_dir() / resource, path / resource)
    (path / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
    return path


def install(
    name: str | None = None,
    display_name: str | None = None,
    env: dict[str, str] | None = None,
    user: bool = False,
    prefix: str | None = None,
) -> list[tuple[str, str]]:
    """Install one named spec, or both defaults. Returns (name, directory) pairs."""
    if name is None:
        wanted = [(n, d, dict(e, **(env or {}))) for n, (d, e) in DEFAULT_SPECS.items()]
    else:
        default_display, default_env = DEFAULT_SPECS.get(name, (f"Python (Daytona {name})", DEFAULT_SPECS["daytona"][1]))
        wanted = [(name, display_name or default_display, dict(default_env, **(env or {})))]
    for _, _, spec_env in wanted:  # refuse before anything is written
        get_kernel_dict("", spec_env)
    installed = []
    ksm = KernelSpecManager()
    for spec_name, spec_display, spec_env in wanted:
        with tempfile.TemporaryDirectory() as tmp:
            src = write_kernel_spec(Path(tmp) / spec_name, spec_display, spec_env)
            dest = ksm.install_kernel_spec(str(src), spec_name, user=user, prefix=prefix)
        installed.append((spec_name, dest))
    return installed


def is_ours(spec: dict[str, Any]) -> bool:
    """Does this kernel.json launch daytona_kernel (today's launcher, or the old ``-m`` one)?"""
    argv = spec.get("argv", [])
    return any(arg == "daytona_kernel" or "from daytona_kernel" in arg for arg in argv[1:])


def uses_old_launcher(spec: dict[str, Any]) -> bool:
    """An old spec (``python -m daytona_kernel``) imports from the notebook's folder: reinstall it."""
    return "daytona_kernel" in spec.get("argv", [])[1:]


def ours() -> dict[str, dict[str, Any]]:
    """Installed kernelspecs that launch daytona_kernel, by name."""
    specs = KernelSpecManager().get_all_specs()
    return {n: s for n, s in specs.items() if is_ours(s["spec"])}


def all_specs() -> dict[str, dict[str, Any]]:
    """Every installed kernelspec, ours or not, by name."""
    return KernelSpecManager().get_all_specs()


def remove(names: list[str]) -> None:
    """Remove these kernelspecs (the caller checked that they are ours)."""
    ksm = KernelSpecManager()
    for name in names:
        ksm.remove_kernel_spec(name)
