"""LeaderEpochFileCache: Kafka's rules (after LeaderEpochFileCacheTest) and the file."""

from __future__ import annotations

import errno
import itertools
import logging
import threading
from collections.abc import Iterable
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from broker.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT
from broker.storage.epoch_cache import EpochEntry
from broker.storage.epoch_cache import LeaderEpochCheckpointFile
from broker.storage.epoch_cache import LeaderEpochFileCache

UNDEFINED = (-1, -1)


@pytest.fixture
def cache(tmp_path: Path) -> LeaderEpochFileCache:
    return LeaderEpochFileCache.load(tmp_path / LEADER_EPOCH_CHECKPOINT)


def entries(*pairs: tuple[int, int]) -> list[EpochEntry]:
    return [EpochEntry(e, o) for e, o in pairs]


# ---------------------------------------------------------------- assign


def test_assign_appends_and_latest_epoch_tracks_it(cache: LeaderEpochFileCache):
    assert cache.latest_epoch == -1 and cache.latest_entry is None and cache.earliest_entry is None
    cache.assign(2, 10)
    assert cache.latest_epoch == 2
    assert cache.entries == entries((2, 10))
    assert cache.end_offset_for(2, 11) == (2, 11)


def test_assign_same_epoch_later_offset_is_a_no_op(cache: LeaderEpochFileCache):
    assert cache.assign(2, 6)
    assert not cache.assign(2, 7)
    assert not cache.assign(2, 6)
    assert cache.entries == entries((2, 6))


def test_assign_same_epoch_earlier_offset_replaces_the_entry(cache: LeaderEpochFileCache):
    cache.assign(5, 11)
    cache.assign(6, 12)
    cache.assign(7, 13)
    cache.assign(7, 12)  # epoch 7 starts earlier: (6, 12) and (7, 13) conflict
    assert cache.entries == entries((5, 11), (7, 12))
    assert cache.end_offset_for(5, 20) == (5, 12)
    assert cache.end_offset_for(6, 20) == (5, 12)


def test_assign_new_epoch_same_offset_replaces_the_previous_claim(cache: LeaderEpochFileCache):
    cache.assign(2, 9)
    cache.assign(3, 9)
    assert cache.entries == entries((3, 9))


def test_assign_older_epoch_removes_later_epochs_and_warns(
    cache: LeaderEpochFileCache, caplog: pytest.LogCaptureFixture
):
    cache.assign(1, 5)
    cache.assign(2, 6)
    with caplog.at_level(logging.WARNING, logger="broker.storage.epoch_cache"):
        cache.assign(1, 7)
    assert cache.entries == entries((1, 7))
    assert cache.latest_epoch == 1
    assert cache.end_offset_for(1, 8) == (1, 8)
    assert cache.end_offset_for(2, 8) == UNDEFINED
    warning = caplog.records[-1]
    assert warning.levelno == logging.WARNING
    assert "(epoch=1, start_offset=5), (epoch=2, start_offset=6)" in warning.getMessage()


def test_assign_lower_offset_removes_conflicting_entries(cache: LeaderEpochFileCache):
    cache.assign(2, 6)
    cache.assign(3, 5)
    assert cache.entries == entries((3, 5))


def test_assign_rejects_negative_values(cache: LeaderEpochFileCache):
    with pytest.raises(ValueError):
        cache.assign(-1, 0)
    with pytest.raises(ValueError):
        cache.assign(0, -1)


def test_epochs_as_leaders_change_many_times(cache: LeaderEpochFileCache):
    cache.assign(0, 0)
    cache.assign(1, 0)
    assert cache.latest_epoch == 1
    assert cache.end_offset_for(1, 0) == (1, 0)
    assert cache.end_offset_for(0, 0) == (0, 0)  # (0, 0) was replaced: nothing was written
    assert cache.end_offset_for(1, 5) == (1, 5)
    cache.assign(2, 5)
    assert cache.end_offset_for(2, 10) == (2, 10)
    assert cache.end_offset_for(1, 10) == (1, 5)
    assert cache.end_offset_for(0, 10) == (0, 0)


def test_epochs_as_a_follower_receives_batches(cache: LeaderEpochFileCache):
    for epoch, offsets in [(0, range(0, 3)), (1, range(3, 6)), (2, range(6, 9))]:
        for offset in offsets:
            cache.assign(epoch, offset)
    assert cache.entries == entries((0, 0), (1, 3), (2, 6))
    assert cache.end_offset_for(2, 9) == (2, 9)
    assert cache.end_offset_for(0, 9) == (0, 3)
    assert cache.end_offset_for(1, 9) == (1, 6)


# ---------------------------------------------------------------- end_offset_for


def test_end_offset_for_undefined_epoch(cache: LeaderEpochFileCache):
    assert cache.end_offset_for(-1, 73) == UNDEFINED  # empty cache
    cache.assign(2, 11)
    cache.assign(3, 12)
    assert cache.end_offset_for(-1, 73) == UNDEFINED


def test_end_offset_for_empty_cache_is_undefined(cache: LeaderEpochFileCache):
    assert cache.end_offset_for(0, 10) == UNDEFINED


def test_end_offset_for_latest_epoch_is_the_log_end_offset(cache: LeaderEpochFileCache):
    cache.assign(2, 11)
    cache.assign(2, 12)
    assert cache.end_offset_for(2, 14) == (2, 14)


def test_end_offset_for_epoch_above_every_entry_is_undefined(cache: LeaderEpochFileCache):
    cache.assign(2, 100)
    assert cache.end_offset_for(3, 100) == UNDEFINED


def test_end_offset_for_epoch_below_every_entry(cache: LeaderEpochFileCache):
    cache.assign(5, 11)
    cache.assign(6, 12)
    cache.assign(7, 13)
    assert cache.end_offset_for(4, 20) == (4, 11)


def test_end_offset_for_unknown_epoch_between_entries(cache: LeaderEpochFileCache):
    cache.assign(0, 10)
    cache.assign(2, 13)
    cache.assign(4, 17)
    assert cache.end_offset_for(1, 20) == (0, 13)
    assert cache.end_offset_for(2, 20) == (2, 17)
    assert cache.end_offset_for(3, 20) == (2, 17)


def test_end_offset_for_known_earlier_epoch(cache: LeaderEpochFileCache):
    for epoch, offset in [(1, 11), (1, 12), (2, 13), (2, 14), (3, 15), (3, 16)]:
        cache.assign(epoch, offset)
    assert cache.end_offset_for(2, 17) == (2, 15)


def test_epoch_for_offset(cache: LeaderEpochFileCache):
    assert cache.epoch_for_offset(5) is None
    cache.assign(2, 6)
    cache.assign(3, 8)
    cache.assign(4, 11)
    assert cache.epoch_for_offset(5) is None
    assert cache.epoch_for_offset(6) == 2
    assert cache.epoch_for_offset(7) == 2
    assert cache.epoch_for_offset(8) == 3
    assert cache.epoch_for_offset(10) == 3
    assert cache.epoch_for_offset(11) == 4
    assert cache.epoch_for_offset(10**9) == 4


# ---------------------------------------------------------------- truncation


@pytest.fixture
def three(cache: LeaderEpochFileCache) -> LeaderEpochFileCache:
    cache.assign(2, 6)
    cache.assign(3, 8)
    cache.assign(4, 11)
    return cache


@pytest.mark.parametrize(
    ("end_offset", "expected"),
    [
        (8, [(2, 6)]),  # on a boundary: inclusive
        (9, [(2, 6), (3, 8)]),
        (11, [(2, 6), (3, 8)]),
        (12, [(2, 6), (3, 8), (4, 11)]),  # past the last start: nothing to do
        (6, []),
        (0, []),
        (-1, [(2, 6), (3, 8), (4, 11)]),  # undefined offset: ignored
    ],
)
def test_truncate_from_end(three: LeaderEpochFileCache, end_offset: int, expected: list):
    three.truncate_from_end(end_offset)
    assert three.entries == entries(*expected)
    assert LeaderEpochFileCache.load(three.path).entries == entries(*expected)


@pytest.mark.parametrize(
    ("start_offset", "expected"),
    [
        (1, [(2, 6), (3, 8), (4, 11)]),  # before the first entry: nothing changes
        (6, [(2, 6), (3, 8), (4, 11)]),  # on the first entry: nothing changes
        (8, [(3, 8), (4, 11)]),  # on a boundary: that entry is kept as it is
        (9, [(3, 9), (4, 11)]),  # between entries: the covering one moves up
        (11, [(4, 11)]),
        (15, [(4, 15)]),  # past the last entry: it covers the new start
    ],
)
def test_truncate_from_start(three: LeaderEpochFileCache, start_offset: int, expected: list):
    three.truncate_from_start(start_offset)
    assert three.entries == entries(*expected)
    assert LeaderEpochFileCache.load(three.path).entries == entries(*expected)


def test_truncate_from_start_keeps_epoch_zero_covering_entry(cache: LeaderEpochFileCache):
    cache.assign(0, 0)
    cache.assign(1, 7)
    cache.assign(2, 10)
    cache.truncate_from_start(5)
    assert cache.entries == entries((0, 5), (1, 7), (2, 10))


def test_clear_empties_the_file(three: LeaderEpochFileCache):
    three.clear()
    assert three.entries == []
    assert three.path.read_text() == "0\n0\n"


# ---------------------------------------------------------------- the file


def test_file_has_exactly_the_documented_format(three: LeaderEpochFileCache):
    assert three.path.read_bytes() == b"0\n3\n2 6\n3 8\n4 11\n"
    assert not list(three.path.parent.glob("*.tmp"))


def test_persists_across_instances(tmp_path: Path):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    first = LeaderEpochFileCache.load(path)
    first.assign(2, 6)
    second = LeaderEpochFileCache.load(path)
    assert second.entries == entries((2, 6))


def test_missing_file_is_an_empty_cache(tmp_path: Path):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    assert LeaderEpochCheckpointFile(path).read() is None
    assert LeaderEpochFileCache.load(path).entries == []


# A corrupt file is refused: see test_checkpoints.py (the parser all checkpoint files share).


# ---------------------------------------------------------------- properties

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.integers(0, 8), st.integers(0, 60)),
        st.tuples(st.just("end"), st.integers(-1, 60)),
        st.tuples(st.just("start"), st.integers(0, 60)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(_ops)
def test_random_operations_keep_the_invariants_and_the_file_in_sync(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple]
):
    path = tmp_path_factory.mktemp("epochs") / LEADER_EPOCH_CHECKPOINT
    cache = LeaderEpochFileCache.load(path)
    for op in ops:
        if op[0] == "assign":
            cache.assign(op[1], op[2])
            assert cache.latest_entry == EpochEntry(op[1], cache.latest_entry.start_offset)
            assert cache.latest_entry.start_offset <= op[2]
        elif op[0] == "end":
            cache.truncate_from_end(op[1])
            if op[1] >= 0:
                assert all(e.start_offset < op[1] for e in cache.entries)
        else:
            before = cache.entries
            cache.truncate_from_start(op[1])
            if any(e.start_offset <= op[1] for e in before):
                assert cache.earliest_entry.start_offset == op[1]
                assert cache.epoch_for_offset(op[1]) == max(
                    e.epoch for e in before if e.start_offset <= op[1]
                )
        current = cache.entries
        for prev, entry in itertools.pairwise(current):
            assert entry.epoch > prev.epoch
            assert entry.start_offset >= prev.start_offset
        assert LeaderEpochFileCache.load(path).entries == current
        for requested in range(-1, 10):
            epoch, end = cache.end_offset_for(requested, 1000)
            if (epoch, end) != UNDEFINED:
                assert epoch <= requested
                higher = [e for e in current if e.epoch > requested]
                assert end == (higher[0].start_offset if higher else 1000)


# ---------------------------------------------------------------- background writes


class RecordingCheckpoint(LeaderEpochCheckpointFile):
    """The real checkpoint file; it notes which thread wrote what and can be held at
    the start of a write (a slow disk) or made to fail (a full one)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writers: list[tuple[str, list[EpochEntry]]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.started = threading.Event()
        self.fail: OSError | None = None

    def write(self, entries: Iterable[EpochEntry]) -> None:
        self.started.set()
        self.hold.wait(10)
        if self.fail is not None:
            raise self.fail
        entries = list(entries)
        super().write(entries)
        self.writers.append((threading.current_thread().name, entries))


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[LeaderEpochFileCache, RecordingCheckpoint]:
    checkpoint = RecordingCheckpoint(tmp_path / LEADER_EPOCH_CHECKPOINT)
    return LeaderEpochFileCache(checkpoint, entries((0, 0))), checkpoint


@pytest.fixture
def writer() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="epoch-ckpt") as executor:
        yield executor


def test_a_deferred_epoch_is_written_by_the_thread_and_the_append_finds_it_on_disk(
    recorded: tuple[LeaderEpochFileCache, RecordingCheckpoint], writer: ThreadPoolExecutor
):
    """Invariant (issue 20, 10,000 partitions): a new leader's epoch reaches the file
    before the first batch of the epoch, without an fsync pair on the event loop. Off
    (no background write): the append's ensure_written writes it on the caller's thread."""
    cache, checkpoint = recorded
    cache.assign(3, 10, write_now=False)
    future = cache.write_in_background(writer)
    assert future is not None
    future.result(5)
    cache.ensure_written()  # what the first append of epoch 3 does
    assert [who for who, _ in checkpoint.writers] == ["epoch-ckpt_0"]
    assert checkpoint.read() == entries((0, 0), (3, 10))
    assert not cache.unwritten
    assert cache.write_in_background(writer) is None  # nothing left to write


def test_a_write_no_thread_has_started_is_taken_back_by_the_append(
    recorded: tuple[LeaderEpochFileCache, RecordingCheckpoint], writer: ThreadPoolExecutor
):
    """Queued behind other writes, the background write is cancelled and the append
    writes the file itself at once: the loop never waits for the queue."""
    cache, checkpoint = recorded
    gate = threading.Event()
    busy = writer.submit(gate.wait, 10)  # another partition's write holds the one thread
    cache.assign(4, 20, write_now=False)
    queued = cache.write_in_background(writer)
    assert queued is not None and not queued.running()
    cache.ensure_written()
    assert queued.cancelled()
    assert [who for who, _ in checkpoint.writers] == ["MainThread"]
    gate.set()
    busy.result(5)
    assert checkpoint.read() == entries((0, 0), (4, 20))
    assert not cache.unwritten


def test_a_change_after_the_copy_is_not_settled_by_the_older_write(
    recorded: tuple[LeaderEpochFileCache, RecordingCheckpoint], writer: ThreadPoolExecutor
):
    """A background write settles only the change it copied: one made meanwhile is
    written by the next ensure_written, after the thread's write (never two writers)."""
    cache, checkpoint = recorded
    checkpoint.hold.clear()
    cache.assign(5, 30, write_now=False)
    future = cache.write_in_background(writer)
    assert future is not None and checkpoint.started.wait(5)
    cache.assign(6, 40, write_now=False)  # while the thread writes the copy
    assert cache.write_in_background(writer) is future  # one writer at a time
    threading.Timer(0.05, checkpoint.hold.set).start()
    cache.ensure_written()  # waits for the running write, then writes (6, 40)
    assert [e for _, e in checkpoint.writers] == [
        entries((0, 0), (5, 30)),
        entries((0, 0), (5, 30), (6, 40)),
    ]
    assert checkpoint.read() == entries((0, 0), (5, 30), (6, 40))


def test_a_failed_background_write_is_reported_by_the_append(
    recorded: tuple[LeaderEpochFileCache, RecordingCheckpoint], writer: ThreadPoolExecutor
):
    """The thread's error is not lost: the change stays unwritten and the append's
    own write raises it (KAFKA_STORAGE_ERROR for the produce), until the disk recovers."""
    cache, checkpoint = recorded
    checkpoint.fail = OSError(errno.ENOSPC, "No space left on device")
    cache.assign(7, 50, write_now=False)
    future = cache.write_in_background(writer)
    assert future is not None
    with pytest.raises(OSError):
        future.result(5)
    with pytest.raises(OSError, match="No space left"):
        cache.ensure_written()
    assert cache.unwritten
    checkpoint.fail = None
    cache.ensure_written()
    assert checkpoint.read() == entries((0, 0), (7, 50))
