"""Test setup: kernelspecs installed into a throwaway prefix, data in a temp dir.

Every test that talks to a kernel starts a real one through jupyter_client,
from the kernelspec our own installer wrote.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

_ROOT = Path(tempfile.mkdtemp(prefix="daytona-kernel-tests-"))
os.environ["JUPYTER_DATA_DIR"] = str(_ROOT / "data")
os.environ["JUPYTER_PATH"] = str(_ROOT / "prefix" / "share" / "jupyter") + os.pathsep + os.environ.get("JUPYTER_PATH", "")
os.environ["JUPYTER_CONFIG_DIR"] = str(_ROOT / "config")
os.environ["JUPYTER_PLATFORM_DIRS"] = "1"
os.environ.pop("DAYTONA_API_KEY", None)

sys.path.insert(0, str(Path(__file__).parent))

from daytona_kernel import kernelspec  # noqa: E402

kernelspec.install(prefix=str(_ROOT / "prefix"))


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A notebook folder to start kernels in."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
