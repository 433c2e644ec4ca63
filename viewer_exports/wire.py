"""Protobuf wire encoding of many same-shaped messages at once, with numpy.

Perfetto traces of millions of events cannot afford one Python protobuf object
per event, but every event packet has the same shape. The trick is that
protobuf decoders accept varints padded with continuation bytes, so each field
can be given one width for a whole column of rows; a chunk of messages is then
a 2-D uint8 array built by stacking columns, a few numpy operations for a
million packets. The perfetto package's message classes parse the result back
in the tests, and Perfetto's trace processor reads it like any other trace.

Example:
    >>> rows = hstack([key(8, VARINT, 2), varint(np.array([1, 300]))])
    >>> [bytes(r) for r in rows]
    [b'\\x08\\x81\\x00', b'\\x08\\xac\\x02']
"""

from __future__ import annotations

import numpy as np

VARINT, FIXED64, LENGTH_DELIMITED = 0, 1, 2


def scalar_varint(value: int) -> bytes:
    """The shortest varint of a non-negative ``value``."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def constant(payload: bytes, rows: int) -> np.ndarray:
    """``payload`` on every row, as a (rows, len(payload)) array."""
    return np.broadcast_to(np.frombuffer(payload, dtype=np.uint8), (rows, len(payload)))


def key(field: int, wire_type: int, rows: int) -> np.ndarray:
    """The key of ``field`` on every row."""
    return constant(scalar_varint((field << 3) | wire_type), rows)


def varint_width(values: np.ndarray) -> int:
    """Bytes a varint column needs so that its largest value fits (10 for negatives)."""
    if len(values) == 0:
        return 1
    if (np.asarray(values) < 0).any():
        return 10
    top = int(np.max(values))
    return max(1, -(-top.bit_length() // 7))


def varint(values: np.ndarray, width: int | None = None) -> np.ndarray:
    """Varints padded to one width: a (rows, width) array. Negative int64 take ten bytes."""
    values = np.asarray(values)
    width = varint_width(values) if width is None else width
    unsigned = values.astype(np.int64).view(np.uint64)
    shifts = (np.arange(width, dtype=np.uint64) * np.uint64(7))[None, :]
    groups = (unsigned[:, None] >> shifts) & np.uint64(0x7F)
    groups[:, :-1] |= np.uint64(0x80)
    return groups.astype(np.uint8)


def fixed64(values: np.ndarray) -> np.ndarray:
    """Little-endian 8-byte values (fixed64, or double for float64 input): a (rows, 8) array."""
    array = np.ascontiguousarray(values)
    return array.astype(array.dtype.newbyteorder("<")).view(np.uint8).reshape(len(array), 8)


def hstack(columns: list[np.ndarray]) -> np.ndarray:
    """Row i of the result is row i of every column, in order."""
    return np.concatenate(columns, axis=1) if columns else np.zeros((0, 0), dtype=np.uint8)


def length_delimited(field: int, body: np.ndarray) -> np.ndarray:
    """``body`` rows as a length-delimited field: key, length, bytes."""
    rows, width = body.shape
    return hstack([key(field, LENGTH_DELIMITED, rows), constant(scalar_varint(width), rows), body])
