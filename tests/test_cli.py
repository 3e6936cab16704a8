"""The ``daytona-kernel`` CLI, run as a user runs it: one test per behaviour a user relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daytona_kernel import __version__, kernelspec

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DAYTONA_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "daytona_kernel.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
        input=stdin if stdin is not None else "",
    )


def user_env(tmp_path: Path) -> dict[str, str]:
    """An installation of its own: Jupyter data, config and temp folders under tmp_path."""
    for name in ("data", "config", "tmp"):
        (tmp_path / name).mkdir(exist_ok=True)
    return {
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_PATH": "",
        "TMPDIR": str(tmp_path / "tmp"),
    }


# -- help and version ---------------------------------------------------------------


def test_no_arguments_prints_help() -> None:
    proc = cli()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: daytona-kernel")
    for command in ("install", "uninstall", "list", "gc", "doctor", "config", "example", "mcp"):
        assert command in proc.stdout


def test_version() -> None:
    proc = cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"daytona-kernel {__version__} (daytona SDK ")


def test_install_help_gives_the_default_location_and_examples(tmp_path: Path) -> None:
    proc = cli("install", "--help", env=user_env(tmp_path))
    assert proc.returncode == 0
    assert "system-wide:" in proc.stdout and "share/jupyter/kernels" in proc.stdout
    assert str(tmp_path / "data" / "kernels") in proc.stdout  # --user
    assert "examples:" in proc.stdout and "daytona-kernel install --user" in proc.stdout


def test_help_all_through_the_command_never_imports_from_the_current_folder(tmp_path: Path) -> None:
    """``python -m daytona_kernel`` runs a ``daytona_kernel/`` folder in the current folder (issue 20, item 10):
    the docs send users to ``daytona-kernel``, which does not."""
    planted = tmp_path / "daytona_kernel"
    planted.mkdir()
    (planted / "__init__.py").write_text(f"open({str(tmp_path / 'pwned')!r}, 'w').write('x')\n")
    (planted / "cli.py").write_text(f"open({str(tmp_path / 'pwned')!r}, 'w').write('x')\n")
    command = Path(sys.executable).with_name("daytona-kernel")
    proc = subprocess.run([str(command), "config", "--help-all"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "pwned").exists()
    from daytona_kernel.config import DaytonaKernelConfig

    for name in DaytonaKernelConfig.class_trait_names(config=True):
        assert f"--DaytonaKernel.{name}=" in proc.stdout, name


def test_the_docs_never_tell_users_to_type_python_m_daytona_kernel() -> None:
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for line in path.read_text().splitlines():
            if "python -m daytona_kernel" in line or "python3 -m daytona_kernel" in line:
                assert "never" in line or "-I" in line, f"{path.name}: {line}"
    from daytona_kernel.cli import build_parser

    assert "python -m" not in build_parser().format_help()


def test_kernel_help_describes_this_kernel_and_every_setting() -> None:
    short = subprocess.run([sys.executable, "-m", "daytona_kernel", "--help"], capture_output=True, text=True, timeout=60)
    assert short.returncode == 0
    assert short.stdout.startswith("The Daytona Jupyter kernel")
    assert "IPython: an enhanced interactive Python shell" not in short.stdout
    full = subprocess.run([sys.executable, "-m", "daytona_kernel", "--help-all"], capture_output=True, text=True, timeout=60)
    from daytona_kernel.config import DaytonaKernelConfig

    for name in DaytonaKernelConfig.class_trait_names(config=True):
        assert f"--DaytonaKernel.{name}=" in full.stdout, name
    assert "--autocall" not in full.stdout  # IPython shell options do nothing here


# -- install ----------------------------------------------------------------------


def test_install_writes_both_default_specs(tmp_path: Path) -> None:
    proc = cli("install", "--prefix", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    kernels = tmp_path / "share" / "jupyter" / "kernels"
    local = json.loads((kernels / "daytona-local" / "kernel.json").read_text())
    remote = json.loads((kernels / "daytona" / "kernel.json").read_text())
    assert local["display_name"] == "Python (Daytona local)"
    assert remote["display_name"] == "Python (Daytona)"
    for spec in (local, remote):
        assert spec["argv"] == [sys.executable, "-Xfrozen_modules=off", "-c", kernelspec.LAUNCH_CODE, "-f", "{connection_file}"]
        assert spec["interrupt_mode"] == "message"
        assert spec["language"] == "python"
        assert spec["metadata"] == {"debugger": True}
        assert spec["kernel_protocol_version"] == "5.3"
    assert local["env"]["DAYTONA_KERNEL_BACKEND"] == "local"
    assert remote["env"]["DAYTONA_KERNEL_BACKEND"] == "daytona"
    for logo in ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg"):
        assert (kernels / "daytona" / logo).is_file()
    assert f"Installed kernelspec daytona-local in {kernels / 'daytona-local'}" in proc.stdout


def test_install_refuses_to_shadow_ipykernels_python3_without_a_flag(tmp_path: Path) -> None:
    kernels = tmp_path / "share" / "jupyter" / "kernels"
    refused = cli("install", "--prefix", str(tmp_path), "--name", "python3")
    assert refused.returncode == 2
    assert "takes the place of ipykernel's own Python kernel" in refused.stderr and "--replace-kernel" in refused.stderr
    assert not (kernels / "python3").exists()
    forced = cli("install", "--prefix", str(tmp_path), "--name", "python3", "--replace-kernel")
    assert forced.returncode == 0, forced.stderr
    assert forced.stderr.startswith("warning: a kernelspec named python3 takes the place")
    assert kernelspec.is_ours(json.loads((kernels / "python3" / "kernel.json").read_text()))


def test_shipped_specs_are_what_install_writes() -> None:
    """The package-data specs (zero-step install) match get_kernel_dict, with a plain `python`."""
    for name, (display, env) in kernelspec.DEFAULT_SPECS.items():
        shipped = json.loads((ROOT / "kernelspec" / name / "kernel.json").read_text())
        assert shipped == kernelspec.get_kernel_dict(display, env, executable="python")
        for logo in kernelspec.RESOURCES:
            assert (ROOT / "kernelspec" / name / logo).read_bytes() == (ROOT / "kernelspec" / "daytona" / logo).read_bytes()


def test_named_spec_with_env(tmp_path: Path) -> None:
    proc = cli(
        "install",
        "--prefix",
        str(tmp_path),
        "--name",
        "gpu",
        "--display-name",
        "Python (GPU)",
        "--env",
        "DAYTONA_KERNEL_CELL_TIMEOUT=600",
        "--env",
        "DAYTONA_KERNEL_WORKSPACE_KEY=shared",
    )
    assert proc.returncode == 0, proc.stderr
    spec = json.loads((tmp_path / "share" / "jupyter" / "kernels" / "gpu" / "kernel.json").read_text())
    assert spec["display_name"] == "Python (GPU)"
    assert spec["env"] == {
        "DAYTONA_KERNEL_BACKEND": "daytona",
        "DAYTONA_KERNEL_CELL_TIMEOUT": "600",
        "DAYTONA_KERNEL_WORKSPACE_KEY": "shared",
    }


@pytest.mark.parametrize(
    ("pair", "named"),
    [
        ("DAYTONA_API_KEY=dtn_secret_value", "DAYTONA_API_KEY"),
        ("GIT_TOKEN=ghp_secret_value", "GIT_TOKEN"),
        ("OPENAI_API_KEY=sk-secret_value", "OPENAI_API_KEY"),
        ("MY_SECRET=secret_value", "MY_SECRET"),
        ("DB_PASSWORD=secret_value", "DB_PASSWORD"),
        ("AWS_CREDENTIALS_FILE=secret_value", "AWS_CREDENTIALS_FILE"),
        ("DAYTONA_KERNEL_REPO_URL=https://me:secret_value@github.com/me/repo", "DAYTONA_KERNEL_REPO_URL"),
        ("DAYTONA_KERNEL_REPO_URL=https://ghp_secret_value@github.com/me/repo", "DAYTONA_KERNEL_REPO_URL"),
        ('DAYTONA_KERNEL_ENV={"HF_TOKEN": "secret_value"}', "HF_TOKEN"),
        # issue 20, item 9: a token is refused by its value too, wherever it sits
        ("GITHUB_PAT=ghp_secret_value0123456789abcdefghijklmnop", "GITHUB_PAT"),
        ("GH_PAT=secret_value", "GH_PAT"),
        ("PROXY_AUTH=secret_value", "PROXY_AUTH"),
        ("HF=hf_secret_valueABCDEFGHIJKLMNOPQRSTUVWXYZ", "HF"),
        ("SLACK=xoxb-1234-secret_value", "SLACK"),
        ("AWS_ID=AKIASECRETVALUE12345", "AWS_ID"),
        ("OPENAI=sk-proj-secret_value0123456789", "OPENAI"),
        ('DAYTONA_KERNEL_ENV={"X": "ghp_secret_value0123456789abcdefghijklmnop"}', "DAYTONA_KERNEL_ENV"),
        ('DAYTONA_KERNEL_LABELS={"team": "glpat-secret_value0123456789"}', "DAYTONA_KERNEL_LABELS"),
        ('DAYTONA_KERNEL_ENV={"DB_URL": "postgres://me:secret_value@db/x"}', "DB_URL"),
    ],
)
def test_secrets_are_refused_and_nothing_is_written(tmp_path: Path, pair: str, named: str) -> None:
    proc = cli("install", "--prefix", str(tmp_path), "--name", "leaky", "--env", pair)
    assert proc.returncode == 2
    assert named in proc.stderr and "environment" in proc.stderr
    assert "secret_value" not in proc.stderr + proc.stdout
    assert not (tmp_path / "share").exists()


def test_a_url_without_credentials_is_fine(tmp_path: Path) -> None:
    proc = cli(
        "install",
        "--prefix",
        str(tmp_path),
        "--name",
        "repo",
        "--env",
        "DAYTONA_KERNEL_REPO_URL=https://github.com/me/repo.git",
        "--env",
        "PATH_EXTRA=/opt/pat/bin",
        "--env",
        "GIT_AUTHOR_NAME=Ada Lovelace",
        "--env",
        'DAYTONA_KERNEL_ENV={"MODEL": "sk-learn-like-name"}',
    )
    assert proc.returncode == 0, proc.stderr


def test_install_refuses_an_unknown_setting_and_names_the_closest(tmp_path: Path) -> None:
    proc = cli("install", "--prefix", str(tmp_path), "--name", "typo", "--env", "DAYTONA_KERNEL_CEL_TIMEOUT=2")
    assert proc.returncode == 2
    assert "DAYTONA_KERNEL_CEL_TIMEOUT" in proc.stderr and "DAYTONA_KERNEL_CELL_TIMEOUT" in proc.stderr
    assert not (tmp_path / "share").exists()


def test_install_refuses_an_invalid_value(tmp_path: Path) -> None:
    proc = cli("install", "--prefix", str(tmp_path), "--name", "bad", "--env", "DAYTONA_KERNEL_CELL_TIMEOUT=lots")
    assert proc.returncode == 2
    assert "cell_timeout" in proc.stderr and "lots" in proc.stderr
    assert not (tmp_path / "share").exists()


# -- list and uninstall -------------------------------------------------------------


def test_list_and_uninstall(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    name = "daytona-cli-test"
    assert cli("install", "--user", "--name", name, "--env", "DAYTONA_KERNEL_BACKEND=local", env=env).returncode == 0
    listing = cli("list", env=env)
    assert any(line.startswith(name) and "backend=local" in line for line in listing.stdout.splitlines())
    removed = cli("uninstall", "-y", name, env=env)
    assert removed.returncode == 0 and f"Removed kernelspec {name}" in removed.stdout
    assert not (tmp_path / "data" / "kernels" / name).exists()
    again = cli("uninstall", "-y", name, env=env)
    assert again.returncode == 1 and "no such kernelspec" in again.stderr


def _foreign_spec(tmp_path: Path, name: str = "python3") -> Path:
    folder = tmp_path / "data" / "kernels" / name
    folder.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3",
        "language": "python",
    }
    (folder / "kernel.json").write_text(json.dumps(spec))
    return folder


@pytest.mark.parametrize("where", ["before", "after"])
def test_global_flags_work_before_or_after_the_verb(tmp_path: Path, where: str) -> None:
    env = user_env(tmp_path)
    assert cli("install", "--user", "--name", "daytona-flags", env=env).returncode == 0
    args = ("-y", "uninstall", "daytona-flags") if where == "before" else ("uninstall", "daytona-flags", "-y")
    proc = cli(*args, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[y/N]" not in proc.stdout and not (tmp_path / "data" / "kernels" / "daytona-flags").exists()


def test_uninstall_refuses_a_spec_that_is_not_ours(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    folder = _foreign_spec(tmp_path)
    proc = cli("uninstall", "-y", "python3", env=env)
    assert proc.returncode == 1
    assert "python3" in proc.stderr and "not a daytona-kernel kernelspec" in proc.stderr
    assert "jupyter kernelspec uninstall python3" in proc.stderr
    assert (folder / "kernel.json").is_file()


def test_uninstall_without_names_removes_only_ours(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    foreign = _foreign_spec(tmp_path)
    assert cli("install", "--user", "--name", "daytona-mine", env=env).returncode == 0
    proc = cli("uninstall", "-y", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Removed kernelspec daytona-mine" in proc.stdout and "python3" not in proc.stdout
    assert foreign.is_dir() and not (tmp_path / "data" / "kernels" / "daytona-mine").exists()


@pytest.mark.parametrize(("answer", "removed"), [("y\n", True), ("n\n", False), ("", False)])
def test_uninstall_asks_before_deleting(tmp_path: Path, answer: str, removed: bool) -> None:
    env = user_env(tmp_path)
    assert cli("install", "--user", "--name", "daytona-ask", env=env).returncode == 0
    proc = cli("uninstall", "daytona-ask", env=env, stdin=answer)
    assert "Remove 1 kernelspec? [y/N]" in proc.stdout
    assert str(tmp_path / "data" / "kernels" / "daytona-ask") in proc.stdout
    assert (proc.returncode == 0) is removed
    assert (tmp_path / "data" / "kernels" / "daytona-ask").exists() is not removed
    if not removed:
        assert "Nothing was removed." in proc.stdout


# -- gc and doctor without a key ----------------------------------------------------------


def test_gc_without_a_key_cleans_the_local_backend_and_says_daytona_was_skipped(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    leftover = tmp_path / "tmp" / "daytona-kernel-doctor-abc123"
    leftover.mkdir()
    old = time.time() - 7200
    os.utime(leftover, (old, old))
    proc = cli("gc", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"removed doctor folder {leftover}" in proc.stdout and not leftover.exists()
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("skipped: Daytona")]
    assert skipped and "DAYTONA_API_KEY is not set" in skipped[0], proc.stdout
    assert "refused" not in proc.stdout and "restart the kernel" not in proc.stdout


def test_gc_local_never_asks_daytona(tmp_path: Path) -> None:
    env = {**user_env(tmp_path), "DAYTONA_API_KEY": "dtn_unused_key", "DAYTONA_API_URL": "http://127.0.0.1:9/api"}
    proc = cli("gc", "--local", "--dry-run", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Nothing to clean up for the local backend" in proc.stdout
    assert "Daytona" not in proc.stdout and "dtn_unused_key" not in proc.stdout + proc.stderr


def test_doctor_without_a_key_tests_the_local_kernel_and_says_daytona_was_skipped(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    assert cli("install", "--user", env=env).returncode == 0
    proc = cli("doctor", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    skipped = [line for line in lines if line.startswith("skipped: Daytona")]
    assert skipped and "DAYTONA_API_KEY is not set" in skipped[0] and "daytona-local" in skipped[0], proc.stdout
    assert "ok: a cell ran in local sandbox" in proc.stdout
    assert not [line for line in lines if line.startswith("FAIL")], proc.stdout


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_doctor_runs_a_cell_locally_and_leaves_nothing_behind(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    assert cli("install", "--user", env=env).returncode == 0
    before = _tree(tmp_path)
    proc = cli("doctor", env={**env, "DAYTONA_KERNEL_BACKEND": "local"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok: a cell ran in local sandbox" in proc.stdout
    assert _tree(tmp_path) - before == set(), "doctor left files behind"


def test_doctor_flags_a_spec_with_the_old_launcher(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    assert cli("install", "--user", env=env).returncode == 0
    path = tmp_path / "data" / "kernels" / "daytona" / "kernel.json"
    spec = json.loads(path.read_text())
    spec["argv"] = [sys.executable, "-m", "daytona_kernel", "-f", "{connection_file}"]
    path.write_text(json.dumps(spec))
    proc = cli("doctor", "--no-round-trip", env={**env, "DAYTONA_KERNEL_BACKEND": "local"})
    assert proc.returncode == 1
    assert any(line.startswith("FAIL: kernelspec daytona") and "old launcher" in line for line in proc.stdout.splitlines())


# -- config -------------------------------------------------------------------------


def test_config_shows_each_value_and_where_it_came_from(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    (tmp_path / "config" / "daytona_kernel_config.py").write_text(
        "c.DaytonaKernel.cell_timeout = 30.0\nc.DaytonaKernel.cpu = 2\n"
    )
    proc = cli("config", env={**env, "DAYTONA_KERNEL_CPU": "4", "DAYTONA_API_KEY": "dtn_secret_value"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert f"cell_timeout = 30.0  # {tmp_path / 'config' / 'daytona_kernel_config.py'}" in lines
    assert "cpu = 4  # environment DAYTONA_KERNEL_CPU" in lines
    assert "backend = 'daytona'  # default" in lines
    assert "DAYTONA_API_KEY: set" in lines
    assert "dtn_secret_value" not in proc.stdout


def test_config_for_a_kernel_shows_what_its_kernelspec_resolves_to(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    assert cli("install", "--user", env=env).returncode == 0
    assert cli("install", "--user", "--name", "daytona-slow", "--env", "DAYTONA_KERNEL_CELL_TIMEOUT=600", env=env).returncode == 0
    local = cli("config", "--kernel", "daytona-local", env=env)
    assert local.returncode == 0, local.stdout + local.stderr
    assert "backend = 'local'  # kernelspec daytona-local" in local.stdout.splitlines()
    slow = cli("config", "--kernel", "daytona-slow", env=env)
    assert "cell_timeout = 600.0  # kernelspec daytona-slow" in slow.stdout.splitlines(), slow.stdout
    missing = cli("config", "--kernel", "nope", env=env)
    assert missing.returncode == 1 and "no such kernelspec" in missing.stderr


def test_config_masks_env_values_and_url_credentials(tmp_path: Path) -> None:
    env = {
        **user_env(tmp_path),
        "DAYTONA_KERNEL_ENV": '{"HF_TOKEN": "hf_secret_value", "MODE": "fast"}',
        "DAYTONA_KERNEL_REPO_URL": "https://me:secret_value@github.com/me/repo.git",
        "DAYTONA_KERNEL_API_URL": "https://user:secret_value@api.example.com/api",
    }
    proc = cli("config", env=env)
    assert "secret_value" not in proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "env = {'HF_TOKEN': '***', 'MODE': '***'}  # environment DAYTONA_KERNEL_ENV" in lines
    assert "repo_url = 'https://***@github.com/me/repo.git'  # environment DAYTONA_KERNEL_REPO_URL" in lines
    assert any(line.startswith("API URL: https://***@api.example.com/api") for line in lines), lines


def test_generate_config_writes_a_commented_template_that_loads(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    proc = cli("--generate-config", env=env)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "config" / "daytona_kernel_config.py"
    text = path.read_text()
    from daytona_kernel.config import DaytonaKernelConfig

    for name in DaytonaKernelConfig.class_trait_names(config=True):
        assert f"# c.DaytonaKernel.{name} = " in text, name
    shown = cli("config", env=env)
    assert "backend = 'daytona'  # default" in shown.stdout  # everything in it is commented out
    kept = cli("--generate-config", env=env, stdin="n\n")
    assert kept.returncode == 1 and "Overwrite" in kept.stdout


# -- example ------------------------------------------------------------------------


def test_example_copies_the_notebook_and_never_overwrites(tmp_path: Path) -> None:
    proc = cli("example", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    notebook = tmp_path / "quickstart.ipynb"
    assert notebook.read_bytes() == (ROOT / "examples" / "quickstart.ipynb").read_bytes()
    assert "papermill" in proc.stdout
    notebook.write_text("mine")
    again = cli("example", str(tmp_path))
    assert again.returncode == 1 and notebook.read_text() == "mine"


# -- gc on the local backend --------------------------------------------------------------


def test_gc_on_the_local_backend_removes_leftovers_and_keeps_what_is_in_use(tmp_path: Path) -> None:
    env = {**user_env(tmp_path), "DAYTONA_KERNEL_BACKEND": "local"}
    root = tmp_path / "data" / "daytona-kernel"
    old = time.time() - 40 * 86400

    def made(path: Path, age: float | None = old, file: str = "f") -> Path:
        path.mkdir(parents=True)
        (path / file).write_text("x")
        if age is not None:
            for p in (path / file, path):
                os.utime(p, (age, age))
        return path

    dead_ephemeral = made(root / "sandboxes" / "local-0123456789ab")
    reuse_sandbox = made(root / "sandboxes" / "local-notebook-0123456789")
    old_copy = made(root / "volumes" / "daytona-kernel" / "old-0123456789")
    manifest = root / "manifests" / "local-daytona-kernel-old-0123456789.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("{}")
    fresh_copy = made(root / "volumes" / "daytona-kernel" / "fresh-0123456789", age=None)
    dead_pid = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    dead_inbox = made(tmp_path / "tmp" / f"daytona-kernel-inbox-{dead_pid}-abc123", age=None)
    live_inbox = made(tmp_path / "tmp" / f"daytona-kernel-inbox-{os.getpid()}-abc123")
    old_inbox = made(tmp_path / "tmp" / "daytona-kernel-inbox-abc123")  # named before the pid was in it
    doctor_dir = made(tmp_path / "tmp" / "daytona-kernel-doctor-abc123")
    unrelated = made(tmp_path / "tmp" / "something-else")

    dry = cli("gc", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"would remove ephemeral local sandbox {dead_ephemeral}" in dry.stdout
    assert dead_ephemeral.exists()

    proc = cli("gc", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DAYTONA_API_KEY" not in proc.stdout  # Daytona is not asked at all
    for gone in (dead_ephemeral, old_copy, manifest, dead_inbox, old_inbox, doctor_dir):
        assert not gone.exists(), gone
    for kept in (reuse_sandbox, fresh_copy, live_inbox, unrelated):
        assert kept.exists(), kept


# -- trying the Daytona backend without an account -----------------------------------


def test_the_emulator_command_lets_a_user_try_the_daytona_backend(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    assert cli("install", "--user", env=env).returncode == 0
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "serve_emulator.py")],
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("DAYTONA_")},
    )
    try:
        assert server.stdout is not None
        banner = []
        for line in server.stdout:
            banner.append(line)
            if line.strip().startswith("export "):
                break
        assert "IMITATION" in "".join(banner) and "NOT isolated" in "".join(banner)
        exported = dict(pair.split("=", 1) for pair in line.split()[1:])
        assert set(exported) == {"DAYTONA_API_KEY", "DAYTONA_API_URL", "DAYTONA_TARGET"}
        proc = cli("doctor", env={**env, **exported})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "ok: API reachable" in proc.stdout and "ok: a cell ran in" in proc.stdout
    finally:
        server.terminate()
        assert server.wait(30) == 0


# -- documentation ------------------------------------------------------------------


def test_the_usage_guide_lists_every_setting() -> None:
    from daytona_kernel.config import DaytonaKernelConfig

    text = (ROOT / "docs" / "usage.md").read_text()
    missing = [name for name in DaytonaKernelConfig.class_trait_names(config=True) if f"`{name}`" not in text]
    assert not missing, f"docs/usage.md does not describe {missing}"


def test_help_links_point_at_pages_that_exist() -> None:
    from daytona_kernel.kernel import DaytonaKernel

    urls = [link["url"] for link in DaytonaKernel.help_links]
    assert "https://www.daytona.io/docs/" in urls
    assert not [u for u in urls if "pypi.org/project/daytona-kernel" in u]  # not published there


def test_the_security_threat_list_names_tests_that_exist() -> None:
    """docs/security.md's threat table stays in step with the tests it names."""
    import re

    text = (ROOT / "docs" / "security.md").read_text()
    table = text[text.index("## Threats and the tests that hold them") :]
    named = set(re.findall(r"::(test_\w+)", table))
    assert len(named) >= 15
    defined = {m for path in (ROOT / "tests").glob("test_*.py") for m in re.findall(r"^def (test_\w+)", path.read_text(), re.M)}
    assert named <= defined, sorted(named - defined)
