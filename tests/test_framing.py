"""The frame format, without a kernel: both sides use this one module."""

from __future__ import annotations

import json

from daytona_kernel.runtime.framing import MARK, PIECE_CHARS, BadFrame, Frame, FrameDecoder, Text, encode_frame

TOKEN = "0123456789abcdef"


def feed_all(chunks: list[str], token: str = TOKEN) -> list[Text | Frame | BadFrame]:
    dec = FrameDecoder(token)
    events: list[Text | Frame | BadFrame] = []
    for chunk in chunks:
        events += dec.feed(chunk)
    events += dec.flush()
    merged: list[Text | Frame | BadFrame] = []
    for ev in events:
        if merged and isinstance(ev, Text) and isinstance(merged[-1], Text):
            merged[-1] = Text(merged[-1].text + ev.text)
        else:
            merged.append(ev)
    return merged


def test_text_and_frame_interleave_in_order() -> None:
    stream = "before\n" + "".join(encode_frame(TOKEN, "display", {"data": {"text/plain": "x"}})) + "after"
    assert feed_all([stream]) == [Text("before\n"), Frame("display", {"data": {"text/plain": "x"}}), Text("after")]


def test_frame_after_text_without_newline() -> None:
    stream = "no newline" + "".join(encode_frame(TOKEN, "clear", {"wait": True}))
    assert feed_all([stream]) == [Text("no newline"), Frame("clear", {"wait": True})]


def test_every_split_point_gives_the_same_events() -> None:
    stream = "a\x1eb\n" + "".join(encode_frame(TOKEN, "result", {"n": "é✓"})) + "tail\n"
    expected = feed_all([stream])
    assert Frame("result", {"n": "é✓"}) in expected
    for cut in range(len(stream)):
        assert feed_all([stream[:cut], stream[cut:]]) == expected, cut


def test_large_payload_is_split_into_ascii_pieces_under_the_limit() -> None:
    payload = {"image/png": "A" * (3 * PIECE_CHARS + 17), "text": "ü" * 1000}
    lines = encode_frame(TOKEN, "display", payload)
    assert len(lines) > 3
    for line in lines:
        assert line.isascii() and line.endswith("\n") and line.count("\n") == 1
        # the daemon's 1 MiB limit counts the JSON-encoded line
        assert len(json.dumps({"type": "stdout", "text": line})) < 1024 * 1024
    assert feed_all(["".join(lines)]) == [Frame("display", payload)]
    assert feed_all(lines) == [Frame("display", payload)]


def test_spoofed_frame_with_wrong_token_is_plain_text() -> None:
    spoof = "".join(encode_frame("f" * 16, "error", {"ename": "Fake"}))
    assert feed_all([spoof]) == [Text(spoof)]


def test_corrupt_json_with_our_token_is_a_bad_frame_and_never_shows_the_token() -> None:
    line = MARK + TOKEN + " . {not json\n"
    events = feed_all([line])
    assert len(events) == 1 and isinstance(events[0], BadFrame)
    assert TOKEN not in repr(events)


def test_dangling_marker_prefix_is_released_at_flush() -> None:
    dec = FrameDecoder(TOKEN)
    assert dec.feed("x" + MARK[:3]) == [Text("x")]
    assert dec.flush() == [Text(MARK[:3])]


def test_record_separator_in_user_text_is_kept() -> None:
    assert feed_all(["a\x1ez\x1e\n"]) == [Text("a\x1ez\x1e\n")]
