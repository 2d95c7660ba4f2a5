"""AsyncAdmin.cluster_health and describe_replica_log against in-test brokers: which
view is evaluated, probing, unreachable brokers and controllers as verdicts (not
exceptions), and the errors of DescribeReplicaLog."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from client_fakes import REPLICA_LOG_NUMBERS
from client_fakes import FakeBroker

from client.admin import AsyncAdmin
from client.admin import EpochEntry
from client.admin import ReplicaBatch
from client.errors import MinibrokerError
from client.errors import UnknownTopicOrPartitionError
from client.health import BROKERS_DOWN
from client.health import CONTROLLER_UNREACHABLE
from client.health import LEADERLESS_PARTITIONS
from client.health import NO_BROKER_REACHABLE
from client.health import SOURCE_BROKER
from client.health import SOURCE_CONTROLLER
from client.health import render_text
from protocol.connection import RejectedRequest
from protocol.connection import ServerConnection
from protocol.errors import ErrorCode
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import DescribeClusterBroker
from protocol.messages import DescribeClusterRequest
from protocol.messages import DescribeClusterResponse
from protocol.messages import DescribeLogDirsRequest
from protocol.messages import DescribeQuorumRequest
from protocol.messages import DescribeQuorumResponse
from protocol.messages import DescribeReplicaLogRequest
from protocol.messages import DescribeReplicaLogResponse
from protocol.messages import EpochStartOffset
from protocol.messages import MetadataPartition
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import MetadataTopic
from protocol.messages import QuorumVoterState
from protocol.messages import ReplicaBatchInfo
from protocol.messages import StrayReplica


def dead_address() -> tuple[str, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1", s.getsockname()[1]


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    b = FakeBroker(node_id=1)
    b.overrides[ApiVersionsRequest] = lambda _r: ApiVersionsResponse()
    await b.start()
    b.create_topic("t", 2)
    try:
        yield b
    finally:
        await b.stop()


def describe_cluster_with(broker: FakeBroker, *others: DescribeClusterBroker):
    def answer(_req: DescribeClusterRequest) -> DescribeClusterResponse:
        own = DescribeClusterBroker(broker_id=broker.node_id, host=broker.host, port=broker.port)
        return DescribeClusterResponse(
            cluster_id="fake", controller_id=1, brokers=[own, *others], metadata_offset=7
        )

    return answer


async def test_healthy_from_a_broker(broker: FakeBroker) -> None:
    admin = AsyncAdmin(broker.address, bootstrap_retries=1)
    try:
        h = await admin.cluster_health()
    finally:
        await admin.close()
    assert h.healthy, h
    assert h.source == SOURCE_BROKER and h.controller_reachable is None
    assert h.brokers == h.live_brokers == (1,)
    assert (h.topic_count, h.partition_count) == (1, 2)
    assert len(broker.requests_of(DescribeLogDirsRequest)) == 1  # the probe
    assert h.stray_replicas == ()


async def test_a_dead_unfenced_broker_and_a_fenced_one_are_down(broker: FakeBroker) -> None:
    host, port = dead_address()
    broker.overrides[DescribeClusterRequest] = describe_cluster_with(
        broker,
        DescribeClusterBroker(broker_id=2, host=host, port=port),
        DescribeClusterBroker(broker_id=3, host=host, port=port, is_fenced=True),
    )
    async with AsyncAdmin(broker.address) as admin:
        h = await admin.cluster_health()
        assert h.unhealthy_reasons == (BROKERS_DOWN,)
        assert (h.unreachable_brokers, h.fenced_brokers, h.live_brokers) == ((2,), (3,), (1,))
        assert any(e.startswith("broker 2: ") for e in h.errors), h.errors
        unprobed = await admin.cluster_health(probe_brokers=False)
        assert unprobed.unreachable_brokers == () and unprobed.down_brokers == (3,)


async def test_the_controller_view_wins_when_it_answers(broker: FakeBroker) -> None:
    controller = FakeBroker(node_id=0)
    await controller.start()
    # A single controller: a quorum of one, its own leader (as controller/ answers).
    controller.overrides[DescribeQuorumRequest] = lambda _r: DescribeQuorumResponse(
        node_id=0,
        role="leader",
        leader_id=0,
        leader_epoch=1,
        high_watermark=9,
        log_end_offset=9,
        voters=[
            QuorumVoterState(
                replica_id=0, log_end_offset=9, last_fetch_ms_ago=0, host="0.0.0.0", port=1
            )
        ],
    )
    controller.overrides[DescribeClusterRequest] = lambda _r: DescribeClusterResponse(
        cluster_id="fake",
        controller_id=0,
        brokers=[DescribeClusterBroker(broker_id=1, host="10.255.255.1", port=1)],
        metadata_offset=9,
    )
    # The broker's image still has a leader; the controller has moved on.
    controller.overrides[MetadataRequest] = lambda _r: MetadataResponse(
        controller_id=0,
        topics=[
            MetadataTopic(
                name="t",
                partitions=[
                    MetadataPartition(
                        partition_index=0, leader_id=-1, replica_nodes=[1], isr_nodes=[1]
                    )
                ],
            )
        ],
    )
    try:
        async with AsyncAdmin(broker.address) as admin:
            h = await admin.cluster_health(controller=controller.address)
    finally:
        await controller.stop()
    assert h.source == SOURCE_CONTROLLER and h.controller_reachable is True
    assert (h.controller_id, h.metadata_offset) == (0, 9)
    # Reached where it was asked, though it lists itself at a wildcard address.
    assert h.controller_address == controller.address
    assert h.quorum is not None and (h.quorum.leader_id, h.quorum.down_voters) == (0, ())
    (voter,) = h.quorum.voters
    assert (voter.address, voter.role, voter.lag) == (controller.address, "leader", 0)
    assert h.unhealthy_reasons == (LEADERLESS_PARTITIONS,)
    # Probed at the address the broker gave, not the controller's (unroutable) one.
    assert h.unreachable_brokers == ()
    assert not controller.requests_of(DescribeLogDirsRequest)


async def test_stray_replicas_are_reported_without_making_the_cluster_unhealthy(
    broker: FakeBroker,
) -> None:
    broker.strays = [
        StrayReplica(
            dir_name="ghost-0.0123456789abcdef0123456789abcdef-stray",
            topic="ghost",
            partition=0,
            topic_id="G1",
            size_bytes=1234,
        )
    ]
    async with AsyncAdmin(broker.address) as admin:
        h = await admin.cluster_health()
    assert h.healthy and h.unhealthy_reasons == ()
    (stray,) = h.stray_replicas
    assert (stray.broker, stray.topic, stray.partition, stray.size_bytes) == (1, "ghost", 0, 1234)
    assert h.to_dict()["stray_replicas"] == [
        {
            "broker": 1,
            "dir_name": "ghost-0.0123456789abcdef0123456789abcdef-stray",
            "topic": "ghost",
            "partition": 0,
            "topic_id": "G1",
            "size_bytes": 1234,
        }
    ]
    (line,) = [x for x in render_text(h).splitlines() if x.startswith("Stray replicas (1):")]
    assert line.endswith(" [1:ghost-0.0123456789abcdef0123456789abcdef-stray]")


async def test_an_unreachable_controller_is_a_verdict(broker: FakeBroker) -> None:
    host, port = dead_address()
    async with AsyncAdmin(broker.address) as admin:
        h = await admin.cluster_health(controller=f"{host}:{port}")
    assert h.unhealthy_reasons == (CONTROLLER_UNREACHABLE,)
    assert h.source == SOURCE_BROKER and h.controller_reachable is False
    assert h.controller_address == f"{host}:{port}"
    assert any(e.startswith(f"controller {host}:{port}: ") for e in h.errors)


async def test_no_broker_reachable_is_a_verdict() -> None:
    host, port = dead_address()
    admin = AsyncAdmin(f"{host}:{port}", bootstrap_retries=1)
    try:
        h = await admin.cluster_health()
    finally:
        await admin.close()
    assert not h.healthy and h.unhealthy_reasons == (NO_BROKER_REACHABLE,)
    assert h.errors and h.errors[0].startswith(f"brokers: no broker reachable at {host}:{port}")


# ------------------------------------------------------------------ DescribeReplicaLog


REPLICA = DescribeReplicaLogResponse(
    **REPLICA_LOG_NUMBERS,
    isr=[1, 2],
    epoch_entries=[
        EpochStartOffset(epoch=0, start_offset=0),
        EpochStartOffset(epoch=2, start_offset=3),
    ],
    batches=[
        ReplicaBatchInfo(base_offset=0, last_offset=2, leader_epoch=0, crc=1, size=90),
        ReplicaBatchInfo(base_offset=3, last_offset=5, leader_epoch=2, crc=2, size=91),
    ],
)


async def test_describe_replica_log_by_id_and_by_address(broker: FakeBroker) -> None:
    broker.overrides[DescribeReplicaLogRequest] = lambda _r: REPLICA
    async with AsyncAdmin(broker.address) as admin:
        by_id = await admin.describe_replica_log(1, "t", 0, max_batches=10)
    request = broker.requests_of(DescribeReplicaLogRequest)[-1]
    assert (request.topic, request.partition, request.max_batches) == ("t", 0, 10)
    assert by_id.broker_id == 1 and (by_id.host, by_id.port) == (broker.host, broker.port)
    assert (by_id.log_start_offset, by_id.log_end_offset, by_id.high_watermark) == (0, 6, 5)
    assert (by_id.leader_id, by_id.leader_epoch, by_id.partition_epoch) == (1, 2, 4)
    assert by_id.isr == (1, 2)
    assert by_id.epoch_entries == (EpochEntry(0, 0), EpochEntry(2, 3))
    assert by_id.batches[1] == ReplicaBatch(3, 5, 2, 2, 91)
    d = by_id.to_dict()
    assert d["address"] == broker.address and d["batches"][0]["last_offset"] == 2
    assert d["epoch_entries"] == [{"epoch": 0, "start_offset": 0}, {"epoch": 2, "start_offset": 3}]

    unstarted = AsyncAdmin("127.0.0.1:1")  # no bootstrap needed with an address
    by_address = await unstarted.describe_replica_log(broker.address, "t", 0)
    assert by_address._replace(broker_id=1) == by_id
    assert by_address.broker_id == -1


async def test_describe_replica_log_errors(broker: FakeBroker) -> None:
    broker.overrides[DescribeReplicaLogRequest] = lambda _r: DescribeReplicaLogResponse(
        error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        error_message="broker 1 hosts no replica of t-9",
    )
    async with AsyncAdmin(broker.address) as admin:
        with pytest.raises(UnknownTopicOrPartitionError, match="hosts no replica of t-9"):
            await admin.describe_replica_log(1, "t", 9)
        with pytest.raises(MinibrokerError, match=r"broker 7 is not registered .*brokers: 1\)"):
            await admin.describe_replica_log(7, "t", 0)


async def test_a_server_without_describe_replica_log_gets_a_clear_message() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = ServerConnection(api_filter=lambda _key: False)  # serves nothing
        while data := await reader.read(65536):
            conn.receive_data(data)
            while (event := conn.next_event()) is not None:
                assert isinstance(event, RejectedRequest)
                writer.write(conn.send_rejection(event))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(MinibrokerError, match="does not serve DescribeReplicaLog") as info:
            await AsyncAdmin("127.0.0.1:1").describe_replica_log(f"127.0.0.1:{port}", "t", 0)
        assert "INVALID_REQUEST" in str(info.value)
    finally:
        server.close()
        await server.wait_closed()
