"""The shipped IPython's archive, without a sandbox: what goes in, the kernel machine's cache of it,
and the code that unpacks it (with the system's tar, and without)."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

from daytona_kernel import ipython_bundle
from daytona_kernel.runtime import unpack_ipython_code

PYTHON = ".".join(map(str, sys.version_info[:3]))


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    ipython_bundle.archive.cache_clear()
    yield tmp_path / "data"
    ipython_bundle.archive.cache_clear()


def test_the_archive_leaves_out_jedis_third_party_stubs_and_is_built_once_per_machine(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = ipython_bundle.archive(PYTHON)
    names = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz").getnames()
    assert "IPython/__init__.py" in names and "jedi/third_party/typeshed/stdlib/builtins.pyi" in names
    assert not [n for n in names if n.startswith(ipython_bundle.LEFT_OUT) or n.endswith(".pyc")]
    cached = list((data_dir / "daytona-kernel" / "ipython").iterdir())
    assert [p.name for p in cached] == [ipython_bundle.cache_path(PYTHON, ipython_bundle.distributions(PYTHON)).name]
    assert cached[0].read_bytes() == data

    def no_build(dists: object) -> bytes:
        raise AssertionError("built again although the cache has it")

    monkeypatch.setattr(ipython_bundle, "_build", no_build)
    ipython_bundle.archive.cache_clear()
    assert ipython_bundle.archive(PYTHON) == data  # a new kernel process reads the kept one
    other = ipython_bundle.cache_path("3.99.0", ipython_bundle.distributions(PYTHON))
    assert other != cached[0] and "py3.99" in other.name  # another sandbox Python gets its own


@pytest.mark.parametrize("with_tar", [True, False], ids=["system tar", "tarfile"])
def test_the_unpacking_code_fills_the_cache_folder_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_tar: bool) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in (("pkg/__init__.py", b"x = 1\n"), ("pkg/sub/mod.py", b"y = 2\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    archive, folder = tmp_path / "ipython-x.1234.tar.gz", tmp_path / "ipython-x"
    archive.write_bytes(buf.getvalue())
    if not with_tar:
        monkeypatch.setenv("PATH", "")
    exec(unpack_ipython_code(str(archive), str(folder)), {})
    assert (folder / "pkg" / "sub" / "mod.py").read_text() == "y = 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ipython-x"]  # no archive, no partial folder left


def test_the_runtime_is_compiled_once_per_sandbox_and_a_bad_cache_is_compiled_again(tmp_path: Path) -> None:
    """The bootstrap loads the runtime's modules from a marshal cache in the sandbox's home when one
    is there for its sources and Python, and compiles (and rewrites it) when it is missing or unreadable."""
    import marshal
    import os
    import subprocess

    from daytona_kernel.runtime import bootstrap_code
    from daytona_kernel.runtime.calls import RuntimeOptions

    boot, result = tmp_path / "boot.py", tmp_path / "result.txt"
    boot.write_text(bootstrap_code("tok", RuntimeOptions()))
    probe = f"exec(open({str(boot)!r}).read())\nimport sys\nopen({str(result)!r}, 'w').write(repr(getattr(sys.modules['_daytona_kernel_framing'], 'MARK_OF_THE_CACHE', None)))\n"

    def bootstrap() -> str:
        subprocess.run(
            [sys.executable, "-c", probe], env=dict(os.environ, HOME=str(tmp_path)), cwd=tmp_path, check=True, capture_output=True
        )
        return result.read_text()

    assert bootstrap() == "None"
    (cache,) = (tmp_path / ".cache" / "daytona-kernel-runtime").glob("runtime-*.marshal")
    codes = marshal.loads(cache.read_bytes())
    codes["_daytona_kernel_framing"] = compile("MARK_OF_THE_CACHE = 1\n", "<daytona-kernel-framing>", "exec")
    cache.write_bytes(marshal.dumps(codes))
    with pytest.raises(subprocess.CalledProcessError):
        bootstrap()  # the cached (altered) framing module ran, not a fresh compile: the runtime cannot start on it
    cache.write_bytes(b"\x00 not marshal")
    assert bootstrap() == "None"  # compiled again, and the cache rewritten
    assert marshal.loads(cache.read_bytes())["_daytona_kernel_framing"].co_filename == "<daytona-kernel-framing>"
