"""The durable metadata log: append, replay, torn tails, corruption, snapshots."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from controller.errors import CorruptMetadataError
from controller.errors import InvariantViolation
from controller.metadata_log import MetadataLog
from controller.metadata_log import Recovered
from controller.metadata_log import encode_entry
from controller.metadata_log import log_file_name
from controller.metadata_log import snapshot_file_name
from protocol.messages import MetadataEntry
from protocol.messages.quorum_apis import as_change
from protocol.metadata_records import FenceBrokerRecord
from protocol.metadata_records import ListenerInfo
from protocol.metadata_records import PartitionRecord
from protocol.metadata_records import RegisterBrokerRecord
from protocol.metadata_records import TopicRecord


def register(offset: int, broker_id: int = 1) -> MetadataEntry:
    return MetadataEntry(
        offset=offset,
        record=RegisterBrokerRecord(
            broker_id=broker_id,
            broker_epoch=offset,
            incarnation_id=f"inc-{offset}",
            listeners=[ListenerInfo(name="PLAINTEXT", host="127.0.0.1", port=9092)],
        ),
    )


def entries(start: int, count: int) -> list[MetadataEntry]:
    return [register(start + i, broker_id=start + i) for i in range(count)]


async def write_log(directory: Path, batches: list[int]) -> list[MetadataEntry]:
    directory.mkdir(parents=True, exist_ok=True)
    mlog, _ = MetadataLog.open(directory)
    written: list[MetadataEntry] = []
    offset = mlog.next_offset
    for size in batches:
        batch = entries(offset, size)
        await mlog.append(batch)
        written.extend(batch)
        offset += size
    mlog.close()
    return written


def open_cut(
    tmp_path: Path, data: bytes, cut: int, caplog: pytest.LogCaptureFixture
) -> tuple[Path, MetadataLog, Recovered]:
    """A data dir whose only log file is `data` cut at byte `cut`, opened (warnings in
    `caplog`, cleared first)."""
    d = tmp_path / f"cut{cut}"
    d.mkdir()
    (d / log_file_name(0)).write_bytes(data[:cut])
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        mlog, recovered = MetadataLog.open(d)
    return d, mlog, recovered


async def test_append_and_replay(tmp_path: Path) -> None:
    written = await write_log(tmp_path, [1, 3, 2])
    mlog, recovered = MetadataLog.open(tmp_path)
    assert recovered.entries == written
    assert recovered.snapshot_offset == -1 and recovered.truncated_bytes == 0
    assert mlog.next_offset == 6
    # Appending continues the same file.
    await mlog.append(entries(6, 1))
    mlog.close()
    _, again = MetadataLog.open(tmp_path)
    assert [e.offset for e in again.entries] == list(range(7))
    assert sorted(p.name for p in tmp_path.iterdir()) == [log_file_name(0)]


async def test_append_refuses_offset_gaps(tmp_path: Path) -> None:
    mlog, _ = MetadataLog.open(tmp_path)
    with pytest.raises(InvariantViolation):
        await mlog.append(entries(1, 1))
    await mlog.append(entries(0, 2))
    with pytest.raises(InvariantViolation):
        await mlog.append(entries(1, 1))
    mlog.close()


async def test_torn_tail_cut_at_every_byte_of_last_entry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    written = await write_log(tmp_path / "orig", [2, 1])
    data = (tmp_path / "orig" / log_file_name(0)).read_bytes()
    last_len = len(encode_entry(written[-1]))
    start = len(data) - last_len
    for cut in range(start, len(data)):
        d, mlog, recovered = open_cut(tmp_path, data, cut, caplog)
        assert recovered.entries == written[:-1], cut
        assert mlog.next_offset == len(written) - 1
        assert (d / log_file_name(0)).stat().st_size == start
        if cut > start:
            assert recovered.truncated_bytes == cut - start
            assert "torn tail" in caplog.text
        # The cut log takes appends again at the right offset.
        await mlog.append([register(len(written) - 1, broker_id=99)])
        mlog.close()
        _, again = MetadataLog.open(d)
        assert [e.offset for e in again.entries] == list(range(len(written)))


async def test_crc_bad_last_entry_is_a_torn_tail(tmp_path: Path) -> None:
    written = await write_log(tmp_path, [3])
    path = tmp_path / log_file_name(0)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    _, recovered = MetadataLog.open(tmp_path)
    assert recovered.entries == written[:2]


async def test_zero_filled_tail_is_cut(tmp_path: Path) -> None:
    written = await write_log(tmp_path, [2])
    path = tmp_path / log_file_name(0)
    with path.open("ab") as f:
        f.write(b"\0" * 4096)
    _, recovered = MetadataLog.open(tmp_path)
    assert recovered.entries == written


async def test_crc_bad_entry_in_the_middle_refuses_to_start(tmp_path: Path) -> None:
    written = await write_log(tmp_path, [1, 1, 1])
    path = tmp_path / log_file_name(0)
    data = bytearray(path.read_bytes())
    first_len = len(encode_entry(written[0]))
    data[first_len + 12] ^= 0x01  # inside the second entry's payload
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptMetadataError, match=r"corrupt at byte .* valid entries follow"):
        MetadataLog.open(tmp_path)
    # Nothing was cut: the operator decides.
    assert path.read_bytes() == bytes(data)


async def test_bad_length_in_the_middle_refuses_to_start(tmp_path: Path) -> None:
    written = await write_log(tmp_path, [1, 1, 1])
    path = tmp_path / log_file_name(0)
    data = bytearray(path.read_bytes())
    first_len = len(encode_entry(written[0]))
    data[first_len : first_len + 4] = (2**31 - 1).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptMetadataError, match="invalid entry length"):
        MetadataLog.open(tmp_path)


async def test_offset_gap_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / log_file_name(0)
    path.write_bytes(encode_entry(register(0)) + encode_entry(register(2)))
    with pytest.raises(CorruptMetadataError, match=r"offset 2 .* where 1 was expected"):
        MetadataLog.open(tmp_path)


async def test_an_epoch_going_back_refuses_to_start_with_a_message(tmp_path: Path) -> None:
    """A CRC-valid entry of epoch 0 after entries of epoch 1: the controller died with
    a bare InvariantError traceback from the quorum log (found by a hostile-disk
    session); the replay now refuses it naming the file and the offset."""
    path = tmp_path / log_file_name(0)
    first, second = register(0), register(1, broker_id=2)
    first = MetadataEntry(offset=0, epoch=1, record=first.record)
    second = MetadataEntry(offset=1, epoch=0, record=second.record)
    path.write_bytes(encode_entry(first) + encode_entry(second))
    with pytest.raises(CorruptMetadataError, match=r"epoch 0 at offset 1 .* after one of epoch 1"):
        MetadataLog.open(tmp_path)


async def test_missing_first_file_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / log_file_name(5)).write_bytes(encode_entry(register(5)))
    with pytest.raises(CorruptMetadataError, match=r"missing offsets 0\.\.4"):
        MetadataLog.open(tmp_path)


async def test_snapshot_rolls_the_log_and_replays(tmp_path: Path) -> None:
    mlog, _ = MetadataLog.open(tmp_path)
    await mlog.append(entries(0, 3))
    records = [
        TopicRecord(name="t", topic_id="tid"),
        PartitionRecord(
            topic_id="tid",
            partition_id=0,
            replicas=[1],
            isr=[1],
            leader=1,
            leader_epoch=0,
            partition_epoch=0,
        ),
    ]
    await mlog.write_snapshot(2, records)
    await mlog.append(entries(3, 2))
    mlog.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [log_file_name(3), snapshot_file_name(2)]
    mlog, recovered = MetadataLog.open(tmp_path)
    assert recovered.snapshot_offset == 2
    assert recovered.snapshot_records == records
    assert [e.offset for e in recovered.entries] == [3, 4]
    assert mlog.next_offset == 5
    mlog.close()


async def test_crash_between_snapshot_and_roll(tmp_path: Path) -> None:
    """Snapshot renamed, old file not yet replaced: replay skips covered entries and
    starts a fresh file after the snapshot."""
    from controller.metadata_log import encode_snapshot

    await write_log(tmp_path, [3])
    (tmp_path / snapshot_file_name(2)).write_bytes(encode_snapshot(2, []))
    (tmp_path / (snapshot_file_name(7) + ".tmp")).write_bytes(b"half a snapshot")
    mlog, recovered = MetadataLog.open(tmp_path)
    assert recovered.snapshot_offset == 2 and recovered.entries == []
    assert mlog.next_offset == 3
    await mlog.append(entries(3, 1))
    mlog.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [log_file_name(3), snapshot_file_name(2)]


async def test_straddling_file_after_failed_roll(tmp_path: Path) -> None:
    from controller.metadata_log import encode_snapshot

    await write_log(tmp_path, [5])
    (tmp_path / snapshot_file_name(2)).write_bytes(encode_snapshot(2, []))
    mlog, recovered = MetadataLog.open(tmp_path)
    assert [e.offset for e in recovered.entries] == [3, 4]
    assert mlog.next_offset == 5
    mlog.close()


async def test_corrupt_snapshot_refuses_to_start(tmp_path: Path) -> None:
    from controller.metadata_log import encode_snapshot

    data = bytearray(encode_snapshot(4, [TopicRecord(name="t", topic_id="x")]))
    data[-2] ^= 0x10
    (tmp_path / snapshot_file_name(4)).write_bytes(bytes(data))
    with pytest.raises(CorruptMetadataError, match="CRC"):
        MetadataLog.open(tmp_path)


async def test_corrupt_older_file_refuses_to_start(tmp_path: Path) -> None:
    """Damage in a file that is not the last one is never a torn tail."""
    (tmp_path / log_file_name(0)).write_bytes(
        encode_entry(register(0)) + encode_entry(register(1))[:-3]
    )
    (tmp_path / log_file_name(2)).write_bytes(encode_entry(register(2)))
    with pytest.raises(CorruptMetadataError):
        MetadataLog.open(tmp_path)


async def test_append_failure_is_reported(tmp_path: Path) -> None:
    from controller.errors import MetadataLogWriteError

    mlog, _ = MetadataLog.open(tmp_path)
    os.close(mlog._fd)
    mlog._fd = os.open(os.devnull, os.O_RDONLY)  # writes now fail with EBADF
    with pytest.raises(MetadataLogWriteError, match="cannot write the metadata log"):
        await mlog.append(entries(0, 1))
    with pytest.raises(MetadataLogWriteError):
        await mlog.append(entries(0, 1))
    mlog.close()


# ------------------------------------------------------------------ format contract

# The exact bytes a single controller wrote before the quorum (commit 8e5136c): a log
# file with entries 2 and 3, and the snapshot as of offset 1. Entries had no epoch.
FIXTURE_LOG = bytes.fromhex(
    "0000005e52da1cc482a66f666673657402a67265636f726484a474797065a5746f706963a46e616d65a174"
    "a8746f7069635f6964b641414141414141414141414141414141414141414141a7636f6e6669677381ac72"
    "6574656e74696f6e2e6d73a4313030300000003c77133db282a66f666673657403a67265636f726483a4"
    "74797065ac66656e63655f62726f6b6572a962726f6b65725f696401ac62726f6b65725f65706f636807"
)
FIXTURE_SNAPSHOT = bytes.fromhex(
    "4d42534e41503031c0e3c8db82ab6c6173745f6f666673657401a77265636f7264739184a474797065a5"
    "746f706963a46e616d65a173a8746f7069635f6964b642424242424242424242424242424242424242424242"
    "a7636f6e6669677380"
)


async def test_a_log_written_before_the_quorum_opens_with_no_epoch(tmp_path: Path) -> None:
    """Upgrade path: the data dir of a single controller of an earlier build opens, its
    entries and snapshot with no quorum epoch (-1), and appends continue after them."""
    (tmp_path / snapshot_file_name(1)).write_bytes(FIXTURE_SNAPSHOT)
    (tmp_path / log_file_name(2)).write_bytes(FIXTURE_LOG)
    mlog, recovered = MetadataLog.open(tmp_path)
    assert recovered.snapshot_offset == 1 and recovered.snapshot_epoch == -1
    assert recovered.snapshot_records == [TopicRecord(name="s", topic_id="B" * 22)]
    assert recovered.entries == [
        MetadataEntry(
            offset=2,
            record=TopicRecord(name="t", topic_id="A" * 22, configs={"retention.ms": "1000"}),
            epoch=-1,
        ),
        MetadataEntry(offset=3, record=FenceBrokerRecord(broker_id=1, broker_epoch=7), epoch=-1),
    ]
    await mlog.append([MetadataEntry(offset=4, record=register(4).record, epoch=3)])
    mlog.close()
    _, again = MetadataLog.open(tmp_path)
    assert [(e.offset, e.epoch) for e in again.entries] == [(2, -1), (3, -1), (4, 3)]


# ------------------------------------------------------------------ quorum follower


async def test_truncate_cuts_the_diverging_suffix_across_files(tmp_path: Path) -> None:
    """A follower truncates to the largest common epoch: entries at and after the
    offset go (here across a snapshot's file roll), durably; appends continue there."""
    await write_log(tmp_path, [3])
    mlog, _ = MetadataLog.open(tmp_path)
    await mlog.write_snapshot(2, [], epoch=1)  # a new file starts at 3
    await mlog.append(entries(3, 4))  # 3..6
    await mlog.truncate(5)
    assert mlog.next_offset == 5
    await mlog.append([register(5, broker_id=50)])
    await mlog.truncate(3)  # the whole active file's content
    await mlog.append([register(3, broker_id=30)])
    mlog.close()
    reopened, recovered = MetadataLog.open(tmp_path)
    assert recovered.snapshot_offset == 2 and recovered.snapshot_epoch == 1
    assert recovered.entries == [register(3, broker_id=30)]
    assert reopened.next_offset == 4
    reopened.close()


async def test_install_replaces_the_whole_log_with_the_leaders_snapshot(tmp_path: Path) -> None:
    await write_log(tmp_path, [4])
    mlog, _ = MetadataLog.open(tmp_path)
    await mlog.install(9, [TopicRecord(name="x", topic_id="C" * 22)], epoch=5)
    assert mlog.next_offset == 10
    await mlog.append([register(10)])
    mlog.close()
    names = sorted(os.listdir(tmp_path))
    assert names == [log_file_name(10), snapshot_file_name(9)]
    _, recovered = MetadataLog.open(tmp_path)
    assert (recovered.snapshot_offset, recovered.snapshot_epoch) == (9, 5)
    assert recovered.snapshot_records == [TopicRecord(name="x", topic_id="C" * 22)]
    assert recovered.entries == [register(10)]


# ------------------------------------------------------------------ whole changes


async def test_a_change_the_log_ends_inside_of_is_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """KIP-868's atomicity on disk: a change (a topic and its partitions) is one write;
    a crash that left only its first entries on disk, even whole ones, must not bring
    back part of the change (a topic with some of its partitions)."""
    directory = tmp_path / "orig"
    directory.mkdir()
    mlog, _ = MetadataLog.open(directory)
    first = as_change(entries(0, 2))
    await mlog.append(first)
    change = as_change(entries(2, 4))
    await mlog.append(change)
    mlog.close()
    data = (directory / log_file_name(0)).read_bytes()
    first_change_end = sum(len(encode_entry(e)) for e in first)
    assert len(data) == first_change_end + sum(len(encode_entry(e)) for e in change)
    for cut in range(first_change_end + 1, len(data)):
        d, mlog, recovered = open_cut(tmp_path, data, cut, caplog)
        assert [e.offset for e in recovered.entries] == [0, 1], cut
        assert mlog.next_offset == 2
        assert (d / log_file_name(0)).stat().st_size == first_change_end
        assert recovered.truncated_bytes == cut - first_change_end
        assert "partial change" in caplog.text or "torn tail" in caplog.text
        mlog.close()
    # The whole change is kept, and the entries carry the mark they were written with.
    _, whole = MetadataLog.open(directory)
    assert [e.change_continues for e in whole.entries] == [True, False, True, True, True, False]


# A log of this format (KIP-868 marks): a two-entry change (a topic, a fence) then a
# one-entry change, quorum epoch 4, written by the build that introduced the marks.
FIXTURE_LOG_WITH_CHANGES = bytes.fromhex(
    "000000656b38152684a66f666673657400a67265636f726484a474797065a5746f706963a46e616d65a1"
    "77a8746f7069635f6964b643434343434343434343434343434343434343434343a7636f6e6669677380"
    "a565706f636804b06368616e67655f636f6e74696e756573c300000043fbab485083a66f666673657401"
    "a67265636f726483a474797065ac66656e63655f62726f6b6572a962726f6b65725f696402ac62726f6b"
    "65725f65706f636809a565706f63680400000043fb7c303883a66f666673657402a67265636f726483a4"
    "74797065ac66656e63655f62726f6b6572a962726f6b65725f696403ac62726f6b65725f65706f636809"
    "a565706f636804"
)


async def test_the_change_marks_fixture_opens_whole(tmp_path: Path) -> None:
    """The format with change marks is a contract too: its fixture opens with the marks,
    and cut inside its first change it opens as the empty log it was before."""
    (tmp_path / log_file_name(0)).write_bytes(FIXTURE_LOG_WITH_CHANGES)
    mlog, recovered = MetadataLog.open(tmp_path)
    mlog.close()
    assert [(e.offset, e.epoch, e.change_continues) for e in recovered.entries] == [
        (0, 4, True),
        (1, 4, False),
        (2, 4, False),
    ]
    assert recovered.entries[0].record == TopicRecord(name="w", topic_id="C" * 22)
    first_entry = 4 + 4 + 0x65
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / log_file_name(0)).write_bytes(FIXTURE_LOG_WITH_CHANGES[:first_entry])
    mlog, recovered = MetadataLog.open(cut)
    mlog.close()
    assert recovered.entries == [] and mlog.next_offset == 0
