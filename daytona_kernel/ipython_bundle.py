"""IPython for a sandbox that has none: the kernel's own pure-Python IPython, in one archive.

The archive holds IPython, matplotlib-inline and every package they require (for the
sandbox's Python version), taken from the kernel's environment as installed, with their
``.dist-info`` folders so ``importlib.metadata`` works there too. Compiled files are left
out: the shipped code must run on any CPU; a package that is nothing without them
(``NATIVE_ONLY``) is left out whole, and IPython imports it only on demand.
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import io
import tarfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOTS = ("ipython", "matplotlib-inline")
NATIVE_ONLY = frozenset({"psutil"})  # IPython imports it lazily (%kitty); no pure-Python form exists
COMPILED_SUFFIXES = (".so", ".pyd", ".dylib", ".pyc")


def ipython_version() -> str:
    return metadata.version("ipython")


def supports(python: str) -> bool:
    """Whether the kernel's IPython runs on a sandbox's Python (``"3.11.7"``)."""
    required = metadata.distribution("ipython").metadata["Requires-Python"] or ""
    return SpecifierSet(required).contains(python, prereleases=True)


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def distributions(python: str) -> list[metadata.Distribution]:
    """IPython's distributions and their requirements, as the sandbox's Python would need them."""
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
    pending = list(ROOTS)
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


@functools.lru_cache(maxsize=4)
def archive(python: str) -> bytes:
    """A gzipped tar of the packages, paths relative to a site-packages folder."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for dist in distributions(python):
            for file in dist.files or ():
                rel = str(file)
                if rel.startswith("..") or "__pycache__" in rel or rel.endswith(COMPILED_SUFFIXES):
                    continue  # scripts outside site-packages, bytecode and compiled code stay here
                path = Path(file.locate())
                if path.is_file():
                    tar.add(str(path), arcname=rel, recursive=False)
    return buf.getvalue()
