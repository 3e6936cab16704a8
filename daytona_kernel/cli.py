"""``daytona-kernel install | uninstall | list | gc | doctor``: a thin argparse layer."""

from __future__ import annotations

import argparse
import errno
import sys

from . import kernelspec


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env takes KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def cmd_install(args: argparse.Namespace) -> int:
    prefix = sys.prefix if args.sys_prefix else args.prefix
    try:
        done = kernelspec.install(args.name, args.display_name, _parse_env(args.env), args.user, prefix)
    except kernelspec.SecretInSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno == errno.EACCES:
            print(f"{exc}\nPermission denied: try --user or --sys-prefix.", file=sys.stderr)
            return 1
        raise
    for name, path in done:
        print(f"Installed kernelspec {name} in {path}")
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    try:
        removed = kernelspec.uninstall(args.names)
    except KeyError as exc:
        print(f"error: no such kernelspec: {exc}", file=sys.stderr)
        return 1
    for name in removed:
        print(f"Removed kernelspec {name}")
    if not removed:
        print("No daytona-kernel kernelspecs are installed.")
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


def cmd_gc(args: argparse.Namespace) -> int:
    from . import admin

    return admin.run(admin.gc(args.older_than, args.dry_run, print))


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import admin

    return admin.run(admin.doctor(print, round_trip=not args.no_round_trip))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="daytona-kernel", description="Manage the Daytona Jupyter kernel.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("install", help="install the kernelspecs (default: daytona and daytona-local)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix (e.g. the virtualenv)")
    where.add_argument("--prefix", help="install into this prefix")
    p.add_argument("--name", help="install one spec with this name instead of the two defaults")
    p.add_argument("--display-name", help="the name shown in Jupyter")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for the kernel, e.g. DAYTONA_KERNEL_SNAPSHOT=gpu (repeatable)")
    p.set_defaults(func=cmd_install)

    p = sub.add_parser("uninstall", help="remove kernelspecs (default: all daytona-kernel ones)")
    p.add_argument("names", nargs="*")
    p.set_defaults(func=cmd_uninstall)

    p = sub.add_parser("list", help="list the installed daytona-kernel kernelspecs")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("gc", help="stop or delete sandboxes whose kernel is gone or that sat idle")
    p.add_argument("--older-than", type=_duration, default=3600.0, metavar="AGE",
                   help="idle time that makes a running sandbox an orphan (default 1h; e.g. 30m, 2d)")
    p.add_argument("--dry-run", action="store_true", help="only list what would be done")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("doctor", help="check configuration, credentials, API, volume, kernelspecs and a round trip")
    p.add_argument("--no-round-trip", action="store_true", help="skip running a test cell in a sandbox")
    p.set_defaults(func=cmd_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
