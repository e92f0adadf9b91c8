"""The per-chunk relay loop (placeholder until the client moves onto httptools)."""

from __future__ import annotations


def frame(data: bytes) -> bytes:
    """``data`` as one chunk of the chunked transfer coding."""
    return b"%x\r\n%b\r\n" % (len(data), data)
