"""Framing between the pool and the zygote, and between the zygote and its children.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. JSON rather than pickle
because the pool must never unpickle anything a sandboxed process could have written.
"""

from __future__ import annotations

import json
import os
import struct

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024


def encode(message: dict) -> bytes:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict:
    message = json.loads(body.decode("utf-8", "replace"))
    if not isinstance(message, dict):
        raise ValueError("frame is not a JSON object")
    return message


def write_frame(fd: int, message: dict) -> None:
    """Blocking write of one whole frame (os.write may write less than asked on a pipe)."""
    view = memoryview(encode(message))
    while view:
        written = os.write(fd, view)
        view = view[written:]


def read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> dict | None:
    """Blocking read of one frame; None at end of stream."""
    header = read_exactly(fd, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    body = read_exactly(fd, size)
    if body is None:
        return None
    return decode(body)


async def read_frame_async(stream) -> dict:
    """One frame from an asyncio StreamReader; raises asyncio.IncompleteReadError at end of stream."""
    (size,) = HEADER.unpack(await stream.readexactly(HEADER.size))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return decode(await stream.readexactly(size))


class FrameBuffer:
    """Incremental decoder for a non-blocking reader."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        self._buf += data
        frames = []
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            if size > MAX_FRAME:
                raise ValueError(f"frame of {size} bytes exceeds {MAX_FRAME}")
            if len(self._buf) < HEADER.size + size:
                break
            body = bytes(self._buf[HEADER.size:HEADER.size + size])
            del self._buf[:HEADER.size + size]
            frames.append(decode(body))
        return frames
