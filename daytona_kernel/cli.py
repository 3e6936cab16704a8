"""``daytona-kernel install | uninstall | list | doctor | gc | config | example | mcp``: a thin argparse layer."""

from __future__ import annotations

import argparse
import errno
import functools
import shutil
import sys
from importlib import metadata
from pathlib import Path

from . import __version__, kernelspec

DESCRIPTION = """\
A Jupyter kernel for Python that runs every cell in a Daytona sandbox (kernel "Python (Daytona)",
needs DAYTONA_API_KEY) or in a worker process on this machine (kernel "Python (Daytona local)").
Installing the package already made both kernels available to Jupyter in this environment."""

EPILOG = """\
examples:
  daytona-kernel doctor                 check configuration, credentials and a test cell
  daytona-kernel config                 show the settings in effect and where each comes from
  daytona-kernel config --help-all      every setting with its help
  daytona-kernel install --user         make the kernels available outside this environment
  daytona-kernel gc --dry-run           list sandboxes whose kernel is gone
  daytona-kernel example                copy the example notebook here
  daytona-kernel mcp                    serve a sandboxed kernel to a coding agent (docs/agents.md)"""


def _install_epilog() -> str:
    from jupyter_core.paths import SYSTEM_JUPYTER_PATH, jupyter_data_dir

    return f"""\
where the specs go (as with `jupyter kernelspec install`):
  (default)      system-wide: {Path(SYSTEM_JUPYTER_PATH[0]) / "kernels"} (needs write access)
  --user         {Path(jupyter_data_dir()) / "kernels"}
  --sys-prefix   {Path(sys.prefix) / "share" / "jupyter" / "kernels"}
  --prefix P     P/share/jupyter/kernels

`pip install daytona-kernel` already puts `daytona` and `daytona-local` into this environment's
share/jupyter/kernels. Use this command for a --user install, for another display name, or for a
named spec with its own settings.

examples:
  daytona-kernel install --user
  daytona-kernel install --user --name daytona-gpu --display-name "Python (Daytona GPU)" \\
      --env DAYTONA_KERNEL_SNAPSHOT=my-gpu-snapshot --env DAYTONA_KERNEL_SANDBOX_POLICY=ephemeral
  daytona-kernel install --sys-prefix --name daytona-eu --env DAYTONA_KERNEL_TARGET=eu

Secrets are refused (names with KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL, AUTH or PAT, URLs with
user:token@, and values that look like a token, inside JSON values too): kernel.json is readable
by anyone who can read your Jupyter folders. Set them in the environment Jupyter starts from
instead."""


def _version() -> str:
    try:
        sdk = metadata.version("daytona")
    except metadata.PackageNotFoundError:
        sdk = "not installed"
    return f"daytona-kernel {__version__} (daytona SDK {sdk}, Python {sys.version.split()[0]})"


def _confirm(question: str) -> bool:
    """Ask on the terminal; no answer (EOF, e.g. no stdin) means no."""
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        print()
        return False


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --env takes KEY=VALUE, got {key or pair!r}")
        env[key] = value
    return env


def cmd_install(args: argparse.Namespace) -> int:
    from .config import env_problems

    prefix = sys.prefix if args.sys_prefix else args.prefix
    env = _parse_env(args.env)
    problems = env_problems(env)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        print("Nothing was installed.", file=sys.stderr)
        return 2
    shadow = kernelspec.shadows(args.name or "")
    if shadow and not args.replace_kernel:
        print(
            f"error: {shadow}. Nothing was installed. Pick another --name, or add --replace-kernel if you mean it.",
            file=sys.stderr,
        )
        return 2
    if shadow:
        print(f"warning: {shadow}.", file=sys.stderr)
    try:
        done = kernelspec.install(args.name, args.display_name, env, args.user, prefix)
    except kernelspec.SecretInSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno == errno.EACCES:
            print(f"error: {exc}\nPermission denied: try --user or --sys-prefix.", file=sys.stderr)
            return 1
        raise
    for name, path in done:
        print(f"Installed kernelspec {name} in {path}")
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    specs = kernelspec.all_specs()
    names = args.names or sorted(n for n, s in specs.items() if kernelspec.is_ours(s["spec"]))
    if not names:
        print("No daytona-kernel kernelspecs are installed.")
        return 0
    missing = [n for n in names if n not in specs]
    if missing:
        print(f"error: no such kernelspec: {', '.join(missing)} (see `daytona-kernel list`)", file=sys.stderr)
        return 1
    foreign = [n for n in names if not kernelspec.is_ours(specs[n]["spec"])]
    if foreign:
        for name in foreign:
            print(
                f"error: {name} ({specs[name]['resource_dir']}) is not a daytona-kernel kernelspec; nothing was removed. "
                f"If you mean to remove it, use `jupyter kernelspec uninstall {name}`.",
                file=sys.stderr,
            )
        return 1
    print("Kernelspecs to remove:")
    for name in names:
        print(f"  {name:20} {specs[name]['resource_dir']}")
    if not args.yes and not _confirm(f"Remove {len(names)} kernelspec{'s' if len(names) > 1 else ''}?"):
        print("Nothing was removed.")
        return 1
    kernelspec.remove(names)
    for name in names:
        print(f"Removed kernelspec {name}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    specs = kernelspec.ours()
    if not specs:
        print("No daytona-kernel kernelspecs are installed. Run: daytona-kernel install --user")
        return 0
    for name, info in sorted(specs.items()):
        spec = info["spec"]
        backend = spec.get("env", {}).get("DAYTONA_KERNEL_BACKEND", "daytona")
        print(f"{name:20} {spec['display_name']:28} backend={backend:8} {info['resource_dir']}")
    return 0


def _duration(text: str) -> float:
    """``90s``, ``30m``, ``1h``, ``2d`` -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 30m, 1h, 2d)") from None


def _duration_or_never(text: str) -> float | None:
    return None if text == "never" else _duration(text)


def cmd_gc(args: argparse.Namespace) -> int:
    from . import admin

    return admin.run(
        admin.gc(
            args.older_than, args.dry_run, print, args.volumes_older_than, args.delete_stopped, args.paused_older_than, args.local
        )
    )


def cmd_reap(args: argparse.Namespace) -> int:
    from . import admin
    from .backends.daytona.states import reap

    return admin.run(reap(args.sandbox_id, args.api_url, args.target, lambda line: print(line, file=sys.stderr)))


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import admin

    return admin.run(admin.doctor(print, round_trip=not args.no_round_trip))


def cmd_config(args: argparse.Namespace) -> int:
    from . import admin

    if args.generate:
        return admin.generate_config(print, args.yes, _confirm)
    if args.help_all:  # the kernel's own options, from this installed package (never from the current folder)
        from .app import DaytonaKernelApp

        try:
            DaytonaKernelApp.launch_instance(argv=["--help-all"])
        except SystemExit as exc:
            return int(exc.code or 0)
        return 0
    if args.kernel is not None and args.kernel not in kernelspec.all_specs():
        print(f"error: no such kernelspec: {args.kernel} (see `daytona-kernel list`)", file=sys.stderr)
        return 1
    return admin.show_config(print, args.kernel)


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        from . import mcp_server
    except ImportError as exc:
        print(f"error: the MCP server needs the [mcp] extra ({exc}): pip install 'daytona-kernel[mcp]'", file=sys.stderr)
        return 2
    return mcp_server.main(args.kernel, args.folder, args.notebook)


def example_notebook() -> Path:
    """The example notebook: packaged in the wheel, or in the source tree."""
    packaged = Path(__file__).with_name("examples") / "quickstart.ipynb"
    return packaged if packaged.is_file() else Path(__file__).resolve().parent.parent / "examples" / "quickstart.ipynb"


def cmd_example(args: argparse.Namespace) -> int:
    dest = Path(args.dest)
    if dest.is_dir():
        dest = dest / "quickstart.ipynb"
    if dest.exists():
        print(f"error: {dest} exists; nothing was written. Give another path: daytona-kernel example PATH", file=sys.stderr)
        return 1
    shutil.copyfile(example_notebook(), dest)
    print(f"Wrote {dest}. Run it on this machine with: papermill {dest} out.ipynb -k daytona-local")
    return 0


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="daytona-kernel", description=DESCRIPTION, epilog=EPILOG, formatter_class=raw)
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument(
        "--generate-config",
        action="store_true",
        help="write a commented daytona_kernel_config.py into the Jupyter config folder (same as `config --generate`)",
    )
    yes_help = "answer yes to questions (remove kernelspecs, overwrite the config file)"
    parser.add_argument("-y", "--yes", action="store_true", help=yes_help)
    # The global flags work after the verb too; SUPPRESS keeps a verb's parser from resetting one given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-y", "--yes", action="store_true", default=argparse.SUPPRESS, help=yes_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_parser = functools.partial(sub.add_parser, parents=[common])

    p = add_parser(
        "install",
        help="install kernelspecs (default: daytona and daytona-local)",
        description="Install the kernelspecs `daytona` and `daytona-local`, or one named spec.",
        epilog=_install_epilog(),
        formatter_class=raw,
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix (e.g. the virtualenv)")
    where.add_argument("--prefix", help="install into this prefix")
    p.add_argument("--name", help="install one spec with this name instead of the two defaults")
    p.add_argument("--display-name", help="the name shown in Jupyter")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for the kernel, e.g. DAYTONA_KERNEL_SNAPSHOT=gpu (repeatable; no secrets)",
    )
    p.add_argument(
        "--replace-kernel",
        action="store_true",
        help="allow a --name that takes the place of ipykernel's own kernel (python3): refused without it",
    )
    p.set_defaults(func=cmd_install)

    p = add_parser(
        "uninstall",
        help="remove daytona-kernel kernelspecs (asks first)",
        description="Remove kernelspecs of this kernel (default: all of them). Asks before deleting.",
    )
    p.add_argument("names", nargs="*", metavar="NAME")
    p.set_defaults(func=cmd_uninstall)

    p = add_parser("list", help="list the installed daytona-kernel kernelspecs")
    p.set_defaults(func=cmd_list)

    p = add_parser(
        "gc",
        help="clean up after kernels that are gone",
        description="Daytona backend: stop (or delete, if ephemeral) this installation's sandboxes whose kernel is "
        "gone or that sat idle, and paused ones idle past --paused-older-than; sandboxes in a transition are left alone. Local backend "
        "(--local, DAYTONA_KERNEL_BACKEND=local, or no DAYTONA_API_KEY): remove leftover sandboxes, input() inboxes and old "
        "working copies.",
    )
    p.add_argument(
        "--older-than",
        type=_duration,
        default=3600.0,
        metavar="AGE",
        help="idle time that makes a running sandbox or a leftover an orphan (default 1h; e.g. 30m, 2d)",
    )
    p.add_argument(
        "--volumes-older-than",
        type=_duration,
        default=30 * 86400.0,
        metavar="AGE",
        help="local backend: remove working copies unused this long (default 30d); files only there "
        "(over sync_max_file_mb, or with sync off) go with them",
    )
    p.add_argument(
        "--delete-stopped",
        action="store_true",
        help="Daytona: also delete stopped or archived sandboxes idle longer than --older-than (e.g. "
        "--older-than 7d); they count against the disk quota. Their own disk goes; the volume stays",
    )
    p.add_argument(
        "--paused-older-than",
        type=_duration_or_never,
        default=7 * 86400.0,
        metavar="AGE",
        help="Daytona: stop paused sandboxes idle this long (default 7d; 'never' keeps them). Daytona "
        "never archives or deletes a paused sandbox, and its disk is billed and counts against the quota; "
        "stopping keeps its files (then auto-archive applies) but loses its variables",
    )
    p.add_argument("--dry-run", action="store_true", help="only list what would be done")
    p.add_argument("--local", action="store_true", help="clean up only the local backend's leftovers (no Daytona key needed)")
    p.set_defaults(func=cmd_gc)

    p = add_parser(
        "reap",
        help="delete one sandbox once its change of state has ended (a kernel's shutdown hands it over)",
    )
    p.add_argument("sandbox_id", help="the sandbox's id or name")
    p.add_argument("--api-url", required=True, help="the Daytona API the sandbox is in")
    p.add_argument("--target", default="", help="the Daytona target (region)")
    p.set_defaults(func=cmd_reap)

    p = add_parser("doctor", help="check configuration, credentials, API, volume, kernelspecs and a test cell")
    p.add_argument("--no-round-trip", action="store_true", help="skip running a test cell in a sandbox")
    p.set_defaults(func=cmd_doctor)

    p = add_parser("config", help="show the effective configuration and where each value came from")
    p.add_argument("--generate", action="store_true", help="write a commented daytona_kernel_config.py instead")
    p.add_argument("--help-all", action="store_true", help="list every setting of the kernel with its help")
    p.add_argument(
        "--kernel", metavar="NAME", help="show the settings a kernel started from this kernelspec gets (e.g. daytona-local)"
    )
    p.set_defaults(func=cmd_config)

    p = add_parser("example", help="copy the example notebook (quickstart.ipynb) to a folder")
    p.add_argument("dest", nargs="?", default=".", help="folder or file name (default: the current folder)")
    p.set_defaults(func=cmd_example)

    p = add_parser(
        "mcp",
        help="serve a sandboxed Python kernel to a coding agent (MCP over stdio)",
        description="A Model Context Protocol server over stdio: the agent runs Python in a daytona-kernel started "
        "in --folder and shut down when the agent disconnects. Needs: pip install 'daytona-kernel[mcp]'. Settings "
        "come from the kernel's own config (daytona-kernel config). See docs/agents.md.",
    )
    p.add_argument(
        "--kernel",
        default="daytona",
        metavar="NAME",
        help="the kernelspec: daytona (the default: a Daytona sandbox) or daytona-local (this machine: not isolation)",
    )
    p.add_argument("--folder", default=".", help="the project folder the kernel starts in (default: the current folder)")
    p.add_argument("--notebook", metavar="PATH", help="append every run to this .ipynb, a transcript a person can open")
    p.set_defaults(func=cmd_mcp)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.generate_config:
        from . import admin

        return admin.generate_config(print, args.yes, _confirm)
    if args.command is None:
        parser.print_help()
        return 0
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
