"""Gateway transport compression (Topics › Gateway › Transport Compression): `zlib-stream`,
one zlib context per connection, each message ending in the Z_SYNC_FLUSH suffix; and
`zstd-stream`, one zstd context per connection, each websocket message a complete gateway
message that flushes a block without ending the frame."""

from __future__ import annotations

import zlib
from typing import Protocol

import zstandard

ZLIB_STREAM = "zlib-stream"
ZSTD_STREAM = "zstd-stream"


class Compressor(Protocol):
    name: str

    def compress(self, text: str) -> bytes: ...


class ZlibStream:
    name = ZLIB_STREAM

    def __init__(self) -> None:
        self._context = zlib.compressobj()

    def compress(self, text: str) -> bytes:
        return self._context.compress(text.encode()) + self._context.flush(zlib.Z_SYNC_FLUSH)


class ZstdStream:
    name = ZSTD_STREAM

    def __init__(self) -> None:
        self._context = zstandard.ZstdCompressor().compressobj()

    def compress(self, text: str) -> bytes:
        return self._context.compress(text.encode()) + self._context.flush(
            zstandard.COMPRESSOBJ_FLUSH_BLOCK)


def compressor_for(query: str | None) -> Compressor | None:
    """The compressor the `compress` query parameter asks for (None: plain text frames)."""
    if query == ZLIB_STREAM:
        return ZlibStream()
    if query == ZSTD_STREAM:
        return ZstdStream()
    return None
