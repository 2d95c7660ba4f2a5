"""Producer snapshots of a segment roll are written on a SerialWriter thread, not on
the caller's (the event loop's): a roll returns while the fsyncs are still pending,
and truncation, retention and close wait for them, so snapshots never outlive the
data they describe and keep their order. Real files, a real thread."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from broker.storage.log import Log
from broker.storage.log import LogConfig
from broker.storage.producer_state import snapshot_file_name
from protocol.record_batch import BatchBuilder
from runtime.fileio import SerialWriter

PID = 1000


def batch(seq: int, records: int = 3) -> bytes:
    builder = BatchBuilder(producer_id=PID, producer_epoch=0, base_sequence=seq)
    for i in range(records):
        builder.append(f"{PID}-0-{seq + i}".encode(), timestamp=1_700_000_000_000)
    return builder.build()


@pytest.fixture
def writer():
    w = SerialWriter("test-writer", max_pending=4)
    yield w
    w.close()


def _open(log_dir: Path, writer: SerialWriter) -> Log:
    config = LogConfig(segment_bytes=700, index_interval_bytes=0, retention_ms=-1)
    return Log.open(log_dir, config, had_clean_shutdown=True, writer=writer)


def _gate(writer: SerialWriter) -> threading.Event:
    """Park the writer thread until the returned event is set."""
    release = threading.Event()
    writer.submit(release.wait, 10)
    return release


def test_serial_writer_keeps_order_and_reports_failures(writer: SerialWriter) -> None:
    seen: list[int] = []
    futures = [writer.submit(seen.append, i) for i in range(3)]
    failing = writer.submit(int, "not a number")
    assert [f.result(5) for f in futures] == [None, None, None]
    assert seen == [0, 1, 2]
    with pytest.raises(ValueError):
        failing.result(5)


def test_serial_writer_is_bounded(writer: SerialWriter) -> None:
    release = _gate(writer)
    time.sleep(0.05)  # the gate is running: the queue is empty again
    for _ in range(4):
        writer.submit(lambda: None)
    blocked = threading.Thread(target=writer.submit, args=(lambda: None,))
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive(), "a fifth queued write should wait for room"
    release.set()
    blocked.join(5)
    assert not blocked.is_alive()


def test_a_roll_does_not_wait_for_the_snapshot_fsync(log_dir: Path, writer: SerialWriter) -> None:
    log = _open(log_dir, writer)
    release = _gate(writer)
    for i in range(12):  # rolls on the way; each queues a snapshot behind the gate
        log.append_as_leader(batch(3 * i), 0)
    assert len(log.segments) >= 2
    assert log.producer_state.snapshot_offsets() == []  # not written yet: the gate holds
    threading.Timer(0.2, release.set).start()
    started = time.monotonic()
    log.truncate_to(21)  # must wait for the queued snapshots before rolling state back
    assert time.monotonic() - started >= 0.1
    assert log.producer_state.snapshot_offsets() == [18]
    assert log.producer_state.entry(PID).last_seq == 20
    log.close(snapshot=True)
    assert (log_dir / snapshot_file_name(21)).exists()


def test_truncation_below_a_pending_snapshot_leaves_no_stale_file(
    log_dir: Path, writer: SerialWriter
) -> None:
    """Without the wait, the queued snapshot at 18 would be written after truncate_to(12)
    deleted the snapshots above 12, and describe data that is gone."""
    log = _open(log_dir, writer)
    release = _gate(writer)
    for i in range(8):
        log.append_as_leader(batch(3 * i), 0)
    threading.Timer(0.1, release.set).start()
    log.truncate_to(12)
    writer.submit(lambda: None).result(5)  # everything queued has run
    assert log.producer_state.snapshot_offsets() == []
    assert log.producer_state.entry(PID).last_seq == 11
    log.close(snapshot=False)
