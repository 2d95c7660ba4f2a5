"""AllocateProducerIds (KIP-730): blocks never overlap, survive a restart (log replay
and snapshot), and a stale broker epoch is refused."""

from __future__ import annotations

from controller.handlers import PRODUCER_ID_BLOCK_SIZE
from controller.state import MetadataImage
from protocol.errors import ErrorCode
from protocol.messages import AllocateProducerIdsRequest
from protocol.messages import AllocateProducerIdsResponse
from protocol.metadata_records import ProducerIdsRecord


async def allocate(h, broker_id: int, epoch: int) -> AllocateProducerIdsResponse:
    req = AllocateProducerIdsRequest(broker_id=broker_id, broker_epoch=epoch)
    return await h.handlers.allocate_producer_ids(req)


async def test_blocks_are_disjoint_and_survive_restart(harness) -> None:
    h = harness
    e1 = (await h.register(1)).broker_epoch
    e2 = (await h.register(2)).broker_epoch
    a = await allocate(h, 1, e1)
    b = await allocate(h, 2, e2)
    assert (a.error_code, a.producer_id_start, a.producer_id_len) == (0, 0, PRODUCER_ID_BLOCK_SIZE)
    assert b.producer_id_start == PRODUCER_ID_BLOCK_SIZE
    assert h.image.next_producer_id == 2 * PRODUCER_ID_BLOCK_SIZE
    await h.reopen()
    assert h.image.next_producer_id == 2 * PRODUCER_ID_BLOCK_SIZE
    c = await allocate(h, 1, e1)
    assert c.producer_id_start == 2 * PRODUCER_ID_BLOCK_SIZE


async def test_stale_broker_epoch_is_refused(harness) -> None:
    h = harness
    epoch = (await h.register(1)).broker_epoch
    for broker_id, broker_epoch in ((1, epoch + 5), (9, 0)):
        resp = await allocate(h, broker_id, broker_epoch)
        assert resp.error_code == ErrorCode.STALE_BROKER_EPOCH and resp.producer_id_len == 0
    assert h.image.next_producer_id == 0


def test_snapshot_records_keep_the_next_producer_id() -> None:
    image = MetadataImage()
    image.apply(0, ProducerIdsRecord(broker_id=1, broker_epoch=0, next_producer_id=1000))
    records = image.snapshot_records()
    assert records[-1] == ProducerIdsRecord(broker_id=1, broker_epoch=0, next_producer_id=1000)
    copy = MetadataImage()
    copy.load_snapshot(0, records)
    assert copy.next_producer_id == 1000
