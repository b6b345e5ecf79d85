"""A damaged .zst keeps every line decoded before the damage, however the file was cut into frames.

Found in review: `_ZstdFrames` fed the decompressor steps of up to 256 KB of input (sized from the ratio
seen so far: 256 KB after a first 1 KB that completed no block), and a decompress call that fails
returns nothing of what it decoded. So a 250 KB `.jsonl.zst` (datakit synth's own) with one damaged byte
anywhere, even at 98 % of the file, was one `unreadable_file` row ("not this format at all"), all its
389 lines lost, exit 0. The input is now fed a zstd block at a time.
"""
from __future__ import annotations

import io
import json
import os
import random

import pytest
import zstandard

from datakit.io.readers import _ZstdFrames, iter_raw_lines


def _decode(data: bytes) -> bytes:
    f = _ZstdFrames(io.BytesIO(data))
    out, buf = bytearray(), bytearray(1 << 16)
    while n := f.readinto(buf):
        out += buf[:n]
    return bytes(out)


def _lines(n: int) -> bytes:
    rnd = random.Random(5)
    return b"".join(json.dumps({"event_id": f"e{i}", "text": " ".join(rnd.choice(["def", "return", "x", "self", "0"])
                                                                     for _ in range(60))}).encode() + b"\n"
                    for i in range(n))


def _block_headers(frame: bytes) -> list[int]:
    """Offsets of the block headers of one zstd frame (format: RFC 8878)."""
    fhd = frame[4]
    single = fhd >> 5 & 1
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + (single, 2, 4, 8)[fhd >> 6]
    found = []
    while True:
        h = int.from_bytes(frame[at:at + 3], "little")
        found.append(at)
        at += 3 + (1 if (h >> 1 & 3) == 1 else h >> 3)
        if h & 1:
            return found


@pytest.mark.parametrize("checksum", [False, True])
def test_the_lines_before_a_damaged_block_are_kept(tmp_path, checksum):
    text = _lines(6000)
    frame = zstandard.ZstdCompressor(level=3, write_checksum=checksum).compress(text)
    blocks = _block_headers(frame)
    assert len(blocks) >= 8
    damaged = bytearray(frame)
    at = blocks[len(blocks) * 3 // 4]
    damaged[at] |= 0b110  # block type 3: reserved, which every decoder refuses
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(bytes(damaged))
    rows = [r for b in iter_raw_lines(str(path)) for r in b.to_pylist()]
    assert rows[-1]["_read_error"] == "truncated_file: ZstdError"
    kept = [r["_raw"] for r in rows[:-1]]
    assert len(kept) > 6000 // 2  # three quarters of the blocks decode: before, 0 lines and `unreadable_file`
    assert kept == text.split(b"\n")[:len(kept)]


def test_every_split_of_frames_decodes_to_the_same_bytes():
    """The block cutting only decides how much is fed per call: multi-frame files, streamed frames
    (no content size, many small blocks), checksums, skippable frames and levels decode exactly."""
    rnd = random.Random(11)
    for _ in range(40):
        frames, want = [], b""
        for _ in range(rnd.randint(1, 3)):
            n = rnd.choice([0, 1, 100, 70_000, 400_000])
            text = _lines(n // 300 + 1)[:n] if rnd.random() < 0.7 else os.urandom(n)
            c = zstandard.ZstdCompressor(level=rnd.choice([1, 3, 19, -5]), write_checksum=rnd.random() < 0.5,
                                         write_content_size=rnd.random() < 0.5)
            if rnd.random() < 0.4:
                out = io.BytesIO()
                w = c.stream_writer(out, closefd=False)
                for i in range(0, len(text), 5000):
                    w.write(text[i:i + 5000])
                    w.flush(zstandard.FLUSH_BLOCK)
                w.close()
                frames.append(out.getvalue())
            else:
                frames.append(c.compress(text))
            want += text
            if rnd.random() < 0.3:
                payload = os.urandom(rnd.randint(0, 300_000))
                frames.append((0x184D2A50 + rnd.randint(0, 15)).to_bytes(4, "little")
                              + len(payload).to_bytes(4, "little") + payload)
        assert _decode(b"".join(frames)) == want


def test_no_decompress_call_makes_more_than_a_block():
    bomb = zstandard.ZstdCompressor(level=3).compress(b"a" * (64 << 20))
    f = _ZstdFrames(io.BytesIO(bomb))
    largest, buf, total = 0, bytearray(1 << 20), 0
    while n := f.readinto(buf):
        total += n
        largest = max(largest, len(f._buf))
    assert total == 64 << 20 and largest <= 128 << 10
