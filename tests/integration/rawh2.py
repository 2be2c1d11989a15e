"""The few HTTP/2 frames the raw-socket gRPC tests write by hand (RFC 9113): no h2 library is needed to
open a connection, ping, or open and reset streams."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x1, 0x3, 0x4, 0x6, 0x7
ACK = 0x1  # SETTINGS and PING
END_HEADERS = 0x4
# Error codes
REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM = 0x7, 0x8, 0xB


def encode(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def header_block(path: str) -> bytes:
    """The HPACK block of a gRPC request (POST ``path``), every field a literal that the decoder does not
    index, so that each HEADERS frame on a connection can carry the same bytes."""

    def literal(index: int, value: str) -> bytes:  # the name from the static table (index < 15)
        return bytes([index, len(value)]) + value.encode()

    content_type = bytes([0x0F, 31 - 15, 16]) + b"application/grpc"  # static index 31, 4-bit prefix
    te = b"\x00\x02te\x08trailers"  # a new name
    # :method POST (static 3) and :scheme http (static 6) are indexed fields.
    return b"\x83\x86" + literal(4, path) + literal(1, "localhost") + content_type + te


def reset_pair(stream: int, block: bytes) -> bytes:
    """HEADERS opening ``stream``, then RST_STREAM CANCEL for it: one round of a rapid reset."""
    return encode(HEADERS, END_HEADERS, stream, block) + encode(
        RST_STREAM, 0, stream, struct.pack(">I", CANCEL)
    )
