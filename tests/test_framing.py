"""The frame format, without a kernel: both sides use this one module."""

from __future__ import annotations

import json
import re

import pytest

from daytona_kernel.runtime.framing import (
    BLOB_PIECE_CHARS,
    MARK,
    PIECE_CHARS,
    BadFrame,
    Blobs,
    Frame,
    FrameDecoder,
    Text,
    blob_pieces,
    encode_frame,
    join_blobs,
    split_blobs,
)

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


def test_escape_heavy_pieces_stay_under_the_daemon_line_cap_once_the_worker_escapes_them_again() -> None:
    """The worker JSON-encodes each frame line again: a quote or backslash (2 characters in the frame) becomes
    4, so a piece can double; PIECE_CHARS must stay under half the daemon's 1 MiB line (512 KiB would not)."""
    for text in ('"' * 1_000_000, "\\" * 1_000_000, "\x01" * 1_000_000, "é" * 1_000_000, '\\"\x1e' * 300_000):
        lines = encode_frame(TOKEN, "display", {"data": {"text/plain": text}})
        assert len(lines) > 1
        for line in lines:
            assert len(json.dumps({"type": "stdout", "text": line}).encode()) < 1024 * 1024
        assert feed_all(lines) == [Frame("display", {"data": {"text/plain": text}})]


def test_large_strings_travel_in_a_file_and_are_put_back_in_their_places() -> None:
    big, other, odd = "A" * 5000, "é✓" * 3000, "\ud800" * 6000
    payload = {"data": {"image/png": big, "text/plain": "small"}, "list": [1, other], "odd": odd}
    thin, found = split_blobs(payload, 4096)
    assert payload["data"]["image/png"] == big  # the caller's payload is left alone
    assert thin == {"data": {"image/png": "", "text/plain": "small"}, "list": [1, ""], "odd": odd}  # a lone surrogate stays
    sizes = [[keys, len(data)] for keys, data in found]
    lines = encode_frame(TOKEN, "display", thin, blobs={"path": "/tmp/out-0", "sizes": sizes})
    assert len("".join(lines)) < 40_000  # what the frame line still carries: the odd string, escaped
    (event,) = feed_all(lines)
    assert isinstance(event, Frame) and event.blobs == Blobs("/tmp/out-0", [(["data", "image/png"], 5000), (["list", 1], 15000)])
    assert join_blobs(event.payload, event.blobs, b"".join(piece for _, data in found for piece in blob_pieces(data))) == payload
    assert split_blobs({"text/plain": "short"}, 4096) == ({"text/plain": "short"}, [])


def test_a_large_ascii_string_is_written_a_piece_at_a_time_and_comes_back_whole() -> None:
    text = "".join(chr(33 + i % 90) for i in range(3 * BLOB_PIECE_CHARS + 7))
    _, [(keys, blob)] = split_blobs({"data": {"image/png": text}}, 4096)
    pieces = list(blob_pieces(blob))
    assert keys == ["data", "image/png"] and len(blob) == len(text)
    assert [len(piece) for piece in pieces] == [BLOB_PIECE_CHARS] * 3 + [7]
    assert b"".join(pieces) == text.encode()


def test_a_file_of_large_strings_that_does_not_fit_its_frame_is_refused() -> None:
    def check(payload: object, sizes: list[tuple[list[str | int], int]], data: bytes, why: str) -> None:
        with pytest.raises(ValueError, match=re.escape(why)):
            join_blobs(payload, Blobs("/p", sizes), data)

    check({"a": ""}, [(["a"], 3)], b"abcd", "the file holds 4 bytes, the frame announced 3")
    check({"a": "x"}, [(["a"], 3)], b"abc", "not empty")
    check({"a": ""}, [(["b"], 3)], b"abc", "not in the frame")
    check({"a": [""]}, [(["a", 1], 3)], b"abc", "not in the frame")
    check({"a": ""}, [(["a"], 2)], b"\xff\xfe", "utf-8")
    for blobs in (
        '"x"',
        '{"path": "", "sizes": []}',
        '{"path": "/p", "sizes": [[["a"], -1]]}',
        '{"path": "/p", "sizes": [[[], 1]]}',
        '{"path": "/p", "sizes": [[["a", true], 1]]}',
        '{"path": "/p", "sizes": [[["a"], 99999999999]]}',
    ):
        line = f'{MARK}{TOKEN} . ["display",{{"a":""}},{blobs}]\n'
        assert feed_all([line]) == [BadFrame("a frame's file of large strings is not described right")], blobs


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
