"""DescribeReplicaLog (always served, read-only), FaultControl in the served API set
only with test faults, and --unsafe-skip-fsync."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from broker_harness import Harness
from broker_harness import batch

from broker.config import BrokerConfig
from broker.faults import NO_FAULTS
from broker.faults import NoFsyncLogManager
from broker.faults import TestFaults
from broker.handlers import Handlers
from broker.server import base_log_config
from broker.storage.log_manager import LogManager
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import DescribeReplicaLogRequest
from protocol.messages import DescribeReplicaLogResponse
from protocol.messages import FaultControlRequest
from protocol.messages import FaultControlResponse
from protocol.messages import FaultRule
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceTopic
from protocol.record_batch import iter_headers
from runtime.server import RequestContext

CTX = RequestContext("PLAINTEXT", "127.0.0.1:1", "test", 0)


def handlers_for(h: Harness, faults=NO_FAULTS) -> Handlers:
    return Handlers(
        node_id=h.config.node_id,
        image=h.image,
        replica_manager=h.rm,
        controller=None,  # type: ignore[arg-type]  # not used by these APIs
        image_updated=asyncio.Condition(),
        faults=faults,
    )


async def produce(h: Harness, topic: str, *values: bytes) -> None:
    resp = await h.rm.produce(
        ProduceRequest(
            acks=1,
            topics=[
                ProduceTopic(
                    name=topic, partitions=[ProducePartition(index=0, records=batch(*values))]
                )
            ],
        )
    )
    assert resp.topics[0].partitions[0].error_code == 0, resp


@pytest.fixture
async def harness(tmp_path: Path):
    h = Harness(tmp_path / "b1", node_id=1)
    yield h
    await h.close()


async def describe(handlers: Handlers, **kwargs: object) -> DescribeReplicaLogResponse:
    kwargs.setdefault("topic", "t")
    kwargs.setdefault("partition", 0)
    resp = await handlers.describe_replica_log(CTX, DescribeReplicaLogRequest(**kwargs))  # type: ignore[arg-type]
    assert isinstance(resp, DescribeReplicaLogResponse)
    return resp


async def test_describe_replica_log_batches_and_epochs(harness: Harness) -> None:
    h = harness
    await h.create_topic("t")
    await produce(h, "t", b"a", b"b")
    await produce(h, "t", b"c")
    await h.set_partition("t", 0, leader=1, leader_epoch=3)
    await produce(h, "t", b"d", b"e", b"f")
    handlers = handlers_for(h)
    resp = await describe(handlers)
    assert resp.error_code == 0
    assert (resp.log_start_offset, resp.log_end_offset, resp.high_watermark) == (0, 6, 6)
    assert (resp.leader_id, resp.leader_epoch, resp.partition_epoch) == (1, 3, 3)
    assert resp.isr == [1]
    assert [(e.epoch, e.start_offset) for e in resp.epoch_entries] == [(0, 0), (3, 3)]
    got = [(b.base_offset, b.last_offset, b.leader_epoch) for b in resp.batches]
    assert got == [(0, 1, 0), (2, 2, 0), (3, 5, 3)]
    # CRC and size are the batch headers' own, as on disk.
    p = h.rm.partitions[("t", 0)]
    on_disk = p.log.read(0, 1 << 20)
    headers = [header for _, header in iter_headers(on_disk)]
    assert [(b.crc, b.size) for b in resp.batches] == [(x.crc, x.size) for x in headers]
    # Bounded, and the batches can be left out.
    assert len((await describe(handlers, max_batches=2)).batches) == 2
    assert (await describe(handlers, max_batches=-1)).batches == []
    bare = await describe(handlers, include_batches=False)
    assert bare.batches == [] and len(bare.epoch_entries) == 2


async def test_describe_replica_log_unknown_partition(harness: Harness) -> None:
    handlers = handlers_for(harness)
    resp = await describe(handlers, topic="nope")
    assert resp.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "nope-0" in (resp.error_message or "")
    await harness.create_topic("t")
    await harness.delete_topic("t")
    assert (await describe(handlers)).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_fault_control_served_only_with_test_faults(harness: Harness) -> None:
    plain = handlers_for(harness).table()
    assert int(ApiKey.FAULT_CONTROL) not in plain
    assert int(ApiKey.DESCRIBE_REPLICA_LOG) in plain
    faults = TestFaults(node_id=1, protections_off=("unsafe-ignore-leader-epoch",))
    handlers = handlers_for(harness, faults)
    table = handlers.table()
    assert int(ApiKey.FAULT_CONTROL) in table
    versions = await handlers.api_versions(CTX, None)  # type: ignore[arg-type]
    assert int(ApiKey.FAULT_CONTROL) in {k.api_key for k in versions.api_keys}
    resp = await table[int(ApiKey.FAULT_CONTROL)](
        CTX,
        FaultControlRequest(add_rules=[FaultRule(api_key=int(ApiKey.FETCH), action="drop")]),
    )
    assert isinstance(resp, FaultControlResponse) and resp.error_code == 0
    assert len(resp.rules) == 1 and resp.protections_off == ["unsafe-ignore-leader-epoch"]


def test_skip_fsync_keeps_the_recovery_point(tmp_path: Path, monkeypatch) -> None:
    config = base_log_config(BrokerConfig(node_id=1))
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))

    def append_and_flush(manager: LogManager) -> int:
        """Start `manager`, append two records to t-0 and flush it: its recovery point
        (the fsyncs of the flush are in `synced`)."""
        manager.startup()
        log_ = manager.get_or_create_log(("t", 0))
        log_.append_as_leader(batch(b"x", b"y"), 0)
        synced.clear()
        log_.flush()
        return log_.recovery_point

    plain = LogManager(tmp_path / "plain", config)
    assert append_and_flush(plain) == 2 and synced
    plain.shutdown()

    unsafe = NoFsyncLogManager(tmp_path / "unsafe", config)
    assert append_and_flush(unsafe) == 0 and synced == []
    unsafe.shutdown()
    # Logs found at start-up are disarmed as well.
    again = NoFsyncLogManager(tmp_path / "unsafe", config)
    again.startup()
    log_ = again.get_log(("t", 0))
    assert log_ is not None
    log_.append_as_leader(batch(b"z"), 0)
    before = log_.recovery_point
    log_.flush()
    assert log_.recovery_point == before < log_.log_end_offset
    again.shutdown()
