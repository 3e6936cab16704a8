"""Frames sent in a burst leave the runtime in few writes (a widget's creation is about twenty comm messages:
one pipe write and one daemon line each cost the cell's loop its time, and wake the kernel each time),
and every frame and line of text still arrives in the order it was sent."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from daytona_kernel.runtime.framing import Frame, FrameDecoder, Text

SCRIPT = textwrap.dedent(
    """
    import io, json, sys, time
    from daytona_kernel.runtime.runtime import Runtime
    from daytona_kernel.runtime.framing import Kind

    class Target(io.TextIOBase):  # the daemon's worker's stdout: one write, one line to the kernel
        def __init__(self):
            self.writes = []
        def writable(self):
            return True
        def write(self, s):
            self.writes.append(s)
            return len(s)

    target = Target()
    sys.stdout = target
    rt = Runtime("tok", {"ipython": False})
    with rt.request_output():
        rt.send(Kind.DISPLAY, {"data": {"text/plain": "first"}})
        for i in range(20):
            rt.send(Kind.COMM_MSG, {"content": {"comm_id": "w", "data": {"n": i}}, "metadata": {}, "buffers": []})
        print("text after the burst")
        rt.send(Kind.COMM_MSG, {"content": {"comm_id": "w", "data": {"n": 20}}, "metadata": {}, "buffers": []})
        time.sleep(0.1)  # the flusher sends what waits
        rt.send(Kind.COMM_MSG, {"content": {"comm_id": "w", "data": {"n": 21}}, "metadata": {}, "buffers": []})
        rt.send(Kind.DISPLAY, {"data": {"text/plain": "last"}})
    with open(sys.argv[1], "w") as f:  # fds 1 and 2 are the runtime's capture pipes now
        json.dump(target.writes, f)
    """
)


def test_a_burst_of_comm_frames_goes_out_in_few_writes_in_order(tmp_path: Path) -> None:
    out = tmp_path / "writes.json"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    writes = json.loads(out.read_text())
    events = FrameDecoder("tok").feed("".join(writes))
    seen = []
    for event in events:
        if isinstance(event, Frame):
            payload = event.payload
            seen.append(payload["data"]["text/plain"] if event.kind == "display" else payload["content"]["data"]["n"])
        elif isinstance(event, Text) and event.text.strip():
            seen.append(event.text.strip())
    assert seen == ["first", *range(20), "text after the burst", 20, 21, "last"]
    framed = [w for w in writes if "comm_msg" in w]
    assert len(framed) <= 6, f"{len(framed)} writes for 22 comm frames"
