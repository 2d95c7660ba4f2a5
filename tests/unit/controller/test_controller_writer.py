"""The single writer: refusal of invariant-breaking records, fatal write errors,
ordering of concurrent changes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from controller.errors import InvariantViolation
from controller.errors import MetadataLogWriteError
from controller.metadata_log import MetadataLog
from controller.metadata_writer import MetadataWriter
from controller.state import MetadataImage
from protocol.metadata_records import ListenerInfo
from protocol.metadata_records import RegisterBrokerRecord
from protocol.metadata_records import TopicRecord


def reg(broker_id: int, epoch: int) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(
        broker_id=broker_id,
        broker_epoch=epoch,
        incarnation_id="i",
        listeners=[ListenerInfo(name="P", host="h", port=1)],
    )


async def test_invariant_breaking_records_are_never_written(tmp_path: Path) -> None:
    mlog, _ = MetadataLog.open(tmp_path)
    writer = MetadataWriter(mlog, MetadataImage(), snapshot_every=100)
    await writer.commit(lambda image: ([reg(1, image.next_offset)], None))
    with pytest.raises(InvariantViolation):
        # Epoch is not the record's offset: a bug in a handler, refused before the write.
        await writer.commit(lambda image: ([TopicRecord(name="t", topic_id="x"), reg(1, 0)], None))
    assert writer.image.last_offset == 0 and writer.image.topic_by_name("t") is None
    await writer.close()
    _, recovered = MetadataLog.open(tmp_path)
    assert [e.offset for e in recovered.entries] == [0]


async def test_write_failure_is_fatal(tmp_path: Path) -> None:
    mlog, _ = MetadataLog.open(tmp_path)
    fatal: list[str] = []
    writer = MetadataWriter(mlog, MetadataImage(), snapshot_every=100, on_fatal=fatal.append)
    os.close(mlog._fd)
    mlog._fd = os.open(os.devnull, os.O_RDONLY)
    with pytest.raises(MetadataLogWriteError):
        await writer.commit(lambda image: ([reg(1, image.next_offset)], None))
    assert fatal and "cannot write the metadata log" in fatal[0]
    assert writer.image.last_offset == -1  # nothing applied
    with pytest.raises(MetadataLogWriteError):
        await writer.commit(lambda image: ([], None))
    await writer.close()


async def test_concurrent_commits_get_ordered_offsets(tmp_path: Path) -> None:
    mlog, _ = MetadataLog.open(tmp_path)
    writer = MetadataWriter(mlog, MetadataImage(), snapshot_every=7)

    async def register(broker_id: int) -> int:
        def build(image: MetadataImage):
            return [reg(broker_id, image.next_offset)], image.next_offset

        return await writer.commit(build)

    epochs = await asyncio.wait_for(asyncio.gather(*(register(b) for b in range(20))), 10)
    assert sorted(epochs) == list(range(20))
    assert {b: writer.image.brokers[b].broker_epoch for b in range(20)} == dict(
        zip(range(20), epochs, strict=True)
    )
    await writer.close()


async def test_cancelled_caller_does_not_interrupt_the_append(tmp_path: Path) -> None:
    mlog, _ = MetadataLog.open(tmp_path)
    writer = MetadataWriter(mlog, MetadataImage(), snapshot_every=100)
    task = asyncio.create_task(writer.commit(lambda image: ([reg(1, image.next_offset)], None)))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await writer.close()  # waits for the shielded append
    assert writer.image.last_offset == 0
    _, recovered = MetadataLog.open(tmp_path)
    assert [e.offset for e in recovered.entries] == [0]
