"""The broker as a process: a real controller and one or two `python -m broker` on
127.0.0.1, spoken to over real sockets with protocol.connection.ClientConnection."""

from __future__ import annotations

import asyncio
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from cluster import BrokerProcess
from cluster import Cluster
from cluster import TestClient

from protocol.api import EARLIEST_TIMESTAMP
from protocol.api import LATEST_TIMESTAMP
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.framing import RequestHeader
from protocol.framing import encode_request_header
from protocol.framing import frame
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DeleteTopicsRequest
from protocol.messages import DeleteTopicsResponse
from protocol.messages import DescribeClusterRequest
from protocol.messages import DescribeClusterResponse
from protocol.messages import FetchResponse
from protocol.messages import InitProducerIdRequest
from protocol.messages import InitProducerIdResponse
from protocol.messages import ListOffsetsResponse
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import OffsetForLeaderEpochResponse
from protocol.messages import ProduceResponse
from protocol.record_batch import encode_batch
from protocol.record_batch import iter_headers
from protocol.record_batch import iter_records
from tests.one_partition import fetch_request
from tests.one_partition import list_offsets_request
from tests.one_partition import offsets_for_epoch_request
from tests.one_partition import produce_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def cluster(cluster: Cluster) -> Cluster:
    """conftest's cluster with its controller started."""
    cluster.start_controller()
    return cluster


def batch(*values: bytes, timestamp: int | None = None) -> bytes:
    return encode_batch([(None, v, (), timestamp) for v in values])


async def create_topic(
    client: TestClient, name: str, partitions: int = 1, **configs: str
) -> MetadataResponse:
    """Create `name` and wait until every partition has a leader (its metadata then)."""
    resp = await client.call(
        CreateTopicsRequest(
            topics=[
                CreatableTopic(
                    name=name, num_partitions=partitions, replication_factor=1, configs=configs
                )
            ]
        )
    )
    assert isinstance(resp, CreateTopicsResponse)
    assert resp.topics[0].error_code == 0, resp.topics[0].error_message
    return await wait_for_leaders(client, name)


async def wait_for_leaders(
    client: TestClient, topic: str, *, min_epoch: int = 0, timeout: float = 20.0
) -> MetadataResponse:
    """Metadata until every partition of `topic` has a leader at >= min_epoch."""
    deadline = time.monotonic() + timeout
    while True:
        md = await client.call(MetadataRequest(topics=[topic]))
        assert isinstance(md, MetadataResponse)
        t = md.topics[0]
        if (
            t.error_code == 0
            and t.partitions
            and all(p.leader_id >= 0 and p.leader_epoch >= min_epoch for p in t.partitions)
        ):
            return md
        if time.monotonic() > deadline:
            raise AssertionError(f"no leaders for {topic} at epoch >= {min_epoch}: {md}")
        await asyncio.sleep(0.1)


async def produce(client: TestClient, topic: str, records: bytes, **options: Any):
    """The partition's answer to produce_request(**options) (acks 1 unless given)."""
    request = produce_request(topic, records, **{"acks": 1, "timeout_ms": 5000, **options})
    resp = await client.call(request)
    assert isinstance(resp, ProduceResponse)
    return resp.topics[0].partitions[0]


async def fetch(client: TestClient, topic: str, offset: int, **options: Any):
    """The partition's answer to fetch_request(**options) (no wait unless given)."""
    request = fetch_request(topic, offset, **{"max_wait_ms": 0, **options})
    resp = await client.call(request)
    assert isinstance(resp, FetchResponse)
    return resp.responses[0].partitions[0]


async def list_offset(client: TestClient, topic: str, ts: int, *, epoch: int = -1):
    resp = await client.call(list_offsets_request(topic, ts, epoch=epoch))
    assert isinstance(resp, ListOffsetsResponse)
    return resp.topics[0].partitions[0]


async def offsets_for_epoch(client: TestClient, topic: str, leader_epoch: int, *, epoch: int = -1):
    resp = await client.call(offsets_for_epoch_request(topic, leader_epoch, epoch=epoch))
    assert isinstance(resp, OffsetForLeaderEpochResponse)
    return resp.topics[0].partitions[0]


def values(records: bytes) -> list[bytes | None]:
    return [rec.value for _, rec in iter_records(records)]


# ---------------------------------------------------------------------- the data path


async def test_single_broker_serves_the_data_path(cluster: Cluster) -> None:
    broker = cluster.start_broker(1)
    # runtime/allocator.py: the process keeps freed memory for its 1 MiB buffers.
    kept = "the allocator keeps up to 67108864 bytes of freed memory for reuse"
    assert kept in broker.log_path.read_text()
    async with TestClient(*broker.address) as client:
        versions = await client.call(ApiVersionsRequest())
        assert isinstance(versions, ApiVersionsResponse)
        served = {k.api_key for k in versions.api_keys}
        assert {ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.OFFSET_FOR_LEADER_EPOCH} <= served
        assert ApiKey.INIT_PRODUCER_ID in served  # idempotent producers (issue 4)
        first = await client.call(InitProducerIdRequest())
        second = await client.call(InitProducerIdRequest())
        assert isinstance(first, InitProducerIdResponse)
        assert isinstance(second, InitProducerIdResponse)
        assert first.error_code == second.error_code == ErrorCode.NONE
        assert (first.producer_epoch, second.producer_id) == (0, first.producer_id + 1)

        md = await create_topic(client, "orders", partitions=2)
        assert [(b.node_id, b.host, b.port) for b in md.brokers] == [(1, *broker.address)]
        assert all(p.leader_id == 1 and p.isr_nodes == [1] for p in md.topics[0].partitions)
        epoch = md.topics[0].partitions[0].leader_epoch

        now = int(time.time() * 1000)
        r0 = await produce(client, "orders", batch(b"a", b"b", timestamp=now - 2000), epoch=epoch)
        r1 = await produce(client, "orders", batch(b"c", timestamp=now - 1000), acks=-1)
        r2 = await produce(client, "orders", batch(b"d", timestamp=now), acks=0)
        assert (r0.error_code, r1.error_code, r2.error_code) == (0, 0, 0)
        assert (r0.base_offset, r1.base_offset, r2.base_offset) == (0, 2, 3)
        assert (r0.current_leader.leader_id, r0.current_leader.leader_epoch) == (1, epoch)
        other = await produce(client, "orders", batch(b"p1"), index=1)
        assert (other.error_code, other.base_offset) == (0, 0)

        f = await fetch(client, "orders", 0, epoch=epoch)
        assert f.error_code == 0 and f.high_watermark == 4
        assert values(f.records) == [b"a", b"b", b"c", b"d"]
        assert {h.partition_leader_epoch for _, h in iter_headers(f.records)} == {epoch}
        f = await fetch(client, "orders", 2, last_epoch=epoch)
        assert values(f.records) == [b"c", b"d"] and f.diverging_epoch.epoch == -1

        earliest = await list_offset(client, "orders", EARLIEST_TIMESTAMP, epoch=epoch)
        latest = await list_offset(client, "orders", LATEST_TIMESTAMP, epoch=epoch)
        by_time = await list_offset(client, "orders", now - 1500)
        assert (earliest.offset, earliest.leader_epoch) == (0, epoch)
        assert (latest.offset, latest.leader_epoch) == (4, epoch)
        assert (by_time.offset, by_time.leader_epoch) == (2, epoch)
        eo = await offsets_for_epoch(client, "orders", epoch, epoch=epoch)
        assert (eo.error_code, eo.leader_epoch, eo.end_offset) == (0, epoch, 4)

        # Long-poll: a fetch at the end waits for the next produce.
        waiting = asyncio.create_task(fetch(client, "orders", 4, max_wait_ms=5000))
        async with TestClient(*broker.address) as producer:
            await asyncio.sleep(0.1)
            assert not waiting.done()
            await produce(producer, "orders", batch(b"e"))
        assert values((await asyncio.wait_for(waiting, 5)).records) == [b"e"]

        cluster_info = await client.call(DescribeClusterRequest())
        assert isinstance(cluster_info, DescribeClusterResponse)
        assert [b.broker_id for b in cluster_info.brokers] == [1]

        deleted = await client.call(DeleteTopicsRequest(topic_names=["orders"]))
        assert isinstance(deleted, DeleteTopicsResponse)
        assert deleted.responses[0].error_code == 0
        md = await client.call(MetadataRequest(topics=["orders"]))
        assert isinstance(md, MetadataResponse)
        assert md.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        unknown = await produce(client, "orders", batch(b"x"))
        assert unknown.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert not (broker.data_dir / "orders-0").exists()


async def test_leader_epoch_fencing(cluster: Cluster) -> None:
    broker = cluster.start_broker(1)
    async with TestClient(*broker.address) as client:
        md = await create_topic(client, "t")
        epoch = md.topics[0].partitions[0].leader_epoch
        await produce(client, "t", batch(b"x"))
        cases = {
            -1: ErrorCode.NONE,
            epoch: ErrorCode.NONE,
            epoch + 1: ErrorCode.UNKNOWN_LEADER_EPOCH,
        }
        if epoch > 0:
            cases[epoch - 1] = ErrorCode.FENCED_LEADER_EPOCH
        for client_epoch, expected in cases.items():
            assert (
                await produce(client, "t", batch(b"y"), epoch=client_epoch)
            ).error_code == expected
            assert (await fetch(client, "t", 0, epoch=client_epoch)).error_code == expected
            lo = await list_offset(client, "t", LATEST_TIMESTAMP, epoch=client_epoch)
            assert lo.error_code == expected
            eo = await offsets_for_epoch(client, "t", epoch, epoch=client_epoch)
            assert eo.error_code == expected
        if epoch == 0:
            # The first leader epoch is 0: restart to get an older epoch to send.
            cluster.brokers[1].terminate()
            cluster.start_broker(1)
            async with TestClient(*broker.address) as again:
                md = await wait_for_leaders(again, "t", min_epoch=1)
                new_epoch = md.topics[0].partitions[0].leader_epoch
                r = await produce(again, "t", batch(b"z"), epoch=new_epoch - 1)
                assert r.error_code == ErrorCode.FENCED_LEADER_EPOCH
                assert r.current_leader.leader_epoch == new_epoch
                f = await fetch(again, "t", 0, epoch=new_epoch - 1)
                assert f.error_code == ErrorCode.FENCED_LEADER_EPOCH


# ---------------------------------------------------------------------- crashes


async def test_kill_9_keeps_acknowledged_records_and_bumps_the_epoch(cluster: Cluster) -> None:
    broker = cluster.start_broker(1)
    async with TestClient(*broker.address) as client:
        md = await create_topic(client, "durable")
        first_epoch = md.topics[0].partitions[0].leader_epoch
        acked: list[bytes] = []
        for i in range(50):
            value = f"v{i}".encode()
            r = await produce(
                client, "durable", batch(value, value + b"!"), acks=-1 if i % 2 else 1
            )
            assert r.error_code == 0
            acked += [value, value + b"!"]

    broker.kill()  # kill -9: no clean-shutdown marker, no final checkpoints
    assert not (broker.data_dir / ".clean-shutdown").exists()
    restarted = cluster.start_broker(1)
    assert "unclean shutdown" in restarted.log_text()
    async with TestClient(*restarted.address) as client:
        md = await wait_for_leaders(client, "durable", min_epoch=first_epoch + 1)
        new_epoch = md.topics[0].partitions[0].leader_epoch
        assert new_epoch > first_epoch
        f = await fetch(client, "durable", 0, epoch=new_epoch)
        assert f.error_code == 0
        assert values(f.records) == acked
        r = await produce(client, "durable", batch(b"after"), epoch=new_epoch)
        assert (r.error_code, r.base_offset) == (0, len(acked))
        f = await fetch(client, "durable", len(acked))
        assert [h.partition_leader_epoch for _, h in iter_headers(f.records)] == [new_epoch]
        eo = await offsets_for_epoch(client, "durable", first_epoch)
        assert (eo.leader_epoch, eo.end_offset) == (first_epoch, len(acked))
    lines = (restarted.data_dir / "durable-0" / "leader-epoch-checkpoint").read_text().splitlines()
    entries = [tuple(map(int, line.split())) for line in lines[2:]]
    assert (first_epoch, 0) in entries
    assert (new_epoch, len(acked)) in entries
    assert int(lines[1]) == len(entries)


async def test_sigterm_is_a_clean_shutdown(cluster: Cluster) -> None:
    broker = cluster.start_broker(1)
    async with TestClient(*broker.address) as client:
        await create_topic(client, "t")
        await produce(client, "t", batch(b"x"))
    assert broker.terminate() == 0
    assert (broker.data_dir / ".clean-shutdown").exists()
    assert "controlled shutdown acknowledged" in broker.log_text()
    # Its first start had no shutdown before it, clean or not.
    assert "(a new, empty data directory)" in broker.log_text()
    assert "unclean shutdown" not in broker.log_text()
    hw = (broker.data_dir / "replication-offset-checkpoint").read_text()
    assert "t 0 1" in hw
    restarted = cluster.start_broker(1)
    assert "after a clean shutdown" in restarted.log_text()


async def test_topic_deleted_while_down_is_removed_at_restart(cluster: Cluster) -> None:
    b1 = cluster.start_broker(1)
    b2 = cluster.start_broker(2)
    async with TestClient(*b1.address) as client:
        md = await create_topic(client, "spread", partitions=4)
        assert {b.node_id: (b.host, b.port) for b in md.brokers} == {
            1: b1.address,
            2: b2.address,
        }
        leaders = {p.partition_index: p.leader_id for p in md.topics[0].partitions}
        assert set(leaders.values()) == {1, 2}
        on_2 = next(i for i, leader in leaders.items() if leader == 2)
        r = await produce(client, "spread", batch(b"x"), index=on_2)
        assert r.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert r.current_leader.leader_id == 2
    async with TestClient(*b2.address) as client2:
        # Broker 1 knowing the leaders does not mean broker 2 has applied them yet:
        # until it has, it answers UNKNOWN_TOPIC_OR_PARTITION (retriable), as Kafka does.
        deadline = time.monotonic() + 10
        while (
            r := await produce(client2, "spread", batch(b"x"), index=on_2)
        ).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert r.error_code == 0, r
    assert (b2.data_dir / f"spread-{on_2}").exists()
    assert b2.terminate() == 0
    async with TestClient(*b1.address) as client:
        deleted = await client.call(DeleteTopicsRequest(topic_names=["spread"]))
        assert isinstance(deleted, DeleteTopicsResponse)
        assert deleted.responses[0].error_code == 0
    b2 = cluster.start_broker(2)
    # Deleted as a deletion always is: renamed aside, then removed in the background,
    # which may finish just after the broker says it is up.
    deadline = time.monotonic() + 10
    while any(p.name.startswith("spread-") for p in b2.data_dir.iterdir()):
        assert time.monotonic() < deadline, sorted(p.name for p in b2.data_dir.iterdir())
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------- bad input


async def test_bad_input_never_takes_the_broker_down(cluster: Cluster) -> None:
    broker = cluster.start_broker(1)
    host, port = broker.address
    async with TestClient(host, port) as healthy:
        await create_topic(healthy, "t")

        async def raw(data: bytes) -> bytes:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(data)
            await writer.drain()
            try:
                return await asyncio.wait_for(reader.read(1 << 16), 5)
            finally:
                writer.close()

        # A small frame of random bytes: an error response or a closed connection.
        for _ in range(5):
            answer = await raw(struct.pack(">i", 16) + os.urandom(16))
            assert answer == b"" or struct.unpack(">h", answer[8:10])[0] != 0
        assert await raw(struct.pack(">i", 2**31 - 1) + b"x" * 100) == b""  # "2 GiB" frame
        body = b"\x80"
        unknown = await raw(frame(encode_request_header(RequestHeader(999, 0, 5, "t")) + body))
        assert struct.unpack(">ih", unknown[4:10]) == (5, ErrorCode.INVALID_REQUEST)
        version = await raw(
            frame(encode_request_header(RequestHeader(int(ApiKey.FETCH), 42, 6, "t")) + body)
        )
        assert struct.unpack(">ih", version[4:10]) == (6, ErrorCode.UNSUPPORTED_VERSION)
        garbage_body = await raw(
            frame(encode_request_header(RequestHeader(int(ApiKey.PRODUCE), 0, 7, "t")) + b"\xc1")
        )
        assert struct.unpack(">ih", garbage_body[4:10]) == (7, ErrorCode.INVALID_REQUEST)

        bad = bytearray(batch(b"payload"))
        bad[-3] ^= 0x55
        r = await produce(healthy, "t", bytes(bad))
        assert r.error_code == ErrorCode.CORRUPT_MESSAGE and "CRC" in (r.error_message or "")
        r = await produce(healthy, "t", b"not a batch at all, just bytes")
        assert r.error_code == ErrorCode.CORRUPT_MESSAGE

        # The broker and the other connection are fine.
        assert (await produce(healthy, "t", batch(b"ok"))).error_code == 0
        assert values((await fetch(healthy, "t", 0)).records) == [b"ok"]
    assert broker.alive
    assert "malformed request stream" in broker.log_text()


# ---------------------------------------------------------------------- start-up errors


def _failed_start(cluster: Cluster, node_id: int, *extra: str) -> tuple[int, str]:
    proc = cluster.start_broker(node_id, *extra, wait=False)
    code = proc.wait_exit(60)
    return code, proc.log_text()


async def test_startup_errors_are_one_clear_line(cluster: Cluster, tmp_path: Path) -> None:
    running = cluster.start_broker(1)

    # The port of a running broker.
    code, text = _failed_start(cluster, 2, "--listeners", f"PLAINTEXT://127.0.0.1:{running.port}")
    assert code == 1 and "port in use" in text and "Traceback" not in text
    del cluster.brokers[2]

    # The data directory of a running broker.
    proc = BrokerProcess(name="dup", args=cluster.broker_args(1, 0), log_path=tmp_path / "dup.log")
    proc.start()
    assert proc.wait_exit(60) == 1
    assert "in use by another broker" in proc.log_text()

    # Nobody at the controller address, with a short bounded retry.
    proc = BrokerProcess(
        name="lonely",
        args=[
            *cluster.broker_args(3, 0),
            "--controller",
            "127.0.0.1:1",
            "--controller-connect-timeout-ms",
            "1000",
        ],
        log_path=tmp_path / "lonely.log",
    )
    start = time.monotonic()
    proc.start()
    assert proc.wait_exit(60) == 1
    assert time.monotonic() - start < 30
    assert "unreachable for 1s" in proc.log_text()

    # Another cluster's data directory.
    other = tmp_path / "broker-4"
    other.mkdir()
    (other / "meta.properties").write_text("version=1\nnode.id=4\ncluster.id=someoneElse\n")
    code, text = _failed_start(cluster, 4)
    assert code == 1 and "cluster id mismatch" in text and "someoneElse" in text

    # A corrupt checkpoint file.
    corrupt = tmp_path / "broker-5"
    corrupt.mkdir()
    (corrupt / "replication-offset-checkpoint").write_text("0\n3\nt 0 1\n")
    code, text = _failed_start(cluster, 5)
    assert code == 1 and "replication-offset-checkpoint" in text and "Traceback" not in text

    # meta.properties that cannot be read (a directory in its place; EIO and EACCES
    # take the same path): one line naming it, no traceback (a hostile-disk session
    # found an IsADirectoryError traceback).
    unreadable = tmp_path / "broker-7"
    (unreadable / "meta.properties").mkdir(parents=True)
    code, text = _failed_start(cluster, 7)
    assert code == 1 and "cannot read meta.properties" in text and "Traceback" not in text

    # A bad flag: click's usage error, exit 2.
    proc = BrokerProcess(
        name="badflag",
        args=[*cluster.broker_args(6, 0), "--listeners", "nonsense"],
        log_path=tmp_path / "badflag.log",
    )
    proc.start()
    assert proc.wait_exit(60) == 2
    assert "NAME://HOST:PORT" in proc.log_text()
    assert running.alive


# ---------------------------------------------------------------------- listeners


async def test_metadata_answers_with_the_listener_of_the_request(cluster: Cluster) -> None:
    broker = cluster.start_broker(
        1,
        "--listeners",
        "PLAINTEXT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        "--advertised-listeners",
        "PLAINTEXT://localhost:0,INTERNAL://127.0.0.1:0",
    )
    started = broker.wait_for(
        r"listeners PLAINTEXT://127.0.0.1:(\d+), INTERNAL://127.0.0.1:(\d+) "
        r"\(advertised PLAINTEXT://localhost:(\d+), INTERNAL://127.0.0.1:(\d+)\)"
    )
    plain, internal = int(started[1]), int(started[2])
    assert (int(started[3]), int(started[4])) == (plain, internal)
    async with TestClient("127.0.0.1", plain) as client:
        md = await client.call(MetadataRequest())
        assert isinstance(md, MetadataResponse)
        assert [(b.host, b.port) for b in md.brokers] == [("localhost", plain)]
    async with TestClient("127.0.0.1", internal) as client:
        md = await client.call(MetadataRequest())
        assert isinstance(md, MetadataResponse)
        assert [(b.host, b.port) for b in md.brokers] == [("127.0.0.1", internal)]


async def test_broker_rides_out_a_controller_restart(cluster: Cluster) -> None:
    broker = cluster.start_broker(1)
    async with TestClient(*broker.address) as client:
        await create_topic(client, "before")
        await produce(client, "before", batch(b"1"))
        assert cluster.controller is not None
        assert cluster.controller.terminate() == 0
        # The data path does not need the controller.
        assert (await produce(client, "before", batch(b"2"))).error_code == 0
        cluster.start_controller()
        await create_topic(client, "after")
        assert (await produce(client, "after", batch(b"3"))).error_code == 0
        assert values((await fetch(client, "before", 0)).records) == [b"1", b"2"]
    assert broker.alive
