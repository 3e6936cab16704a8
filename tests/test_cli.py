"""The install/list/uninstall CLI, run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daytona_kernel.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_install_writes_both_default_specs(tmp_path: Path) -> None:
    proc = cli("install", "--prefix", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    kernels = tmp_path / "share" / "jupyter" / "kernels"
    local = json.loads((kernels / "daytona-local" / "kernel.json").read_text())
    remote = json.loads((kernels / "daytona" / "kernel.json").read_text())
    assert local["display_name"] == "Python (Daytona local)"
    assert remote["display_name"] == "Python (Daytona)"
    for spec in (local, remote):
        assert spec["argv"] == [sys.executable, "-m", "daytona_kernel", "-f", "{connection_file}"]
        assert os.path.isabs(spec["argv"][0])
        assert spec["interrupt_mode"] == "message"
        assert spec["language"] == "python"
        assert spec["metadata"] == {"debugger": False}
    assert local["env"]["DAYTONA_KERNEL_BACKEND"] == "local"
    assert remote["env"]["DAYTONA_KERNEL_BACKEND"] == "daytona"
    assert (kernels / "daytona" / "logo-64x64.png").is_file()
    assert f"Installed kernelspec daytona-local in {kernels / 'daytona-local'}" in proc.stdout


def test_named_spec_with_env(tmp_path: Path) -> None:
    proc = cli("install", "--prefix", str(tmp_path), "--name", "gpu", "--display-name", "Python (GPU)",
               "--env", "DAYTONA_KERNEL_CELL_TIMEOUT=600")
    assert proc.returncode == 0, proc.stderr
    spec = json.loads((tmp_path / "share" / "jupyter" / "kernels" / "gpu" / "kernel.json").read_text())
    assert spec["display_name"] == "Python (GPU)"
    assert spec["env"] == {"DAYTONA_KERNEL_BACKEND": "daytona", "DAYTONA_KERNEL_CELL_TIMEOUT": "600"}


def test_secrets_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    proc = cli("install", "--prefix", str(tmp_path), "--name", "leaky", "--env", "DAYTONA_API_KEY=dtn_secret_value")
    assert proc.returncode == 2
    assert "DAYTONA_API_KEY" in proc.stderr and "dtn_secret_value" not in proc.stderr
    assert not (tmp_path / "share" / "jupyter" / "kernels" / "leaky").exists()


def test_list_and_uninstall(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"JUPYTER_DATA_DIR": str(data)}
    name = "daytona-cli-test"  # a unique name, so no real installation is ever touched
    assert cli("install", "--user", "--name", name, "--env", "DAYTONA_KERNEL_BACKEND=local", env=env).returncode == 0
    listing = cli("list", env=env)
    assert any(line.startswith(name) and "backend=local" in line for line in listing.stdout.splitlines())
    removed = cli("uninstall", name, env=env)
    assert removed.returncode == 0 and f"Removed kernelspec {name}" in removed.stdout
    assert not (data / "kernels" / name).exists()
    assert cli("uninstall", name, env=env).returncode == 1
