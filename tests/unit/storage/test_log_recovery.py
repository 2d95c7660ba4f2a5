"""Crash recovery, the acceptance test of the storage engine.

A log of several segments and leader epochs is built once; each case copies it, damages
the last segment (a cut at every byte of the last two batches, single bit flips), and
reopens it as after a crash. The recovered log must be exactly the valid prefix.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from broker.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT
from broker.storage.epoch_cache import EpochEntry
from broker.storage.errors import CorruptSegmentError
from broker.storage.log import Log
from broker.storage.log import LogConfig
from protocol.record_batch import BatchBuilder
from protocol.record_batch import BatchHeader
from protocol.record_batch import iter_headers
from protocol.record_batch import stamp

BIG = 10**9
CONFIG = LogConfig(segment_bytes=800, index_interval_bytes=100, retention_ms=-1)
# The second-to-last batch starts epoch 7, so a flip in its epoch field is caught by the
# checkpoint and one in the last batch's epoch by the "never decreases" rule.
EPOCHS = [0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 4, 4, 4, 4, 7, 7]
RECORDS = [3, 1, 5, 2, 4]


def _make_batch(records: int, timestamp: int = 90_000) -> bytes:
    builder = BatchBuilder(base_timestamp=timestamp)
    for i in range(records):
        builder.append(b"value-%d" % i, b"key", timestamp=timestamp + i)
    return builder.build()


@dataclass
class Pristine:
    dir: Path
    data: bytes  # the whole log as read before the crash
    batches: list[tuple[int, BatchHeader]]  # (position in `data`, header)
    last_segment: Path
    last_segment_start: int  # position of the last segment's first byte in `data`
    epochs: list[EpochEntry]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    dir = tmp_path_factory.mktemp("pristine") / "events-0"
    log = Log.open(dir, CONFIG, had_clean_shutdown=True, now_ms=0)
    for n, epoch in enumerate(EPOCHS):
        batch = _make_batch(RECORDS[n % len(RECORDS)], timestamp=50_000 + 10 * n)
        log.append_as_leader(batch, epoch, now_ms=0)
    data = log.read(0, BIG)
    last = log.active_segment
    start = len(data) - last.size
    pristine = Pristine(
        dir=dir,
        data=data,
        batches=list(iter_headers(data)),
        last_segment=last.log_path,
        last_segment_start=start,
        epochs=log.epoch_cache.entries,
    )
    log.close()
    assert len(log.segments) >= 3
    assert [p for p, _ in pristine.batches[-2:]] >= [start, start]  # both in the last segment
    return pristine


def _copy(pristine: Pristine, tmp_path: Path, name: str) -> Path:
    dir = tmp_path / name / pristine.dir.name
    shutil.copytree(pristine.dir, dir)
    return dir


def _reopen_unclean(dir: Path, recovery_point: int = 0) -> Log:
    return Log.open(dir, CONFIG, had_clean_shutdown=False, recovery_point=recovery_point)


def _assert_valid_prefix(log: Log, pristine: Pristine, kept: int, *, clean: bool = False) -> None:
    """The log holds exactly the first `kept` batches of the pristine log, fully usable."""
    batches = pristine.batches[:kept]
    end = batches[-1][0] + batches[-1][1].size if batches else 0
    leo = batches[-1][1].next_offset if batches else 0
    assert log.log_end_offset == leo
    if not clean:
        assert log.recovery_point == leo  # recovered data is fsynced
    assert log.read(0, BIG) == pristine.data[:end]
    # Indexes rebuilt: every lookup lands on the batch holding the offset.
    for offset in range(leo):
        first = next(iter_headers(log.read(offset, 1)))[1]
        assert first.base_offset <= offset <= first.last_offset
    by_offset = {header.base_offset: header for _, header in batches}
    for segment in log.segments:
        positions = {h.base_offset: p for p, h in iter_headers(segment.read(0, BIG))}
        for offset, position in segment.offset_index.entries:
            assert positions[offset] == position
        for timestamp, offset in segment.time_index.entries:
            assert by_offset[offset].max_timestamp == timestamp
    assert all(entry.start_offset < leo for entry in log.epoch_cache.entries)
    assert log.epoch_cache.entries == [e for e in pristine.epochs if e.start_offset < leo]
    # And the log goes on.
    info = log.append_as_leader(_make_batch(2), 7)
    assert info.first_offset == leo
    assert log.read(leo, BIG)[16:] == _make_batch(2)[16:]  # all but offset and epoch


def test_intact_log_survives_an_unclean_shutdown(pristine: Pristine, tmp_path: Path):
    log = _reopen_unclean(_copy(pristine, tmp_path, "intact"))
    _assert_valid_prefix(log, pristine, len(pristine.batches))
    log.close()


def test_cut_at_every_byte_of_the_last_two_batches(
    pristine: Pristine, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    second_last_position = pristine.batches[-2][0]
    begin = second_last_position - pristine.last_segment_start
    size = len(pristine.data) - pristine.last_segment_start
    caplog.set_level(logging.WARNING)
    for cut in range(begin, size):
        dir = _copy(pristine, tmp_path, f"cut{cut}")
        log_file = dir / pristine.last_segment.name
        with open(log_file, "r+b") as f:
            f.truncate(cut)
        # Half of the cases also use a recovery point at the last segment.
        recovery_point = 0 if cut % 2 else pristine.batches[-3][1].next_offset
        log = _reopen_unclean(dir, recovery_point)
        kept = sum(
            1 for p, h in pristine.batches if p + h.size <= pristine.last_segment_start + cut
        )
        _assert_valid_prefix(log, pristine, kept)
        log.close()
        shutil.rmtree(dir.parent)
    assert any("cutting" in r.getMessage() for r in caplog.records)


def _flip_cases(pristine: Pristine) -> list[tuple[int, int]]:
    """(position in the log data, bit): a sample of every position in the last two
    batches, and every bit of the header fields and of a few body bytes."""
    cases = []
    for position, header in pristine.batches[-2:]:
        cases += [(position + i, (i * 5) % 8) for i in range(0, header.size, 3)]
        # base offset, length, epoch, magic, crc, attributes, last delta, count, body
        for i in (7, 11, 15, 16, 20, 22, 26, 60, 61, header.size // 2, header.size - 1):
            cases += [(position + i, bit) for bit in range(8)]
    return cases


def _files(dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dir.glob("*.log"))}


def test_single_bit_flips_in_the_last_two_batches(
    pristine: Pristine, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A flipped bit is cut only as a torn tail: in the last batch, where no valid
    batch follows and the flip broke the batch (its CRC, length or magic). A flip in
    the batch before it (the last batch follows, valid), or one outside the CRC (base
    offset, leader epoch) that leaves a whole batch out of place, is damage inside the
    log: refused, the file untouched (the invariant: nothing cut on an inference)."""
    caplog.set_level(logging.WARNING)
    cases = _flip_cases(pristine)
    assert len(cases) > 150
    refused = cut = 0
    last = len(pristine.batches) - 1
    for n, (position, bit) in enumerate(cases):
        dir = _copy(pristine, tmp_path, f"flip{n}")
        log_file = dir / pristine.last_segment.name
        raw = bytearray(log_file.read_bytes())
        raw[position - pristine.last_segment_start] ^= 1 << bit
        log_file.write_bytes(bytes(raw))
        before = _files(dir)
        damaged = next(k for k, (p, h) in enumerate(pristine.batches) if p <= position < p + h.size)
        try:
            log = _reopen_unclean(dir)
        except CorruptSegmentError as exc:
            refused += 1
            assert _files(dir) == before, f"flip of bit {bit} at byte {position}: file changed"
            assert "nothing was cut" in str(exc)
            whole = position - pristine.batches[damaged][0] < 16  # base offset, length, epoch
            assert damaged < last or whole, f"flip of bit {bit} at byte {position}: {exc}"
            continue
        cut += 1
        try:
            assert damaged == last
            _assert_valid_prefix(log, pristine, damaged)
        except AssertionError as exc:
            raise AssertionError(f"flip of bit {bit} at byte {position}: {exc}") from exc
        log.close()
        shutil.rmtree(dir.parent)
    assert refused and cut  # both outcomes were exercised


def test_a_cut_in_an_earlier_segment_is_refused_and_nothing_deleted(
    pristine: Pristine, tmp_path: Path
):
    """A torn batch at the end of the second of three segments, records in the third:
    not a torn end of the log. Kafka cuts it and deletes the later segments (a replica
    can then re-fetch them, a lone copy loses acknowledged records); here the load is
    refused with nothing cut or deleted."""
    dir = _copy(pristine, tmp_path, "middle")
    log = Log.open(dir, CONFIG, had_clean_shutdown=True)
    second = log.segments[1]
    cut = second.size - 10
    log.close()
    with open(second.log_path, "r+b") as f:
        f.truncate(cut)
    before = _files(dir)
    assert len(before) == 3
    with pytest.raises(CorruptSegmentError, match="later segments hold records"):
        _reopen_unclean(dir)
    assert _files(dir) == before


def test_clean_shutdown_with_a_torn_tail_is_still_recovered(
    pristine: Pristine, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    dir = _copy(pristine, tmp_path, "torn")
    with open(dir / pristine.last_segment.name, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x63\x00\x00")
    with caplog.at_level(logging.WARNING):
        log = Log.open(dir, CONFIG, had_clean_shutdown=True)
    assert "torn or corrupt at position" in caplog.text
    _assert_valid_prefix(log, pristine, len(pristine.batches), clean=True)
    log.close()


@pytest.mark.parametrize(
    "damage",
    ["garbage", "not-multiple", "missing", "wrong-position", "time-garbage", "time-missing"],
)
def test_corrupt_index_files_are_rebuilt(
    pristine: Pristine, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
):
    dir = _copy(pristine, tmp_path, damage)
    reference = Log.open(dir, CONFIG, had_clean_shutdown=True)
    segment = reference.segments[1]
    before = (segment.offset_index.entries, segment.time_index.entries)
    assert before[0], "the test needs index entries"
    reference.close()
    index, time_index = segment.index_path, segment.time_index_path
    if damage == "garbage":
        index.write_bytes(b"\xff" * 8 + index.read_bytes())
    elif damage == "not-multiple":
        index.write_bytes(index.read_bytes()[:-3])
    elif damage == "missing":
        index.unlink()
    elif damage == "wrong-position":
        raw = bytearray(index.read_bytes())
        raw[-1] ^= 0x04
        index.write_bytes(bytes(raw))
    elif damage == "time-garbage":
        time_index.write_bytes(b"\x00" * 11 + time_index.read_bytes())
    else:
        time_index.unlink()
    with caplog.at_level(logging.WARNING):
        log = Log.open(dir, CONFIG, had_clean_shutdown=True)
    assert "recovering the segment" in caplog.text
    rebuilt = log.segments[1]
    rebuilt.on_become_inactive()  # the final time index entry a roll writes
    assert (rebuilt.offset_index.entries, rebuilt.time_index.entries) == before
    _assert_valid_prefix(log, pristine, len(pristine.batches), clean=True)
    log.close()


@pytest.mark.parametrize(
    "content",
    [b"0\n5\n0 0\n1 9\n2 15\n4 30\n7 4", b"0\n5\n0 0\n1 9\n", b"\x00garbage\x01", None],
    ids=["truncated-line", "truncated-entries", "garbage", "missing"],
)
@pytest.mark.parametrize("clean", [True, False])
def test_corrupt_or_missing_epoch_checkpoint_is_rebuilt_from_batch_headers(
    pristine: Pristine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    content: bytes | None,
    clean: bool,
):
    dir = _copy(pristine, tmp_path, "epochs")
    checkpoint = dir / LEADER_EPOCH_CHECKPOINT
    if content is None:
        checkpoint.unlink()
    else:
        checkpoint.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        log = Log.open(dir, CONFIG, had_clean_shutdown=clean)
    warning = next(r for r in caplog.records if "rebuilt the leader epoch cache" in r.message)
    assert warning.levelno == logging.WARNING
    assert str(checkpoint) in warning.getMessage()
    assert log.epoch_cache.entries == pristine.epochs  # every epoch here wrote data
    lines = "".join(f"{e.epoch} {e.start_offset}\n" for e in pristine.epochs)
    assert checkpoint.read_text() == f"0\n{len(pristine.epochs)}\n{lines}"
    log.close()


def test_missing_epoch_checkpoint_of_an_empty_log_is_an_empty_cache_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A new, empty log writes no empty checkpoint (issue 20: two fsyncs per replica
    created), and opens again without one quietly; its first epoch writes the file."""
    for _ in range(2):
        with caplog.at_level(logging.WARNING):
            log = Log.open(tmp_path / "fresh-0", CONFIG, had_clean_shutdown=False)
        assert caplog.records == []
        assert log.latest_epoch == -1
        assert not (tmp_path / "fresh-0" / LEADER_EPOCH_CHECKPOINT).exists()
        log.close()
    log = Log.open(tmp_path / "fresh-0", CONFIG, had_clean_shutdown=True)
    log.epoch_cache.assign(2, 0)
    assert (tmp_path / "fresh-0" / LEADER_EPOCH_CHECKPOINT).read_text() == "0\n1\n2 0\n"
    log.close()


def test_epoch_entries_past_the_log_end_are_dropped(pristine: Pristine, tmp_path: Path):
    dir = _copy(pristine, tmp_path, "ahead")
    log = Log.open(dir, CONFIG, had_clean_shutdown=True)
    end = log.log_end_offset
    log.epoch_cache.assign(9, end)  # a leader took over, crashed before writing
    log.close()
    reopened = _reopen_unclean(dir)
    assert reopened.epoch_cache.entries == pristine.epochs
    reopened.close()


def test_epoch_entries_below_the_log_start_are_dropped(pristine: Pristine, tmp_path: Path):
    dir = _copy(pristine, tmp_path, "start")
    log = Log.open(dir, CONFIG, had_clean_shutdown=True, log_start_offset=20)
    covering = max(e for e in pristine.epochs if e.start_offset <= 20)
    assert log.log_start_offset == 20
    assert log.epoch_cache.earliest_entry == EpochEntry(covering.epoch, 20)
    log.close()


def test_a_log_start_past_the_recovered_end_does_not_delete_the_records(
    pristine: Pristine, tmp_path: Path
):
    """A log-start checkpoint entry past the log end (a flipped digit, or a crash while
    a follower restarted its log further on): the log used to delete every segment
    and restart empty there (found by a hostile-disk session). Its records stay; the
    log starts at its first segment."""
    dir = _copy(pristine, tmp_path, "past")
    log = _reopen_unclean(dir)
    end, data = log.log_end_offset, log.read(0, BIG)
    log.close()
    before = _files(dir)
    reopened = Log.open(dir, CONFIG, had_clean_shutdown=False, log_start_offset=end + 50)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, end)
    assert reopened.read(0, BIG) == data
    reopened.close()
    assert _files(dir) == before


def test_an_empty_log_restarts_at_a_log_start_past_its_end(tmp_path: Path):
    """With no records, a checkpointed start past the end is where the log restarts (a
    follower that restarted its log there and crashed before writing)."""
    dir = tmp_path / "events-0"
    Log.open(dir, CONFIG, had_clean_shutdown=True).close()
    restarted = Log.open(dir, CONFIG, had_clean_shutdown=False, log_start_offset=50)
    assert (restarted.log_start_offset, restarted.log_end_offset) == (50, 50)
    assert [s.base_offset for s in restarted.segments] == [50]
    restarted.close()


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("lead"), st.booleans(), st.integers(1, 6)),
        st.tuples(st.just("follow"), st.booleans(), st.integers(1, 6)),
        st.tuples(st.just("truncate"), st.integers(0, 12)),
        st.tuples(st.just("claim")),  # became leader of a new epoch, wrote nothing
        st.tuples(st.just("retain")),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None)
@given(_ops)
def test_recovery_keeps_everything_the_public_api_wrote(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple]
):
    """Whatever sequence of appends, truncations, epoch changes and retention produced a
    log, recovery after a crash keeps all of it: its checks reject only damage."""
    dir = tmp_path_factory.mktemp("ops") / "prop-0"
    config = LogConfig(segment_bytes=400, index_interval_bytes=50, retention_bytes=1200)
    log = Log.open(dir, config, had_clean_shutdown=True, now_ms=0)
    epoch = 0
    for op in ops:
        if op[0] in ("lead", "follow"):
            epoch = max(epoch + op[1], log.latest_epoch, 0)
            if op[0] == "lead":
                log.append_as_leader(_make_batch(op[2]), epoch, now_ms=0)
            else:
                batch = bytearray(_make_batch(op[2]))
                stamp(batch, 0, log.log_end_offset, epoch)
                log.append_as_follower(bytes(batch), now_ms=0)
        elif op[0] == "truncate":
            log.truncate_to(max(log.log_start_offset, log.log_end_offset - op[1]))
        elif op[0] == "claim":
            epoch = max(epoch, log.latest_epoch) + 1
            log.epoch_cache.assign(epoch, log.log_end_offset)
        else:
            log.delete_old_segments(high_watermark=log.log_end_offset, now_ms=0)
    start, end = log.log_start_offset, log.log_end_offset
    data = log.read(start, BIG)
    entries = [e for e in log.epoch_cache.entries if e.start_offset < end]
    log.close()  # like a crash: nothing flushed, no recovery point
    recovered = Log.open(
        dir, config, had_clean_shutdown=False, log_start_offset=start, recovery_point=0
    )
    assert (recovered.log_start_offset, recovered.log_end_offset) == (start, end)
    assert recovered.read(start, BIG) == data
    assert recovered.epoch_cache.entries == entries
    recovered.close()
