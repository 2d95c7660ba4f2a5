"""Apache Kafka's primitive wire types, sans-I/O: a Reader over one received payload
and a Writer that builds one, written from Kafka's protocol guide (kafka.apache.org,
"A Guide To The Kafka Protocol", Protocol Primitive Types).

    BOOLEAN INT8 INT16 INT32 INT64 UINT16 UINT32    fixed size, big-endian
    UNSIGNED_VARINT                                  7 bits a byte (compact lengths, tags)
    STRING                 INT16 length, UTF-8       NULLABLE_STRING: length -1 = null
    COMPACT_STRING         UNSIGNED_VARINT length+1  COMPACT_NULLABLE_STRING: 0 = null
    BYTES / RECORDS        INT32 length              NULLABLE_BYTES: -1 = null
    COMPACT_BYTES          UNSIGNED_VARINT length+1  COMPACT_NULLABLE_BYTES: 0 = null
    ARRAY                  INT32 count (-1 = null)   COMPACT_ARRAY: UNSIGNED_VARINT count+1
    TAGGED_FIELDS          UNSIGNED_VARINT count, then per field: tag, size, bytes

A peer's lengths are never trusted: every read checks that the bytes are there, and a
count is checked against the bytes left before anything is allocated for it, so a
lying length costs nothing. Any violation is a DecodeError (the connection closes).
"""

from __future__ import annotations

import struct

from protocol.errors import DecodeError

I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
F64 = struct.Struct(">d")  # FLOAT64: quota values (IEEE 754 double)

# An unsigned varint of a length or a count holds at most 32 bits: 5 bytes.
_MAX_UVARINT_BYTES = 5


def read_uvarint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    """(value, offset after it) of the UNSIGNED_VARINT of at most 32 bits at `at`."""
    result = shift = 0
    for i in range(_MAX_UVARINT_BYTES):
        if at + i >= len(data):
            raise DecodeError(f"truncated UNSIGNED_VARINT at offset {at}")
        byte = data[at + i]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result > 0xFFFFFFFF:
                raise DecodeError("UNSIGNED_VARINT above 32 bits")
            return result, at + i + 1
        shift += 7
    raise DecodeError(f"UNSIGNED_VARINT longer than {_MAX_UVARINT_BYTES} bytes")


def write_uvarint(buf: bytearray, value: int) -> None:
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"UNSIGNED_VARINT out of range: {value}")
    while value >= 0x80:
        buf.append((value & 0x7F) | 0x80)
        value >>= 7
    buf.append(value)


class Reader:
    """Reads Kafka primitives from one payload, front to back."""

    __slots__ = ("_data", "pos")

    def __init__(self, data: bytes | bytearray | memoryview, pos: int = 0) -> None:
        self._data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.pos = pos

    @property
    def remaining(self) -> int:
        return len(self._data) - self.pos

    def _need(self, n: int, what: str) -> int:
        at = self.pos
        if n < 0 or at + n > len(self._data):
            raise DecodeError(
                f"truncated {what}: {n} bytes needed at offset {at}, {len(self._data) - at} left"
            )
        self.pos = at + n
        return at

    def fixed(self, s: struct.Struct, what: str) -> int:
        """A fixed-size integer (INT8 .. INT64, UINT16, UINT32) packed as `s`."""
        at = self._need(s.size, what)
        value: int = s.unpack_from(self._data, at)[0]
        return value

    def fixed_run(self, s: struct.Struct, what: str) -> tuple[int, ...]:
        """Several fixed-size fields in a row, packed together as `s` (one bounds check
        and one unpack for the run)."""
        at = self._need(s.size, what)
        return s.unpack_from(self._data, at)

    def int32(self) -> int:
        return self.fixed(I32, "INT32")

    def boolean(self) -> bool:
        value = self.fixed(I8, "BOOLEAN")
        if value not in (0, 1):
            raise DecodeError(f"BOOLEAN must be 0 or 1, got {value}")
        return value == 1

    def uvarint(self) -> int:
        """An UNSIGNED_VARINT of at most 32 bits."""
        data, at = self._data, self.pos
        if at < len(data) and data[at] < 0x80:  # one byte: nearly every length and count
            self.pos = at + 1
            return data[at]
        value, self.pos = read_uvarint(data, at)
        return value

    def raw(self, n: int, what: str) -> memoryview:
        """`n` bytes as a view of the payload (no copy)."""
        at = self._need(n, what)
        return memoryview(self._data)[at : at + n]

    def _text(self, n: int, what: str) -> str:
        at = self._need(n, what)
        try:
            return str(self._data[at : at + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"{what} is not UTF-8: {exc}") from None

    def length(self, *, compact: bool, packing: struct.Struct, what: str) -> int:
        """A length or count (-1: null): UNSIGNED_VARINT n+1 when compact, else `packing`."""
        return self.uvarint() - 1 if compact else self.fixed(packing, what)

    def _sized(self, what: str, *, compact: bool, nullable: bool, packing: struct.Struct) -> int:
        """The length of a STRING or BYTES; -1 for a null where one may be."""
        n = self.length(compact=compact, packing=packing, what=f"{what} length")
        if n < -1 or (n == -1 and not nullable):
            why = " (null where a value is required)" if n == -1 else ""
            raise DecodeError(f"{what} length {n}{why}")
        return n

    def string(self, *, compact: bool, nullable: bool) -> str | None:
        n = self._sized("STRING", compact=compact, nullable=nullable, packing=I16)
        return None if n == -1 else self._text(n, "STRING")

    def bytes_(self, *, compact: bool, nullable: bool) -> memoryview | None:
        n = self._sized("BYTES", compact=compact, nullable=nullable, packing=I32)
        return None if n == -1 else self.raw(n, "BYTES")

    def array_length(self, *, compact: bool, min_item_size: int) -> int:
        """An array's count (-1: null), checked against the bytes left: each item
        takes at least `min_item_size` bytes, so a lying count is refused at once."""
        n = self.length(compact=compact, packing=I32, what="ARRAY count")
        if n < -1:
            raise DecodeError(f"ARRAY count {n}")
        if n > 0 and n * max(min_item_size, 1) > self.remaining:
            raise DecodeError(
                f"ARRAY count {n} cannot fit in the {self.remaining} bytes left "
                "(truncated, or the count lies)"
            )
        return n


class Writer:
    """Builds one payload of Kafka primitives. Big record sets are not copied: they
    become separate parts (`parts()`), for `transport.writelines`."""

    __slots__ = ("_buf", "_parts", "_size")

    # Record sets smaller than this are copied in: a separate part costs more.
    SCATTER_MIN_BYTES = 16 * 1024

    def __init__(self) -> None:
        self._buf = bytearray()
        self._parts: list[bytes | bytearray | memoryview] = []
        self._size = 0

    def fixed(self, s: struct.Struct, value: int) -> None:
        self._buf += s.pack(value)

    def int16(self, value: int) -> None:
        self._buf += I16.pack(value)

    def int32(self, value: int) -> None:
        self._buf += I32.pack(value)

    def boolean(self, value: bool) -> None:
        self._buf.append(1 if value else 0)

    def uvarint(self, value: int) -> None:
        write_uvarint(self._buf, value)

    def length(self, n: int | None, *, compact: bool, packing: struct.Struct) -> None:
        """A length or count: UNSIGNED_VARINT n+1 (0: null) when compact, else `packing`
        (INT16 or INT32; -1: null)."""
        if compact:
            self.uvarint(0 if n is None else n + 1)
        else:
            self._buf += packing.pack(-1 if n is None else n)

    def string(self, value: str | None, *, compact: bool, nullable: bool) -> None:
        if value is None and not nullable:
            raise ValueError("null STRING where a value is required")
        data = None if value is None else value.encode()
        self.length(None if data is None else len(data), compact=compact, packing=I16)
        if data is not None:
            self._buf += data

    def bytes_(
        self, value: bytes | bytearray | memoryview | None, *, compact: bool, nullable: bool
    ) -> None:
        if value is None and not nullable:
            raise ValueError("null BYTES where a value is required")
        n = None if value is None else len(value)
        self.length(n, compact=compact, packing=I32)
        if value is None or n is None:
            return
        if n >= self.SCATTER_MIN_BYTES:
            self._parts.append(self._buf)
            self._parts.append(value)
            self._size += len(self._buf) + n
            self._buf = bytearray()
        else:
            self._buf += value

    def array_length(self, n: int | None, *, compact: bool) -> None:
        self.length(n, compact=compact, packing=I32)

    def raw(self, data: bytes | bytearray) -> None:
        self._buf += data

    @property
    def size(self) -> int:
        return self._size + len(self._buf)

    def parts(self) -> list[bytes | bytearray | memoryview]:
        """What was written, in order: the big record sets as they were passed."""
        return [*self._parts, self._buf]

    def getvalue(self) -> bytes:
        return b"".join(self.parts())
