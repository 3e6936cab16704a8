"""Kernelspecs: get_kernel_dict -> write_kernel_spec -> install, as ipykernel does.

The kernel.json template and logos live in the top-level ``kernelspec/``
folder (packaged as ``daytona_kernel/kernelspec`` in the wheel).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

from .config import ENV_PREFIX, SECRET_ENV_VARS

DEFAULT_SPECS = {
    "daytona": ("Python (Daytona)", {ENV_PREFIX + "BACKEND": "daytona"}),
    "daytona-local": ("Python (Daytona local)", {ENV_PREFIX + "BACKEND": "local"}),
}


def template_dir() -> Path:
    """The kernelspec template: packaged in the wheel, or beside the source tree."""
    packaged = Path(__file__).with_name("kernelspec")
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "kernelspec"


class SecretInSpecError(ValueError):
    """Refused: a credential would have been written into kernel.json."""


def get_kernel_dict(display_name: str, env: dict[str, str]) -> dict[str, Any]:
    """kernel.json content, with the absolute path of this interpreter as argv[0]."""
    secrets = sorted(k for k in env if k in SECRET_ENV_VARS)
    if secrets:
        raise SecretInSpecError(
            f"Refusing to write {', '.join(secrets)} into kernel.json, where anyone who can read "
            "your Jupyter folders would see it. Set it in the environment Jupyter starts from instead."
        )
    spec = json.loads((template_dir() / "kernel.json").read_text())
    spec["argv"][0] = sys.executable
    spec["display_name"] = display_name
    spec["env"] = dict(env)
    return spec


def write_kernel_spec(path: Path, display_name: str, env: dict[str, str]) -> Path:
    """Write kernel.json and the logos into ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    for logo in template_dir().glob("logo-*.png"):
        shutil.copy(logo, path / logo.name)
    (path / "kernel.json").write_text(json.dumps(get_kernel_dict(display_name, env), indent=2) + "\n")
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
    installed = []
    ksm = KernelSpecManager()
    for spec_name, spec_display, spec_env in wanted:
        with tempfile.TemporaryDirectory() as tmp:
            src = write_kernel_spec(Path(tmp) / spec_name, spec_display, spec_env)
            dest = ksm.install_kernel_spec(str(src), spec_name, user=user, prefix=prefix)
        installed.append((spec_name, dest))
    return installed


def ours() -> dict[str, dict[str, Any]]:
    """Installed kernelspecs that launch daytona_kernel, by name."""
    specs = KernelSpecManager().get_all_specs()
    return {n: s for n, s in specs.items() if "daytona_kernel" in s["spec"].get("argv", [])}


def uninstall(names: list[str]) -> list[str]:
    """Remove the named specs (default: all of ours). Returns the names removed."""
    ksm = KernelSpecManager()
    targets = names or sorted(ours())
    for name in targets:
        ksm.remove_kernel_spec(name)
    return targets
