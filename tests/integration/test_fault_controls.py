"""Test-only fault controls and replica inspection on real processes: FaultControl is
refused unless a process runs with --enable-test-faults; with it, delay / drop /
drop_response / hold act on real RPCs (client -> broker, broker -> controller); the
--unsafe-* switches are refused without it; DescribeReplicaLog shows a real
partition's batches and epoch cache."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
from cluster import REPO
from cluster import Cluster
from cluster import TestClient

from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.fault_plan import CONTROLLER_PEER_ID
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DescribeReplicaLogRequest
from protocol.messages import DescribeReplicaLogResponse
from protocol.messages import FaultControlRequest
from protocol.messages import FaultControlResponse
from protocol.messages import FaultRule
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.record_batch import encode_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PRODUCE = int(ApiKey.PRODUCE)
METADATA = int(ApiKey.METADATA)


def batch(*values: bytes) -> bytes:
    return encode_batch([(None, v, (), None) for v in values])


def produce_request(topic: str, *values: bytes) -> ProduceRequest:
    return ProduceRequest(
        acks=1,
        timeout_ms=5000,
        topics=[
            ProduceTopic(name=topic, partitions=[ProducePartition(index=0, records=batch(*values))])
        ],
    )


async def create_topic(client: TestClient, name: str) -> None:
    resp = await client.call(
        CreateTopicsRequest(
            topics=[CreatableTopic(name=name, num_partitions=1, replication_factor=1)]
        )
    )
    assert isinstance(resp, CreateTopicsResponse)
    assert resp.topics[0].error_code == 0, resp.topics[0].error_message


async def leader_epoch(client: TestClient, topic: str, *, at_least: int = 0) -> int:
    deadline = time.monotonic() + 20
    while True:
        md = await client.call(MetadataRequest(topics=[topic]))
        assert isinstance(md, MetadataResponse)
        parts = md.topics[0].partitions
        if parts and parts[0].leader_id >= 0 and parts[0].leader_epoch >= at_least:
            return parts[0].leader_epoch
        assert time.monotonic() < deadline, f"no leader for {topic}: {md}"
        await asyncio.sleep(0.1)


async def produce(client: TestClient, topic: str, *values: bytes) -> int:
    resp = await client.call(produce_request(topic, *values))
    assert isinstance(resp, ProduceResponse)
    part = resp.topics[0].partitions[0]
    assert part.error_code == 0, part
    return part.base_offset


async def fault_control(client: TestClient, **kwargs: object) -> FaultControlResponse:
    resp = await client.call(FaultControlRequest(**kwargs))  # type: ignore[arg-type]
    assert isinstance(resp, FaultControlResponse)
    assert resp.error_code == 0, resp.error_message
    return resp


def run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIBROKER_")}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# ---------------------------------------------------------------------- switches refused


@pytest.mark.parametrize(
    "args",
    [
        ("broker", "--node-id", "1", "--unsafe-truncate-to-high-watermark"),
        ("broker", "--node-id", "1", "--unsafe-ignore-leader-epoch"),
        ("broker", "--node-id", "1", "--unsafe-skip-fsync"),
        ("controller", "--unsafe-ignore-broker-epochs"),
        ("controller", "--unsafe-keep-restarted-replicas-in-isr"),
    ],
)
def test_unsafe_switches_refused_without_test_faults(args: tuple[str, ...]) -> None:
    module, *rest = args
    result = run_module(module, *rest)
    assert result.returncode == 2, result.stderr
    assert rest[-1] in result.stderr and "--enable-test-faults" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------- off by default


async def test_fault_control_refused_and_replica_log_described(cluster: Cluster) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1)
    assert cluster.controller is not None
    async with TestClient(*broker.address) as client:
        for target in (client, TestClient(cluster.controller.host, cluster.controller.port)):
            if target is not client:
                await target.__aenter__()
            refused = await target.request(FaultControlRequest(clear=True))
            assert refused.error_code == ErrorCode.INVALID_REQUEST
            versions = await target.call(ApiVersionsRequest())
            assert isinstance(versions, ApiVersionsResponse)
            assert int(ApiKey.FAULT_CONTROL) not in {k.api_key for k in versions.api_keys}
            if target is not client:
                await target.close()

        await create_topic(client, "inspect")
        first_epoch = await leader_epoch(client, "inspect")
        assert await produce(client, "inspect", b"a", b"b") == 0
        assert await produce(client, "inspect", b"c") == 2
    # A restart gives the partition a new leader epoch.
    broker.terminate()
    broker = cluster.start_broker(1)
    async with TestClient(*broker.address) as client:
        second_epoch = await leader_epoch(client, "inspect", at_least=first_epoch + 1)
        assert await produce(client, "inspect", b"d", b"e", b"f") == 3
        resp = await client.call(DescribeReplicaLogRequest(topic="inspect", partition=0))
        assert isinstance(resp, DescribeReplicaLogResponse)
        assert (resp.log_start_offset, resp.log_end_offset, resp.high_watermark) == (0, 6, 6)
        assert (resp.leader_id, resp.leader_epoch, resp.isr) == (1, second_epoch, [1])
        assert [(e.epoch, e.start_offset) for e in resp.epoch_entries] == [
            (first_epoch, 0),
            (second_epoch, 3),
        ]
        assert [(b.base_offset, b.last_offset, b.leader_epoch) for b in resp.batches] == [
            (0, 1, first_epoch),
            (2, 2, first_epoch),
            (3, 5, second_epoch),
        ]
        assert all(b.size > 61 and b.crc != 0 for b in resp.batches)
        missing = await client.call(DescribeReplicaLogRequest(topic="inspect", partition=7))
        assert isinstance(missing, DescribeReplicaLogResponse)
        assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# ---------------------------------------------------------------------- on


async def test_faults_on_real_rpcs(cluster: Cluster) -> None:
    controller = cluster.start_controller("--enable-test-faults")
    broker = cluster.start_broker(1, "--enable-test-faults", "--unsafe-skip-fsync")
    assert "TEST FAULTS ENABLED: never use this in production" in controller.log_text()
    log = broker.log_text()
    assert "TEST FAULTS ENABLED: never use this in production" in log
    assert "UNSAFE TEST SWITCH --unsafe-skip-fsync is ON" in log
    loop = asyncio.get_running_loop()

    async with TestClient(*broker.address) as admin:
        state = await fault_control(admin, clear=True)
        assert state.protections_off == ["unsafe-skip-fsync"] and state.rules == []
        await create_topic(admin, "f")
        await leader_epoch(admin, "f")

        # delay: the answer comes, late.
        await fault_control(
            admin,
            add_rules=[FaultRule(api_key=METADATA, action="delay", delay_ms=300, remaining=1)],
        )
        t0 = loop.time()
        async with TestClient(*broker.address) as client:
            await client.call(MetadataRequest(topics=["f"]))
        assert loop.time() - t0 >= 0.28

        # drop: the request is lost with its connection, nothing is appended.
        await fault_control(
            admin, add_rules=[FaultRule(api_key=PRODUCE, action="drop", remaining=1)]
        )
        async with TestClient(*broker.address) as client:
            with pytest.raises(ConnectionError):
                await client.request(produce_request("f", b"lost"))
        # drop_response: appended, but the producer never hears so.
        await fault_control(
            admin, add_rules=[FaultRule(api_key=PRODUCE, action="drop_response", remaining=1)]
        )
        async with TestClient(*broker.address) as client:
            with pytest.raises(ConnectionError):
                await client.request(produce_request("f", b"unacknowledged"))
        described = await admin.call(DescribeReplicaLogRequest(topic="f", partition=0))
        assert isinstance(described, DescribeReplicaLogResponse)
        assert described.log_end_offset == 1  # only the drop_response one

        # hold + release: the answer waits for the release.
        await fault_control(admin, add_rules=[FaultRule(api_key=PRODUCE, action="hold")])
        async with TestClient(*broker.address) as client:
            cid = client.send(produce_request("f", b"held"))
            with pytest.raises(TimeoutError):
                await client.receive(cid, timeout=0.5)
            state = await fault_control(admin)
            assert state.held == 1 and [r.action for r in state.rules] == ["hold"]
            await fault_control(admin, release_held=True)
            response = await client.receive(cid)
            assert isinstance(response.body, ProduceResponse)
            assert response.body.topics[0].partitions[0].base_offset == 1
        await fault_control(admin, clear=True)

        # Outgoing, broker -> controller (peer -1000): a dropped forward is retried.
        await fault_control(
            admin,
            add_rules=[
                FaultRule(
                    api_key=int(ApiKey.CREATE_TOPICS),
                    action="drop",
                    direction="out",
                    peer_id=CONTROLLER_PEER_ID,
                    remaining=1,
                )
            ],
        )
        await create_topic(admin, "g")
        assert "outgoing CREATE_TOPICS to peer -1000" in broker.log_text()

        # At the controller: a held CreateTopics answers only once released.
        async with TestClient(controller.host, controller.port) as at_controller:
            await fault_control(
                at_controller,
                add_rules=[FaultRule(api_key=int(ApiKey.CREATE_TOPICS), action="hold")],
            )
            cid = admin.send(
                CreateTopicsRequest(topics=[CreatableTopic(name="h", replication_factor=1)])
            )
            with pytest.raises(TimeoutError):
                await admin.receive(cid, timeout=0.5)
            assert (await fault_control(at_controller)).held == 1
            await fault_control(at_controller, clear=True)
            created = await admin.receive(cid)
            assert isinstance(created.body, CreateTopicsResponse)
            assert created.body.topics[0].error_code == 0
        assert "TEST FAULT at controller" in controller.log_text()
