"""The durable metadata log: append, replay, torn tails, corruption, snapshots."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from controller.errors import CorruptMetadataError
from controller.errors import InvariantViolation
from controller.metadata_log import MetadataLog
from controller.metadata_log import encode_entry
from controller.metadata_log import log_file_name
from controller.metadata_log import snapshot_file_name
from protocol.messages import MetadataEntry
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
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / log_file_name(0)).write_bytes(data[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            mlog, recovered = MetadataLog.open(d)
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
