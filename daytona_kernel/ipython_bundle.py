"""IPython for a sandbox that has none: the kernel's own pure-Python IPython, in one archive
(and, the same way, debugpy for the debugger: ``DEBUGPY``, shipped when the frontend first asks for it).

The archive holds IPython, matplotlib-inline and every package they require (for the
sandbox's Python version), taken from the kernel's environment as installed, with their
``.dist-info`` folders so ``importlib.metadata`` works there too. Compiled files are left
out: the shipped code must run on any CPU; a package that is nothing without them
(``NATIVE_ONLY``) is left out whole, and IPython imports it only on demand. jedi's stubs of
third-party packages are left out too (``LEFT_OUT``): they were 60% of the archive's bytes and
70% of its files, and without them completion reads those packages' own source, as it does for
any package without stubs.

An archive is built once per IPython version, sandbox Python and set of packages, and kept
in the kernel machine's Jupyter data folder (``cache_path``): the next kernel that ships
the same one reads it instead of compressing 15 MB again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib.metadata as metadata
import io
import logging
import os
import secrets
import tarfile
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

from .backends.base import Context, Sandbox
from .errors import DaytonaKernelError
from .runtime import discard_file_code, unpack_ipython_code

ROOTS = ("ipython", "matplotlib-inline")
DEBUGPY = ("debugpy",)  # pydevd runs as pure Python without its Cython speed-ups (it says so only if asked to use them)
NATIVE_ONLY = frozenset({"psutil"})  # IPython imports it lazily (%kitty); no pure-Python form exists
# compiled code, and the sources of debugpy's speed-ups and attach helpers (C, C++, Cython), which nothing imports
COMPILED_SUFFIXES = (".so", ".pyd", ".dylib", ".pyc", ".dll", ".exe", ".pdb", ".c", ".cpp", ".h", ".hpp", ".pyx", ".pxd")
LEFT_OUT = ("jedi/third_party/typeshed/stubs/", "jedi/third_party/django-stubs/")
FORMAT = "2"  # part of the cache key: bump it when what goes into an archive changes

log = logging.getLogger("daytona_kernel.ipython_bundle")


def ipython_version() -> str:
    return metadata.version("ipython")


def supports(python: str, roots: tuple[str, ...] = ROOTS) -> bool:
    """Whether the kernel's IPython (or ``roots[0]``) runs on a sandbox's Python (``"3.11.7"``)."""
    from packaging.specifiers import SpecifierSet  # only for a sandbox without IPython: not before kernel_info (10 ms)

    required = metadata.distribution(roots[0]).metadata["Requires-Python"] or ""
    return SpecifierSet(required).contains(python, prereleases=True)


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def distributions(python: str, roots: tuple[str, ...] = ROOTS) -> list[metadata.Distribution]:
    """IPython's (or ``roots``') distributions and their requirements, as the sandbox's Python would need them."""
    from packaging.requirements import Requirement

    major_minor = ".".join(python.split(".")[:2])
    env = {
        "python_version": major_minor,
        "python_full_version": python,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    found: dict[str, metadata.Distribution] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        if _key(name) in found or _key(name) in NATIVE_ONLY:
            continue
        dist = metadata.distribution(name)
        found[_key(name)] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(env):
                pending.append(req.name)
    return sorted(found.values(), key=lambda d: _key(d.metadata["Name"]))


def cache_path(python: str, dists: list[metadata.Distribution], roots: tuple[str, ...] = ROOTS) -> Path:
    """Where the archive for ``dists`` (of ``roots``) on a sandbox Python ``python`` is kept on this machine."""
    packages = ",".join(f"{_key(d.metadata['Name'])}=={d.version}" for d in dists)
    digest = hashlib.sha256(f"{FORMAT}|{packages}|{LEFT_OUT}".encode()).hexdigest()[:16]
    major_minor = ".".join(python.split(".")[:2])
    name = f"{_key(roots[0])}-{metadata.version(roots[0])}-py{major_minor}-{digest}.tar.gz"
    return Path(jupyter_data_dir()) / "daytona-kernel" / "ipython" / name


@functools.lru_cache(maxsize=4)
def archive(python: str, roots: tuple[str, ...] = ROOTS) -> bytes:
    """A gzipped tar of the packages, paths relative to a site-packages folder (from the cache when it is there)."""
    dists = distributions(python, roots)
    path = cache_path(python, dists, roots)
    try:
        return path.read_bytes()
    except OSError:
        pass  # not cached on this machine yet: built below
    data = _build(dists)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        part.write_bytes(data)
        os.replace(part, path)
    except OSError as exc:  # a read-only or full disk: the next kernel builds it again
        log.info("could not keep the IPython archive in %s: %s", path.parent, exc)
    return data


def _build(dists: list[metadata.Distribution]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for dist in dists:
            for file in dist.files or ():
                rel = str(file)
                if rel.startswith("..") or "__pycache__" in rel or rel.endswith(COMPILED_SUFFIXES) or rel.startswith(LEFT_OUT):
                    continue  # scripts outside site-packages, bytecode, compiled code and jedi's other stubs stay here
                path = Path(file.locate())
                if path.is_file():
                    tar.add(str(path), arcname=rel, recursive=False)
    return buf.getvalue()


async def ship(
    sandbox: Sandbox, context: Context, python: str, folder: str, timeout_s: float, roots: tuple[str, ...] = ROOTS
) -> tuple[str, int]:
    """Upload the archive for ``python`` (of ``roots``) into the sandbox and unpack it into ``folder`` (through
    ``context``): ("", its size in bytes), or (why it could not be installed, 0)."""
    archive_path = f"{folder}.{secrets.token_hex(4)}.tar.gz"  # its own: kernels may ship at once
    output: list[str] = []
    data = b""
    try:
        data = await asyncio.to_thread(archive, python, roots)
        try:
            await sandbox.toolbox.upload([(data, archive_path)])
        except DaytonaKernelError:
            # the daemon writes in place: an upload that failed (a full disk) leaves a truncated file
            with contextlib.suppress(DaytonaKernelError):
                await context.run_code(discard_file_code(archive_path), output.append, output.append, timeout_s)
            raise
        error = await context.run_code(unpack_ipython_code(archive_path, folder), output.append, output.append, timeout_s)
    except DaytonaKernelError as exc:
        error, output = None, [str(exc)]
    if error is not None:
        return f"{error.name}: {error.value}", 0
    if output:
        return "".join(output).strip(), 0
    return "", len(data)
