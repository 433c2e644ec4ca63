"""Protobuf wire encoding of many same-shaped messages at once, with numpy.

Perfetto traces of millions of events cannot afford one Python protobuf object
per event, but every event packet has the same shape. The trick is that
protobuf decoders accept varints padded with continuation bytes, so each field
can be given one width for a whole column of rows; a group of messages is then
a 2-D uint8 array, one message per row, built by a few numpy operations per
column. The perfetto package's message classes parse the result back in the
tests, and Perfetto's trace processor reads it like any other trace.

:class:`Layout` knows the offset of every field in a row, keeps the constant
bytes (keys, lengths, constant values) in a reusable buffer, and writes each
variable field as one 8-byte store per row.

Example:
    >>> layout = Layout().key(1, VARINT).varint("time", 2)
    >>> [bytes(r) for r in layout.encode({"time": np.array([1, 300])})]
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


def varint_width(values: np.ndarray) -> int:
    """Bytes a varint column needs so that its largest value fits (10 for negatives)."""
    values = np.asarray(values)
    if len(values) == 0:
        return 1
    if values.dtype.kind not in "iu":
        values = values.astype(np.int64)
    # One pass: the OR of all values has the largest value's bit length, and is negative iff any is.
    top = int(np.bitwise_or.reduce(values))
    if top < 0:
        return 10
    return max(1, -(-top.bit_length() // 7))


class Layout:
    """The byte layout shared by a group of messages: constants, and columns at fixed offsets.

    Built field by field, outermost message last (``message`` wraps an inner layout with
    its key and length, which are constants because every width is fixed). Then
    :meth:`encode` turns columns of values into one message per row.

    How :meth:`encode` writes a row: the constant bytes stay in a reusable buffer, and each
    varint is written as one unaligned 8-byte little-endian store per row (two for 9 or 10
    bytes), a fixed64 as one store of its value. The stored word holds the varint's 7-bit
    groups, spread one per byte by up to three mask-and-add steps that run on all columns at
    once, ORed with the template's bytes under the word: continuation bits, and the constants
    that follow the varint. Stores go
    in offset order, so whatever a word covers beyond its varint is either a constant it
    restores or a field stored after it; a word running past the end of a row restores the
    next row's leading constants. A varint whose word would reach a variable byte of the next
    row is written byte by byte instead. Compared with one numpy operation per varint byte,
    this takes a few times fewer, on contiguous uint64 arrays.

    Example:
        >>> inner = Layout().key(1, VARINT).constant(b"\\x07").key(4, VARINT).varint("value", 3)
        >>> rows = Layout().message(4, inner).encode({"value": np.array([5, 70000])})
        >>> rows.shape
        (2, 8)
    """

    def __init__(self):
        self.template = bytearray()
        #: (offset, width, column) of every varint and (offset, column) of every fixed64.
        self.varints: list[tuple[int, int, str]] = []
        self.fixed64s: list[tuple[int, str]] = []
        self._plan: _Plan | None = None
        self._buffer: np.ndarray | None = None

    @property
    def width(self) -> int:
        """Bytes per message."""
        return len(self.template)

    def constant(self, payload: bytes) -> Layout:
        """The same bytes in every message."""
        self.template += payload
        return self

    def key(self, field: int, wire_type: int) -> Layout:
        """The key of ``field``."""
        return self.constant(scalar_varint((field << 3) | wire_type))

    def varint(self, column: str, width: int) -> Layout:
        """Values of ``column`` as varints of ``width`` bytes (``varint_width`` of the column or more)."""
        self.varints.append((self.width, width, column))
        self.template += bytes(width)
        return self

    def fixed64(self, column: str) -> Layout:
        """Values of ``column`` as 8 little-endian bytes (a double for float columns)."""
        self.fixed64s.append((self.width, column))
        self.template += bytes(8)
        return self

    def message(self, field: int, body: Layout) -> Layout:
        """``body`` as a length-delimited field."""
        self.key(field, LENGTH_DELIMITED).constant(scalar_varint(body.width))
        offset = self.width
        self.varints += [(offset + at, width, column) for at, width, column in body.varints]
        self.fixed64s += [(offset + at, column) for at, column in body.fixed64s]
        self.template += body.template
        return self

    def encode(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """A (rows, width) uint8 array, one message per row; valid until the next ``encode``.

        ``columns`` holds an equally long integer array (float for doubles) per column name;
        varint columns must be non-negative or take 10 bytes. The rows live in a buffer that
        keeps the constant bytes between calls; memory stays at the largest call's rows.
        """
        if self._plan is None:
            self._plan = _Plan(self)
        plan, width = self._plan, self.width
        rows = len(next(iter(columns.values())))
        if rows == 0:
            return np.zeros((0, width), dtype=np.uint8)
        if self._buffer is None or len(self._buffer) < rows * width + 8:
            # 8 spare bytes: the last row's words may run past its end, as into a next row.
            self._buffer = np.zeros(rows * width + 8, dtype=np.uint8)
            self._buffer[: rows * width] = np.tile(plan.row, rows)
        words = np.empty((len(plan.parts), rows), dtype=np.uint64)
        for word, (column, part) in zip(words, plan.parts):
            word[...] = columns[column]
            if part == _LOW:
                word &= np.uint64((1 << 56) - 1)
            elif part == _HIGH:
                word >>= np.uint64(56)
        plan.spread(words)
        words |= plan.constants[:, None]
        for offset, source in plan.stores:
            target = np.ndarray((rows,), dtype="<u8", buffer=self._buffer, offset=offset, strides=(width,))
            if isinstance(source, int):
                target[...] = words[source]
            else:
                values = np.asarray(columns[source])
                if values.dtype.kind == "f":
                    values = values.astype("<f8", copy=False).view("<u8")
                target[...] = values
        out = self._buffer[: rows * width].reshape(rows, width)
        for offset, size, column in plan.bytewise:
            _put_varint(out, offset, size, columns[column])
        return out


_WHOLE, _LOW, _HIGH = 0, 1, 2  # a varint of up to 8 bytes; the first 8 / the rest of a longer one
#: The three spreading steps, widest first: the mask of the bits that move up, and by how far
#: as a factor less one. Moving bits ``b = word & mask`` up by ``s`` is ``word += b * (2**s - 1)``:
#: the moved bits land on zeros, so the addition carries nothing (the last step's factor is 1).
_SPREAD_STEPS = (
    (np.uint64(0x00FFFFFFF0000000), np.uint64(15)),  # bits 28-55 up by 4: 28-bit halves
    (np.uint64(0x0FFFC0000FFFC000), np.uint64(3)),  # up by 2: 14-bit quarters
    (np.uint64(0x3F803F803F803F80), None),  # up by 1: 7-bit groups, one per byte
)


class _Plan:
    """How :meth:`Layout.encode` writes one layout: which words, in which order, over what."""

    def __init__(self, layout: Layout):
        width = layout.width
        row = np.frombuffer(bytes(layout.template), dtype=np.uint8).copy()
        variable = np.zeros(width, dtype=bool)
        for offset, size, _ in layout.varints:
            row[offset : offset + size - 1] = 0x80  # continuation bits are constants too
            variable[offset : offset + size] = True
        for offset, _ in layout.fixed64s:
            variable[offset : offset + 8] = True
        self.row = row
        cyclic = np.concatenate([row, row[:8]])  # a word past the row's end covers the next row
        parts, stores, self.bytewise = [], [], []
        for offset, size, column in layout.varints:
            pieces = (
                [(offset, size, _WHOLE)] if size <= 8 else [(offset, 8, _LOW), (offset + 8, size - 8, _HIGH)]
            )
            if width < 8 or any(variable[: max(0, at + 8 - width)].any() for at, _, _ in pieces):
                self.bytewise.append((offset, size, column))
                continue
            for at, length, part in pieces:
                steps = 0 if length <= 1 else 1 if length == 2 else 2 if length <= 4 else 3
                parts.append((steps, at, column, part))
        # Words are spread in place, most steps first, so each step is one operation on a prefix.
        parts.sort(key=lambda p: -p[0])
        self.parts = [(column, part) for _, _, column, part in parts]
        self.steps_prefix = [sum(1 for p in parts if p[0] >= 3 - i) for i in range(3)]
        self.constants = np.array(
            [int.from_bytes(cyclic[at : at + 8].tobytes(), "little") for _, at, _, _ in parts],
            dtype=np.uint64,
        )
        stores = [(at, index) for index, (_, at, _, _) in enumerate(parts)]
        stores += [(offset, column) for offset, column in layout.fixed64s]
        self.stores = sorted(stores, key=lambda store: store[0])

    def spread(self, words: np.ndarray) -> None:
        """Spread each word's low 56 bits into 7-bit groups, one per byte, in place."""
        moving = np.empty_like(words[: max(self.steps_prefix, default=0)])
        for (mask, factor), count in zip(_SPREAD_STEPS, self.steps_prefix):
            if count:
                part, bits = words[:count], moving[:count]
                np.bitwise_and(part, mask, out=bits)
                if factor is not None:
                    bits *= factor
                part += bits


def _put_varint(out: np.ndarray, offset: int, width: int, values: np.ndarray) -> None:
    """Write ``values`` as ``width``-byte varints into columns ``offset...`` of ``out``.

    Byte k of a varint is bits 7k..7k+6 of the value, with 0x80 set on all but the last
    byte. The assignment into uint8 keeps only the low 8 bits of ``value >> 7k``, so the
    bits above need no masking; the top bit is either set by ``| 0x80`` or, on the last
    byte, zero because the value fits the width.
    """
    values = np.asarray(values)
    if width == 10:
        # Negative int64 are 10-byte varints of their two's complement: shift as unsigned.
        values = values.astype(np.int64).view(np.uint64)
    elif values.dtype.itemsize < 2:
        values = values.astype(np.int16)  # room for the 0x80 below
    shifted = values
    marked = None
    for k in range(width):
        if k == 1:
            shifted = values >> 7
        elif k > 1:
            np.right_shift(shifted, 7, out=shifted)
        if k < width - 1:
            marked = np.bitwise_or(shifted, 0x80, out=marked)
            out[:, offset + k] = marked
        else:
            out[:, offset + k] = shifted
