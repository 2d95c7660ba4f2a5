"""A broker process under a low open-file limit (issue 20, item 5): open segment files
do not grow with the partition count, and running out of descriptors anyway fails
only the partitions that needed one, answered KAFKA_STORAGE_ERROR, never the broker.

Each partition's active segment is three files (.log, .index, .timeindex). The
broker runs under `prlimit --nofile=512`, so more than about 160 partitions with all
their files open would not fit.

Protection off (before the fix): every replica held its three files open for life;
the 400 partitions below need 1,200 descriptors, creating them hits EMFILE, the
data directory goes offline (or the metadata handler dies on the leader-epoch
checkpoint) and nothing is served.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from cluster import Cluster
from cluster import TestClient
from cluster import open_fds

from client.admin import AsyncAdmin
from protocol.errors import ErrorCode
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.record_batch import BatchBuilder
from protocol.records.batch_decoder import iter_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FILE_LIMIT = 512
LIMITED = ("prlimit", f"--nofile={FILE_LIMIT}:{FILE_LIMIT}", "--")


def value(topic: str, partition: int, round_: int, size: int = 0) -> bytes:
    return f"{topic}-{partition}-{round_}".encode().ljust(size, b".")


async def create_topic(
    client: TestClient, name: str, partitions: int, configs: dict[str, str] | None = None
) -> None:
    async with AsyncAdmin(f"{client.host}:{client.port}") as admin:
        await admin.create_topic(name, partitions, 1, configs)
    deadline = time.monotonic() + 30
    while True:
        md = await client.call(MetadataRequest(topics=[name]))
        assert isinstance(md, MetadataResponse)
        if md.topics[0].partitions and all(p.leader_id >= 0 for p in md.topics[0].partitions):
            return
        assert time.monotonic() < deadline, f"no leaders for {name}"
        await asyncio.sleep(0.1)


async def produce_round(
    client: TestClient, topic: str, partitions: int, round_: int, size: int = 0
) -> dict[int, int]:
    """One record to every partition in one request; the error code of each."""
    batches = []
    for partition in range(partitions):
        builder = BatchBuilder(base_timestamp=1_000 + round_)
        builder.append(value(topic, partition, round_, size), b"k", timestamp=1_000 + round_)
        batches.append(ProducePartition(index=partition, records=builder.build(0)))
    resp = await client.call(
        ProduceRequest(
            acks=1, timeout_ms=10_000, topics=[ProduceTopic(name=topic, partitions=batches)]
        ),
        timeout=30,
    )
    assert isinstance(resp, ProduceResponse)
    return {p.index: p.error_code for p in resp.topics[0].partitions}


async def read_all(client: TestClient, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """The values of every partition from offset 0 (one Fetch); errors fail the test."""
    resp = await client.call(
        FetchRequest(
            max_wait_ms=0,
            max_bytes=64 * 1024 * 1024,
            topics=[
                FetchTopic(
                    topic=topic,
                    partitions=[
                        FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=64 * 1024)
                        for p in range(partitions)
                    ],
                )
            ],
        ),
        timeout=30,
    )
    assert isinstance(resp, FetchResponse)
    out = {}
    for part in resp.responses[0].partitions:
        assert part.error_code == 0, (
            f"{topic}-{part.partition_index}: {ErrorCode(part.error_code).name}"
        )
        out[part.partition_index] = [r.value for _, r in iter_records(part.records)]
    return out


async def test_400_partitions_fit_in_512_descriptors(cluster: Cluster) -> None:
    partitions = 400
    cluster.start_controller()
    broker = cluster.start_broker(1, "--max-open-segment-files", "256", launcher=LIMITED)
    async with TestClient(*broker.address) as client:
        await create_topic(client, "many", partitions)
        for round_ in range(2):  # the second round reopens evicted files
            codes = await produce_round(client, "many", partitions, round_)
            assert set(codes.values()) == {0}, codes
            assert len(open_fds(broker.pid)) < FILE_LIMIT
        values = await read_all(client, "many", partitions)
    assert values == {p: [value("many", p, 0), value("many", p, 1)] for p in range(partitions)}
    assert broker.alive
    assert len(open_fds(broker.pid)) < FILE_LIMIT
    log_text = broker.log_text()
    assert "Too many open files" not in log_text and "offline" not in log_text


async def test_exhausted_descriptors_fail_partitions_not_the_broker(cluster: Cluster) -> None:
    """A cache larger than the limit allows: segment rolls (3 new files each) run out
    of descriptors; those partitions answer KAFKA_STORAGE_ERROR, the others and every
    read keep working, and the broker stays up and online."""
    partitions = 100
    cluster.start_controller()
    broker = cluster.start_broker(1, "--max-open-segment-files", "5000", launcher=LIMITED)
    broker.wait_for("leaves little of the open-file limit 512")
    async with TestClient(*broker.address) as client:
        # Every record fills a segment: each later round rolls every partition.
        await create_topic(client, "rolls", partitions, {"segment.bytes": "200"})
        assert set((await produce_round(client, "rolls", partitions, 0, 300)).values()) == {0}
        # 100 rolls need 300 more descriptors: some fit, the rest run out.
        codes = await produce_round(client, "rolls", partitions, 1, size=300)
        assert set(codes.values()) == {0, ErrorCode.KAFKA_STORAGE_ERROR}, codes
        values = await read_all(client, "rolls", partitions)
        assert all(values[p][0] == value("rolls", p, 0, 300) for p in range(partitions))
        md = await client.call(MetadataRequest(topics=["rolls"]))
        assert isinstance(md, MetadataResponse)
    assert broker.alive
    log_text = broker.log_text()
    assert "out of file descriptors" in log_text
    assert "is offline" not in log_text  # the disk is fine: the directory stays online


async def test_replica_created_once_descriptors_are_free(cluster: Cluster) -> None:
    """Every descriptor of the broker taken by idle connections while a topic is
    created: its replicas cannot be created (EMFILE). Once the connections close the
    broker creates them on its own (retried with backoff), no restart: produce and
    fetch work on every partition."""
    partitions = 20
    cluster.start_controller()
    broker = cluster.start_broker(1, "--max-open-segment-files", "64", launcher=LIMITED)
    async with (
        TestClient(*broker.address) as client,
        AsyncAdmin(f"{client.host}:{client.port}") as admin,
    ):
        await create_topic(client, "warmup", 1)  # the admin's connections are made
        hogs: list[asyncio.StreamWriter] = []
        try:
            deadline = time.monotonic() + 30
            # Connect until the broker accepts no more (its descriptors are all in use;
            # later connections wait in the listen backlog).
            while len(open_fds(broker.pid)) < FILE_LIMIT - 1:
                assert time.monotonic() < deadline, len(open_fds(broker.pid))
                for _ in range(FILE_LIMIT - len(open_fds(broker.pid))):
                    _, writer = await asyncio.open_connection(*broker.address)
                    hogs.append(writer)
                await asyncio.sleep(0.3)
            await admin.create_topic("later", partitions, 1)
            broker.wait_for(r"cannot open the log \(tried again later\)", timeout=30)
        finally:
            for writer in hogs:
                writer.close()
        # The replicas come back within the retry backoff once descriptors are free.
        deadline = time.monotonic() + 30
        while set((codes := await produce_round(client, "later", partitions, 0)).values()) != {0}:
            assert time.monotonic() < deadline, codes
            await asyncio.sleep(0.5)
        values = await read_all(client, "later", partitions)
    assert values[partitions - 1][-1] == value("later", partitions - 1, 0)
    assert broker.alive
