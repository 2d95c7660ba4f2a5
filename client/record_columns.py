"""Decode record batches straight into columns (one Python list per field), for readers
that build columnar output (the Spark source's Arrow batches) and never need a record
object.

`decode_columns(buf, pos, columns, ...)` appends the records of the batch at `pos` to
`columns`: the per-record work is reading the varints and appending the fields, no
Record / ConsumerRecord tuple per record. The format checks are decode_batch's
(protocol.record_batch): CRC, record lengths, fields inside the batch, nothing left
over. The partition leader epoch is a per-batch fact and is stored once per batch,
with the number of rows it covers (`ColumnBuffer.epoch_runs`). Offsets are stored as
runs too: consecutive offsets are one `range` however many rows they cover
(`OffsetColumn`), so a bulk reader pays no Python int per record for them.
"""

from __future__ import annotations

from bisect import bisect_left
from bisect import bisect_right
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from itertools import accumulate
from itertools import chain
from itertools import repeat
from typing import NamedTuple
from typing import overload

from protocol.errors import CorruptRecordError
from protocol.record_batch import HEADER_SIZE
from protocol.record_batch import BatchHeader
from protocol.record_batch import decode_record_headers
from protocol.record_batch import decode_varint
from protocol.record_batch import decompress
from protocol.record_batch import parse_header
from protocol.record_batch import validate_batch
from protocol.records.alike_runs import RUN_PROBE
from protocol.records.alike_runs import RUN_RETRY_AFTER
from protocol.records.alike_runs import alike_run
from protocol.records.alike_runs import run_keys
from protocol.records.alike_runs import run_timestamps
from protocol.records.varints import UNZIGZAG

_ATTR_TIMESTAMP_TYPE = 0x08
# Fewer alike records than this are decoded one by one.
_MIN_RUN = 8
_NO_HEADERS: tuple[tuple[str, bytes | None], ...] = ()


class ValueRun(NamedTuple):
    """`count` values of `size` bytes in `data`, one per record of `stride` bytes from
    `start`, each `offset` bytes into its record (a run of records laid out alike):
    a column builder can cut them out in one vectorised step (Arrow: fixed-size
    binary of `stride`, then a binary slice)."""

    data: bytes
    start: int
    offset: int
    stride: int
    size: int
    count: int

    def cut(self, begin: int, stop: int) -> ValueRun:
        """Values [begin, stop) of this run."""
        return self._replace(start=self.start + begin * self.stride, count=stop - begin)

    def to_list(self) -> list[bytes]:
        first = self.start + self.offset
        end = first + self.count * self.stride
        return [self.data[at : at + self.size] for at in range(first, end, self.stride)]


# A piece of a value column: values one by one, or a run of alike records.
ValuePiece = list[bytes | None] | ValueRun
# A piece of the offset column: consecutive offsets, or offsets one by one (a gap
# among them: a compacted batch).
OffsetPiece = range | list[int]


def _piece_len(piece: ValuePiece | OffsetPiece) -> int:
    return piece.count if isinstance(piece, ValueRun) else len(piece)


def slice_pieces(pieces: list[ValuePiece], begin: int, stop: int) -> list[ValuePiece]:
    """Values [begin, stop) of a column made of `pieces`."""
    out: list[ValuePiece] = []
    at = 0
    for piece in pieces:
        n = _piece_len(piece)
        lo, hi = max(begin - at, 0), min(stop - at, n)
        if lo < hi:
            out.append(piece.cut(lo, hi) if isinstance(piece, ValueRun) else piece[lo:hi])
        at += n
        if at >= stop:
            break
    return out


class OffsetColumn(Sequence[int]):
    """The offset column, increasing: a Sequence[int] (len, indexing, slicing (to another
    OffsetColumn; with a step, a list), iteration, `==` against any sequence of ints)
    kept as `pieces`, each a `range` of consecutive offsets or a list of offsets with
    gaps between them. A fetch of consecutive offsets is one range, whatever its
    length: no Python int per row until a row is asked for (bulk readers read
    `pieces`)."""

    __slots__ = ("_ends", "_len", "pieces")

    def __init__(self, pieces: Iterable[OffsetPiece] = ()) -> None:
        self.pieces: list[OffsetPiece] = []
        self._len = 0
        self._ends: list[int] | None = None  # rows up to the end of each piece
        for piece in pieces:
            self.add(piece)

    def add(self, piece: OffsetPiece) -> None:
        """Append the offsets of `piece` (each above the last one here). A list of
        consecutive offsets is kept as a range, and a range that continues the last
        one joins it."""
        n = len(piece)
        if not n:
            return
        first = piece[0]
        if self._len:
            last = self.pieces[-1]
            if not first > last[-1]:
                raise ValueError(f"offset {first} does not follow {last[-1]}")
            if isinstance(last, range) and first == last.stop and piece[-1] - first == n - 1:
                self.pieces[-1] = range(last.start, first + n)
                self._len += n
                self._ends = None
                return
        if isinstance(piece, list) and piece[-1] - first == n - 1:
            piece = range(first, first + n)  # increasing ints with no gap: consecutive
        self.pieces.append(piece)
        self._len += n
        self._ends = None

    def extend(self, other: Iterable[OffsetPiece] | OffsetColumn) -> None:
        for piece in other.pieces if isinstance(other, OffsetColumn) else other:
            self.add(piece)

    def truncate(self, rows: int) -> None:
        """Keep the first `rows` rows."""
        if rows < self._len:
            self.pieces = slice_pieces(self.pieces, 0, max(rows, 0))  # type: ignore[arg-type]
            self._len = max(rows, 0)
            self._ends = None

    def rows_below(self, offset: int) -> int:
        """How many of the offsets are below `offset` (where it would be inserted)."""
        rows = 0
        for piece in self.pieces:
            if piece[-1] < offset:
                rows += len(piece)
                continue
            if isinstance(piece, range):
                return rows + max(offset - piece.start, 0)
            return rows + bisect_left(piece, offset)
        return rows

    def to_list(self) -> list[int]:
        out: list[int] = []
        for piece in self.pieces:
            out += piece
        return out

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self.pieces)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            begin, stop, step = index.indices(self._len)
            if step != 1:  # not increasing in general (a reversed slice): a list
                return self.to_list()[index]
            return OffsetColumn(slice_pieces(self.pieces, begin, stop))  # type: ignore[arg-type]
        pieces = self.pieces
        if len(pieces) == 1 or index == -1:
            if not pieces:
                raise IndexError("offset column index out of range")
            return pieces[-1][index]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("offset column index out of range")
        ends = self._ends
        if ends is None:
            ends = self._ends = list(accumulate(len(piece) for piece in pieces))
        at = bisect_right(ends, index)
        return pieces[at][index - (ends[at - 1] if at else 0)]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OffsetColumn):
            return self.to_list() == other.to_list()
        if isinstance(other, Sequence) and not isinstance(other, str | bytes | bytearray):
            return len(other) == self._len and self.to_list() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return f"OffsetColumn({self.pieces!r})"


class ColumnBuffer:
    """Fields of the decoded records, one list per column, in offset order."""

    __slots__ = ("epoch_runs", "headers", "keys", "offsets", "timestamps", "value_pieces")

    def __init__(self, with_headers: bool) -> None:
        self.offsets = OffsetColumn()
        self.timestamps: list[int] = []  # ms
        self.keys: list[bytes | None] = []
        self.value_pieces: list[ValuePiece] = []  # the value column, in pieces
        self.headers: list[tuple[tuple[str, bytes | None], ...]] | None = (
            [] if with_headers else None
        )
        # (leader epoch, rows): consecutive rows carrying that epoch (one run per batch)
        self.epoch_runs: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def values(self) -> list[bytes | None]:
        """The value column as one list (builders should read `value_pieces`)."""
        out: list[bytes | None] = []
        for piece in self.value_pieces:
            out += piece if isinstance(piece, list) else piece.to_list()
        return out

    def epochs(self) -> list[int]:
        out: list[int] = []
        for epoch, rows in self.epoch_runs:
            out += [epoch] * rows
        return out

    def truncate(self, rows: int) -> None:
        """Keep the first `rows` rows."""
        self.offsets.truncate(rows)
        del self.timestamps[rows:], self.keys[rows:]
        self.value_pieces = slice_pieces(self.value_pieces, 0, rows)
        if self.headers is not None:
            del self.headers[rows:]
        runs: list[tuple[int, int]] = []
        left = rows
        for epoch, n in self.epoch_runs:
            if left <= 0:
                break
            runs.append((epoch, min(n, left)))
            left -= n
        self.epoch_runs = runs

    def clear(self) -> None:
        self.offsets = OffsetColumn()
        self.timestamps = []
        self.keys = []
        self.value_pieces = []
        if self.headers is not None:
            self.headers = []
        self.epoch_runs = []


def decode_columns(
    buf: bytes | bytearray | memoryview,
    pos: int,
    columns: ColumnBuffer,
    *,
    min_offset: int = 0,
    end_offset: int | None = None,
    verify_crc: bool = True,
) -> BatchHeader:
    """Append the records of the batch at `pos` with min_offset <= offset < end_offset
    (and above the last offset `columns` holds) to `columns`; returns the batch header.
    Control batches add nothing (the caller reads that from the header). Raises
    CorruptRecordError on a malformed batch, with nothing of that batch appended."""
    header = validate_batch(buf, pos) if verify_crc else parse_header(buf, pos)
    end = pos + header.size
    if end > len(buf):
        raise CorruptRecordError("batch runs past the end of the buffer")
    if header.attributes & 0x20:  # control batch: no data records
        return header
    if columns.offsets:
        # Each offset once, in order: a batch overlapping what `columns` holds (a
        # broker's fault) adds only what follows it, as Kafka's consumer skips the
        # records below its position.
        min_offset = max(min_offset, columns.offsets[-1] + 1)
    body = decompress(header.compression, memoryview(buf)[pos + HEADER_SIZE : end])
    if isinstance(body, memoryview):
        body = body.tobytes()  # indexing and slicing bytes is cheaper than a memoryview
    offsets: list[int] = []  # decoded one by one, since the last run
    offset_pieces: list[OffsetPiece] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers_out: list[tuple[tuple[str, bytes | None], ...]] = []
    pieces: list[ValuePiece] = []
    add_offset, add_ts = offsets.append, timestamps.append
    add_key, add_value, add_headers = keys.append, values.append, headers_out.append
    p = 0
    body_len = len(body)
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    log_append = bool(header.attributes & _ATTR_TIMESTAMP_TYPE)
    unzigzag = UNZIGZAG
    previous_delta = -1
    # The same varint decoding as protocol.record_batch.decode_batch (inline for the
    # one- and two-byte forms, through the UNZIGZAG table), appending fields instead of
    # building records.
    try:
        count = header.record_count
        done = 0
        next_run_try = 1
        while done < count:
            record_start = p
            b = body[p]
            if b < 0x80:
                length = unzigzag[b]
                p += 1
            elif (c := body[p + 1]) < 0x80:
                length = unzigzag[(b & 0x7F) | (c << 7)]
                p += 2
            else:
                length, p = decode_varint(body, p)
            record_end = p + length
            if length < 1 or record_end > body_len:
                raise CorruptRecordError(f"record length {length} runs past the end of the batch")
            b = body[p + 1]  # attributes (unused in v2) at p, then the timestamp delta
            if b < 0x80:
                add_ts(base_ts + unzigzag[b])
                p += 2
            else:
                ts_delta, p = decode_varint(body, p + 1)
                add_ts(base_ts + ts_delta)
            b = body[p]
            if b < 0x80:
                offset_delta = unzigzag[b]
                p += 1
            elif (c := body[p + 1]) < 0x80:
                offset_delta = unzigzag[(b & 0x7F) | (c << 7)]
                p += 2
            else:
                offset_delta, p = decode_varint(body, p)
            # As decode_batch_into: deltas increase, within the header's last one.
            if not previous_delta < offset_delta <= header.last_offset_delta:
                raise CorruptRecordError(
                    f"record offset delta {offset_delta} after {previous_delta} (the batch "
                    f"ends at delta {header.last_offset_delta})"
                )
            previous_delta = offset_delta
            add_offset(base_offset + offset_delta)
            b = body[p]
            if b == 1:  # null key
                add_key(None)
                p += 1
            else:
                if b < 0x80:
                    n = unzigzag[b]
                    p += 1
                elif (c := body[p + 1]) < 0x80:
                    n = unzigzag[(b & 0x7F) | (c << 7)]
                    p += 2
                else:
                    n, p = decode_varint(body, p)
                if n < 0:
                    add_key(None)
                else:
                    add_key(body[p : p + n])
                    p += n
            b = body[p]
            if b == 1:  # null value
                add_value(None)
                p += 1
            else:
                if b < 0x80:
                    n = unzigzag[b]
                    p += 1
                elif (c := body[p + 1]) < 0x80:
                    n = unzigzag[(b & 0x7F) | (c << 7)]
                    p += 2
                else:
                    n, p = decode_varint(body, p)
                if n < 0:
                    add_value(None)
                else:
                    add_value(body[p : p + n])
                    p += n
            if p < record_end and body[p] == 0:
                add_headers(_NO_HEADERS)
                p += 1
            else:
                record_headers, p = decode_record_headers(body, p, length)
                add_headers(record_headers)
            if p != record_end:
                raise CorruptRecordError("record length does not match its fields")
            done += 1
            if done >= next_run_try and done < count:
                if body[p] != body[record_start]:  # the next length differs: no run
                    next_run_try = done + RUN_PROBE
                    continue
                # The records after this one may be laid out like it: take them in bulk.
                run = _take_run(
                    body,
                    record_start,
                    p,
                    # a run must not pass the header's last offset delta
                    min(count - done, header.last_offset_delta - previous_delta),
                    previous_delta,
                    base_ts,
                    timestamps,
                    keys,
                    headers_out,
                )
                if run is not None:
                    n = run.count
                    done += n
                    p += n * run.stride
                    first_offset = base_offset + previous_delta + 1
                    offset_pieces.append(offsets)
                    offset_pieces.append(range(first_offset, first_offset + n))
                    previous_delta += n
                    offsets = []
                    add_offset = offsets.append
                    pieces.append(values)
                    pieces.append(run)
                    values = []
                    add_value = values.append
                else:
                    next_run_try = done + RUN_RETRY_AFTER
    except IndexError:
        raise CorruptRecordError("record field runs past the end of the batch") from None
    if p != body_len:
        raise CorruptRecordError("bytes left over after the last record")
    if log_append:
        timestamps = [header.max_timestamp] * len(timestamps)
    offset_pieces.append(offsets)
    batch_offsets = OffsetColumn(offset_pieces)
    rows = len(batch_offsets)
    first = batch_offsets.rows_below(min_offset) if rows and batch_offsets[0] < min_offset else 0
    last = rows
    if end_offset is not None and rows and batch_offsets[-1] >= end_offset:
        last = batch_offsets.rows_below(end_offset)
    pieces.append(values)
    if first or last < rows:
        batch_offsets, timestamps = batch_offsets[first:last], timestamps[first:last]
        keys, headers_out = keys[first:last], headers_out[first:last]
        pieces = slice_pieces(pieces, first, last)
        rows = last - first if last > first else 0
    if not rows:
        return header
    columns.offsets.extend(batch_offsets)
    columns.timestamps += timestamps
    columns.keys += keys
    columns.value_pieces += [piece for piece in pieces if _piece_len(piece)]
    if columns.headers is not None:
        columns.headers += headers_out
    columns.epoch_runs.append((header.partition_leader_epoch, rows))
    return header


def _take_run(
    body: bytes,
    start: int,
    end: int,
    left: int,
    delta: int,
    base_ts: int,
    timestamps: list[int],
    keys: list[bytes | None],
    headers: list[tuple[tuple[str, bytes | None], ...]],
) -> ValueRun | None:
    """The record at [start, end) (offset delta `delta`) was just decoded. If at least
    _MIN_RUN records after it are laid out exactly like it (alike_runs: every byte the
    per-record decode would read, checked with strided slices), append up to `left` of
    them (all columns but the offsets, consecutive from delta + 1, and the values) and
    return their values as a ValueRun; None when they are not, or their values are
    null."""
    run = alike_run(body, start, end, len(body), left, delta)
    n = run.count
    if n < _MIN_RUN or run.value_len < 0:
        return None
    stamps = run_timestamps(body, end, run, base_ts)
    if stamps is None:
        return None
    timestamps += stamps
    keys += run_keys(body, end, run)
    headers += repeat(_NO_HEADERS, n)
    return ValueRun(body, end, run.value_at, run.stride, run.value_len, n)
