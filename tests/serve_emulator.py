"""Try the Daytona backend without an account: serve the test suite's Daytona emulator.

    python tests/serve_emulator.py

It prints the three variables to export where Jupyter starts; then the "Python (Daytona)" kernel
talks to this emulator through the unmodified Daytona SDK, exactly as it talks to Daytona. It is an
imitation: cells run on this machine, as you, in worker processes; nothing is isolated. Ctrl-C
stops it and ends every sandbox it made.
"""

from __future__ import annotations

import shlex
import signal
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daytona_emulator import DaytonaEmulator


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="daytona-emulator-"))
    emulator = DaytonaEmulator(root).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in emulator.env().items())
    print(
        "An IMITATION of Daytona's API is listening on this machine. Cells it runs are NOT isolated:\n"
        "they run as you, here. Use it to see how the Daytona backend behaves (sandboxes, volumes,\n"
        f"idle, restarts, %daytona status), not to run untrusted code. Sandboxes live in {root}.\n\n"
        "In the terminal where you start Jupyter:\n"
        f"  export {exports}\n"
        '  jupyter lab        # pick "Python (Daytona)"\n\n'
        "Ctrl-C stops the emulator.",
        flush=True,
    )
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a user ends it
    finally:
        emulator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
