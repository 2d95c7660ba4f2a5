"""Idempotent produce (KIP-98) across real processes: InitProducerId, a batch whose
response is lost (drop_response) and resent is written once and answered with its
original offset; after the leader of an RF=3 acks=all topic is SIGKILLed, the new
leader still deduplicates the retry; a restarted broker keeps its producer state
(snapshot after a clean stop, rebuild from batch headers after SIGKILL).

Issue 4 acceptance, with the client library's AsyncProducer (idempotent, acks=all,
max_in_flight 5) on 3 brokers (RF 3, min ISR 2, 4 partitions): Produce responses are
dropped after the append and the leaders move twice (SIGKILL, controlled shutdown)
while 10,000 records are sent; reading back from offset 0 finds each exactly once, in
send order per partition, where its acknowledgement said. Protection off
(enable_idempotence=False), the same lost responses write duplicates."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable

import pytest
from cluster import Cluster
from cluster import TestClient

from client import AsyncConsumer
from client import AsyncProducer
from client import RecordMetadata
from client import TopicPartition
from client.errors import PossiblyWrittenError
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DescribeReplicaLogRequest
from protocol.messages import DescribeReplicaLogResponse
from protocol.messages import FaultControlRequest
from protocol.messages import FaultControlResponse
from protocol.messages import FaultRule
from protocol.messages import InitProducerIdRequest
from protocol.messages import InitProducerIdResponse
from protocol.messages import MetadataPartition
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import ProducePartition
from protocol.messages import ProducePartitionResponse
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.record_batch import BatchBuilder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "idempotent"


def batch(pid: int, seq: int, records: int = 3) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=seq)
    for i in range(records):
        builder.append(f"value-{seq + i}".encode())
    return builder.build()


def produce_request(records: bytes, *, acks: int = -1) -> ProduceRequest:
    return ProduceRequest(
        acks=acks,
        timeout_ms=5000,
        topics=[ProduceTopic(name=TOPIC, partitions=[ProducePartition(index=0, records=records)])],
    )


async def produce(address: tuple[str, int], records: bytes, **kw: int) -> ProducePartitionResponse:
    async with TestClient(*address) as client:
        resp = await client.call(produce_request(records, **kw), timeout=20)
    assert isinstance(resp, ProduceResponse)
    return resp.topics[0].partitions[0]


async def create_topic(
    address: tuple[str, int],
    rf: int,
    *,
    name: str = TOPIC,
    partitions: int = 1,
    configs: dict[str, str] | None = None,
) -> None:
    async with TestClient(*address) as client:
        resp = await client.call(
            CreateTopicsRequest(
                topics=[
                    CreatableTopic(
                        name=name,
                        num_partitions=partitions,
                        replication_factor=rf,
                        configs={"min.insync.replicas": str(min(rf, 2)), **(configs or {})},
                    )
                ]
            )
        )
    assert isinstance(resp, CreateTopicsResponse)
    assert resp.topics[0].error_code == 0, resp.topics[0].error_message


async def init_producer_id(address: tuple[str, int]) -> int:
    async with TestClient(*address) as client:
        resp = await client.call(InitProducerIdRequest())
    assert isinstance(resp, InitProducerIdResponse)
    assert resp.error_code == 0 and resp.producer_epoch == 0 and resp.producer_id >= 0
    return resp.producer_id


async def wait_partition(
    cluster: Cluster, predicate, *, what: str, topic: str = TOPIC
) -> MetadataPartition:
    deadline = time.monotonic() + 30
    last = None
    while time.monotonic() < deadline:
        for proc in cluster.brokers.values():
            if not proc.alive:
                continue
            try:
                async with TestClient(*proc.address) as client:
                    md = await client.call(MetadataRequest(topics=[topic]))
                assert isinstance(md, MetadataResponse)
                if md.topics and md.topics[0].error_code == 0:
                    last = md.topics[0].partitions[0]
                    if predicate(last):
                        return last
            except (ConnectionError, OSError, TimeoutError):
                pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last {last}")


async def leader_and_follower(cluster: Cluster, topic: str) -> tuple[int, int]:
    """(leader, follower) of partition 0 of a topic on brokers 1 and 2, once both are in
    its ISR."""
    state = await wait_partition(
        cluster,
        lambda p: p.leader_id > 0 and len(p.isr_nodes) == 2,
        what="ISR of 2",
        topic=topic,
    )
    return state.leader_id, 3 - state.leader_id


async def batches_on(address: tuple[str, int]) -> list[int]:
    async with TestClient(*address) as client:
        resp = await client.call(DescribeReplicaLogRequest(topic=TOPIC, partition=0))
    assert isinstance(resp, DescribeReplicaLogResponse)
    return [b.base_offset for b in resp.batches]


async def produce_until_accepted(
    address: tuple[str, int], records: bytes, **kw: int
) -> ProducePartitionResponse:
    """Retry retriable errors (a leader still taking over) for a bounded time."""
    deadline = time.monotonic() + 30
    while True:
        r = await produce(address, records, **kw)
        if not ErrorCode(r.error_code).retriable or time.monotonic() > deadline:
            return r
        await asyncio.sleep(0.2)


async def test_lost_response_and_leader_change_do_not_duplicate(cluster: Cluster) -> None:
    cluster.start_controller(session_timeout_ms=2000)
    cluster.start_brokers((1, 2, 3), "--enable-test-faults", "--replica-lag-time-max-ms", "1500")
    await create_topic(cluster.brokers[1].address, rf=3)
    state = await wait_partition(
        cluster, lambda p: p.leader_id >= 0 and len(p.isr_nodes) == 3, what="leader, ISR 3"
    )
    leader = cluster.brokers[state.leader_id]
    pid = await init_producer_id(cluster.brokers[1].address)

    first = await produce(leader.address, batch(pid, 0))
    assert (first.error_code, first.base_offset) == (0, 0)

    # The second batch is appended but its response is lost.
    async with TestClient(*leader.address) as admin:
        resp = await admin.call(
            FaultControlRequest(
                add_rules=[
                    FaultRule(api_key=int(ApiKey.PRODUCE), action="drop_response", remaining=1)
                ]
            )
        )
        assert isinstance(resp, FaultControlResponse) and resp.error_code == 0
    async with TestClient(*leader.address) as client:
        with pytest.raises(ConnectionError):
            await client.request(produce_request(batch(pid, 3)))
    retry = await produce(leader.address, batch(pid, 3))
    assert (retry.error_code, retry.base_offset) == (0, 3)
    assert await batches_on(leader.address) == [0, 3]  # written once

    # Out of order and unknown producers are refused.
    gap = await produce(leader.address, batch(pid, 9))
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    stranger = await produce(leader.address, batch(pid + 999_999, 5))
    assert stranger.error_code == ErrorCode.UNKNOWN_PRODUCER_ID

    # Every replica has both batches; then the leader dies.
    await wait_partition(cluster, lambda p: len(p.isr_nodes) == 3, what="ISR of 3")
    for node, proc in cluster.brokers.items():
        deadline = time.monotonic() + 30
        while await batches_on(proc.address) != [0, 3]:
            assert time.monotonic() < deadline, f"broker {node} did not replicate"
            await asyncio.sleep(0.1)
    old = state.leader_id
    leader.kill()
    state = await wait_partition(
        cluster, lambda p: p.leader_id not in (-1, old), what="a new leader"
    )
    new_leader = cluster.brokers[state.leader_id]
    again = await produce_until_accepted(new_leader.address, batch(pid, 3))
    assert (again.error_code, again.base_offset) == (0, 3)
    oldest = await produce_until_accepted(new_leader.address, batch(pid, 0))
    assert (oldest.error_code, oldest.base_offset) == (0, 0)
    nxt = await produce_until_accepted(new_leader.address, batch(pid, 6))
    assert (nxt.error_code, nxt.base_offset) == (0, 6)
    assert await batches_on(new_leader.address) == [0, 3, 6]


async def test_restarted_broker_keeps_producer_state(cluster: Cluster) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1)
    await create_topic(broker.address, rf=1)
    await wait_partition(cluster, lambda p: p.leader_id == 1, what="leader")
    pid = await init_producer_id(broker.address)
    for seq in (0, 3):
        r = await produce_until_accepted(broker.address, batch(pid, seq))
        assert (r.error_code, r.base_offset) == (0, seq)

    # Clean stop: the state is in a snapshot at the log end.
    assert broker.terminate() == 0
    snapshots = sorted(p.name for p in (broker.data_dir / f"{TOPIC}-0").glob("*.snapshot"))
    assert snapshots == ["00000000000000000006.snapshot"]
    broker = cluster.start_broker(1)
    await wait_partition(cluster, lambda p: p.leader_id == 1, what="leader after restart")
    r = await produce_until_accepted(broker.address, batch(pid, 3))
    assert (r.error_code, r.base_offset) == (0, 3)
    r = await produce_until_accepted(broker.address, batch(pid, 6))
    assert (r.error_code, r.base_offset) == (0, 6)

    # SIGKILL: no snapshot past offset 6; the batch at 6 is replayed from its header.
    broker.kill()
    broker = cluster.start_broker(1)
    await wait_partition(cluster, lambda p: p.leader_id == 1, what="leader after crash")
    r = await produce_until_accepted(broker.address, batch(pid, 6))
    assert (r.error_code, r.base_offset) == (0, 6)
    r = await produce_until_accepted(broker.address, batch(pid, 12))
    assert r.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert await batches_on(broker.address) == [0, 3, 6]


# ---------------------------------------------------------------------------------------
# Acceptance (issue 4): the client library's idempotent producer under lost responses and
# leader changes. 10,000 sends -> exactly 10,000 records, in send order per partition.

LIB_TOPIC = "idempotent-lib"
LIB_PARTITIONS = 4
FLAGS = ("--enable-test-faults", "--replica-lag-time-max-ms", "1500")
DROPS_PER_BROKER = 4  # bounded: each rule is consumed by that many Produce requests
_DROPPED = re.compile(r"TEST FAULT at node \d+: drop_response.* incoming PRODUCE ")


async def start_lib_cluster(cluster: Cluster) -> None:
    cluster.start_controller(session_timeout_ms=2000)
    cluster.start_brokers((1, 2, 3), *FLAGS)
    await create_topic(cluster.brokers[1].address, 3, name=LIB_TOPIC, partitions=LIB_PARTITIONS)
    await wait_lib_partitions(cluster, lambda p: p.leader_id >= 0 and len(p.isr_nodes) == 3)


def lib_producer(cluster: Cluster, *, enable_idempotence: bool) -> AsyncProducer:
    """The client library's producer, acks=all, small batches so that many are in flight
    (up to 5 per partition when idempotent), every wait bounded."""
    bootstrap = ",".join(f"{h}:{p}" for h, p in (b.address for b in cluster.brokers.values()))
    return AsyncProducer(
        bootstrap,
        acks="all",
        enable_idempotence=enable_idempotence,
        max_in_flight=5 if enable_idempotence else 1,
        linger_ms=5,
        batch_size=2_048,
        request_timeout_ms=8_000,
        delivery_timeout_ms=60_000,
        retry_backoff_ms=50,
    )


async def lib_partitions(cluster: Cluster) -> list[MetadataPartition] | None:
    """The topic's partitions as one live broker sees them (None: no answer)."""
    for proc in cluster.brokers.values():
        if not proc.alive:
            continue
        try:
            async with TestClient(*proc.address) as client:
                md = await client.call(MetadataRequest(topics=[LIB_TOPIC]), timeout=5)
        except (ConnectionError, OSError, TimeoutError):
            continue
        assert isinstance(md, MetadataResponse)
        if md.topics and md.topics[0].error_code == 0:
            return sorted(md.topics[0].partitions, key=lambda p: p.partition_index)
    return None


async def wait_lib_partitions(
    cluster: Cluster, predicate: Callable[[MetadataPartition], bool], timeout: float = 30.0
) -> list[MetadataPartition]:
    """Until every partition satisfies `predicate` (bounded)."""
    deadline = time.monotonic() + timeout
    parts: list[MetadataPartition] | None = None
    while time.monotonic() < deadline:
        parts = await lib_partitions(cluster)
        if parts and len(parts) == LIB_PARTITIONS and all(predicate(p) for p in parts):
            return parts
        await asyncio.sleep(0.2)
    raise AssertionError(f"partitions of {LIB_TOPIC} not as expected in {timeout}s: {parts}")


async def drop_produce_responses(cluster: Cluster, node: int, times: int) -> None:
    async with TestClient(*cluster.brokers[node].address) as admin:
        resp = await admin.call(
            FaultControlRequest(
                add_rules=[
                    FaultRule(api_key=int(ApiKey.PRODUCE), action="drop_response", remaining=times)
                ]
            )
        )
    assert isinstance(resp, FaultControlResponse) and resp.error_code == 0, resp


def dropped_responses(cluster: Cluster) -> int:
    """Produce responses the brokers dropped, from their logs (every run, restarts too)."""
    return sum(
        len(_DROPPED.findall(proc.log_text(since_start=False))) for proc in cluster.brokers.values()
    )


async def read_partitions(cluster: Cluster) -> dict[int, list[tuple[int, bytes]]]:
    """Every partition of LIB_TOPIC from offset 0 to its end: [(offset, value)]."""
    host, port = cluster.brokers[1].address
    bootstrap = f"{host}:{port}"
    tps = [TopicPartition(LIB_TOPIC, p) for p in range(LIB_PARTITIONS)]
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(LIB_PARTITIONS)}
    async with AsyncConsumer(bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + 30
        while sum(len(part) for part in out.values()) < sum(ends.values()):
            assert time.monotonic() < deadline, "could not read the topic back in 30 s"
            for tp, records in (await consumer.poll(timeout_ms=500)).items():
                out[tp.partition] += [(r.offset, r.value) for r in records]
    return out


async def send_range(
    producer: AsyncProducer,
    first: int,
    end: int,
    futures: dict[int, asyncio.Future[RecordMetadata]],
) -> None:
    """Sends first..end-1, the value being the global send sequence; paced so that the
    faults meet records in flight."""
    for seq in range(first, end):
        futures[seq] = await producer.send(LIB_TOPIC, f"{seq:06d}".encode(), key=b"%d" % (seq % 61))
        if seq % 50 == 49:
            await asyncio.sleep(0.02)


async def move_leader(cluster: Cluster, *, how: str, sending: asyncio.Task[None]) -> int:
    """Stop the leader of partition 0 (kill -9 or controlled shutdown) while `sending`
    runs, wait for new leaders, restart it with fresh drop rules, wait for ISR 3."""
    before = await wait_lib_partitions(cluster, lambda p: p.leader_id >= 0)
    victim = before[0].leader_id
    await asyncio.sleep(0.3)  # records of `sending` are in flight to it
    proc = cluster.brokers[victim]
    if how == "kill":
        await asyncio.to_thread(proc.kill)
    else:
        assert await asyncio.to_thread(proc.terminate) == 0
    await wait_lib_partitions(cluster, lambda p: p.leader_id not in (-1, victim))
    await sending
    await asyncio.to_thread(cluster.start_broker, victim, *FLAGS)
    await drop_produce_responses(cluster, victim, DROPS_PER_BROKER)
    await wait_lib_partitions(cluster, lambda p: len(p.isr_nodes) == 3)
    return victim


async def test_library_producer_exactly_once_in_order_under_faults(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant: idempotent delivery. Produce responses are lost after the append
    (drop_response) and the leader of a partition is SIGKILLed, then another is shut
    down, while 10,000 records are in flight; every record is written exactly once,
    at the offset its RecordMetadata says, in send order within its partition."""
    caplog.set_level(logging.INFO, logger="client.producer")
    total = 10_000
    await start_lib_cluster(cluster)
    epochs_before = {p.partition_index: p.leader_epoch for p in await lib_partitions(cluster) or []}
    for node in cluster.brokers:
        await drop_produce_responses(cluster, node, DROPS_PER_BROKER)
    futures: dict[int, asyncio.Future[RecordMetadata]] = {}
    async with lib_producer(cluster, enable_idempotence=True) as producer:
        assert producer.enable_idempotence and producer.producer_id >= 0
        await send_range(producer, 0, 2_500, futures)
        killed = await move_leader(
            cluster,
            how="kill",
            sending=asyncio.create_task(send_range(producer, 2_500, 5_000, futures)),
        )
        stopped = await move_leader(
            cluster,
            how="shutdown",
            sending=asyncio.create_task(send_range(producer, 5_000, 7_500, futures)),
        )
        await send_range(producer, 7_500, total, futures)
        await producer.flush(timeout_ms=60_000)
    acked = {seq: fut.result() for seq, fut in futures.items()}  # raises if any failed
    assert len(acked) == total

    # The faults really happened.
    drops = dropped_responses(cluster)
    assert drops > 0, "no Produce response was dropped: the test proved nothing"
    # Retried after the answer was lost: only the leader's deduplication keeps them single.
    assert "lost by the server" in caplog.text, "no batch was retried after a lost answer"
    epochs_after = {p.partition_index: p.leader_epoch for p in await lib_partitions(cluster) or []}
    bumps = sum(epochs_after[p] - epochs_before[p] for p in epochs_before)
    assert bumps >= 2, f"leader epochs {epochs_before} -> {epochs_after}"
    print(f"{drops} Produce responses dropped; leader epochs {epochs_before} -> {epochs_after}")
    assert (killed, stopped) and all(b.alive for b in cluster.brokers.values())

    # Read everything back from offset 0.
    logs = await read_partitions(cluster)
    values = [int(v) for part in logs.values() for _, v in part]
    assert len(values) == total, f"{len(values)} records for {total} sends"
    assert len(set(values)) == total, "duplicates"
    assert set(values) == set(range(total)), "missing records"
    for partition, records in logs.items():
        seqs = [int(v) for _, v in records]
        assert seqs == sorted(seqs), f"partition {partition} out of send order"
        offsets = [o for o, _ in records]
        assert offsets == list(range(len(records))), f"partition {partition} has gaps"
    # Each record is where its acknowledgement said.
    where = {int(v): (p, o) for p, part in logs.items() for o, v in part}
    for seq, md in acked.items():
        assert where[seq] == (md.partition, md.offset), (seq, md)


async def test_without_idempotence_lost_responses_duplicate(cluster: Cluster) -> None:
    """Protection OFF: enable_idempotence=False, same lost responses: the retry of a batch
    whose answer was dropped writes it a second time."""
    total = 1_000
    await start_lib_cluster(cluster)
    for node in cluster.brokers:
        await drop_produce_responses(cluster, node, DROPS_PER_BROKER)
    futures: dict[int, asyncio.Future[RecordMetadata]] = {}
    async with lib_producer(cluster, enable_idempotence=False) as producer:
        assert producer.producer_id == -1
        await send_range(producer, 0, total, futures)
        await producer.flush(timeout_ms=60_000)
    for fut in futures.values():
        fut.result()
    assert dropped_responses(cluster) > 0
    values = [int(v) for part in (await read_partitions(cluster)).values() for _, v in part]
    duplicates = len(values) - len(set(values))
    assert set(values) == set(range(total))
    assert duplicates > 0, "lost responses without idempotence should have duplicated"


# ---------------------------------------------------------------------------------------
# KIP-360 on a real cluster: the new leader lost the producer's state (an unclean
# election onto a replica that never had its batches); the producer bumps its epoch.

KIP360_TOPIC = "kip360"


async def test_lost_producer_state_bumps_the_epoch_on_a_real_cluster(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Replicas [leader L, follower F], min ISR 1, unclean election on. F stops; three
    records go to L alone; L is SIGKILLed and F comes back: F leads (unclean) with an
    empty log and no state for the producer. The next batch (sequence 3) is refused
    UNKNOWN_PRODUCER_ID; the producer sends InitProducerId with its id and epoch, gets
    epoch 1 of the same id, and the partition starts again at sequence 0, in order. A
    batch of the old epoch is fenced (INVALID_PRODUCER_EPOCH)."""
    caplog.set_level(logging.INFO, logger="client.producer")
    cluster.start_controller(session_timeout_ms=2000)
    cluster.start_brokers((1, 2), "--replica-lag-time-max-ms", "1500")
    await create_topic(
        cluster.brokers[1].address,
        2,
        name=KIP360_TOPIC,
        configs={"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
    )
    leader, follower = await leader_and_follower(cluster, KIP360_TOPIC)
    assert cluster.brokers[follower].terminate() == 0
    await wait_partition(
        cluster, lambda p: list(p.isr_nodes) == [leader], what="ISR [leader]", topic=KIP360_TOPIC
    )
    tp = TopicPartition(KIP360_TOPIC, 0)
    async with AsyncProducer(
        ",".join(f"{h}:{p}" for h, p in (b.address for b in cluster.brokers.values())),
        linger_ms=0,
        retry_backoff_ms=50,
        request_timeout_ms=5_000,
        delivery_timeout_ms=45_000,
    ) as producer:
        pid = producer.producer_id
        for i in range(3):
            md = await producer.send_and_wait(KIP360_TOPIC, b"lost-%d" % i, partition=0)
            assert md.offset == i
        # The leader dies with the only copy; the empty follower takes over (unclean).
        cluster.brokers[leader].kill()
        await asyncio.to_thread(cluster.start_broker, follower, "--replica-lag-time-max-ms", "1500")
        after = [await producer.send(KIP360_TOPIC, b"new-%d" % i, partition=0) for i in range(3)]
        offsets = [(await f).offset for f in after]
        assert offsets == [0, 1, 2]  # the new lineage, in send order
        assert (producer.producer_id, producer.producer_epoch) == (pid, 1)
        assert producer.cluster.leader_for(tp)[0] == follower
    assert "UNKNOWN_PRODUCER_ID" in caplog.text and "bumped from epoch 0" in caplog.text
    inits = [r for r in caplog.records if "idempotent producer: producer id" in r.getMessage()]
    assert len(inits) == 2, [r.getMessage() for r in inits]

    # The old epoch is fenced at the leader; the new one goes on.
    new_leader = cluster.brokers[follower].address
    stale = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=3)
    stale.append(b"zombie")
    async with TestClient(*new_leader) as client:
        resp = await client.call(
            ProduceRequest(
                acks=-1,
                timeout_ms=5000,
                topics=[
                    ProduceTopic(
                        name=KIP360_TOPIC,
                        partitions=[ProducePartition(index=0, records=stale.build())],
                    )
                ],
            )
        )
    assert isinstance(resp, ProduceResponse)
    assert resp.topics[0].partitions[0].error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    async with TestClient(*new_leader) as client:
        log = await client.call(DescribeReplicaLogRequest(topic=KIP360_TOPIC, partition=0))
    assert isinstance(log, DescribeReplicaLogResponse)
    assert log.log_end_offset == 3 and log.batches[-1].last_offset == 2  # nothing else


# ---------------------------------------------------------------------------------------
# Issue 13 (found by the chaos suite): a batch whose outcome is unknown when the epoch is
# bumped must not be renumbered, or the leader cannot recognise it and writes it twice.

IN_DOUBT_TOPIC = "in-doubt"


async def hold_fetches_from(cluster: Cluster, leader: int, follower: int) -> None:
    """The leader parks every Fetch of `follower` (until cleared): its high watermark
    stops, so acks=all Produce requests are appended but not acknowledged."""
    async with TestClient(*cluster.brokers[leader].address) as admin:
        resp = await admin.call(
            FaultControlRequest(
                add_rules=[FaultRule(api_key=int(ApiKey.FETCH), action="hold", peer_id=follower)]
            )
        )
    assert isinstance(resp, FaultControlResponse) and resp.error_code == 0, resp


async def clear_faults(cluster: Cluster, node: int) -> None:
    async with TestClient(*cluster.brokers[node].address) as admin:
        resp = await admin.call(FaultControlRequest(clear=True))
    assert isinstance(resp, FaultControlResponse) and resp.error_code == 0, resp


async def test_batch_in_doubt_is_not_written_twice_after_an_epoch_bump(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant: idempotent delivery across a KIP-360 epoch bump. RF 2, min ISR 2, the
    follower's fetches held at the leader. Batch b, then 2 s later batch a (sequences 1
    and 2) are appended by the leader and wait for the ISR; the follower drops out of
    it, so both are answered NOT_ENOUGH_REPLICAS_AFTER_APPEND: written, but the producer
    cannot know. b's retries are refused (NOT_ENOUGH_REPLICAS) until its delivery
    timeout expires, a sequence gap: the producer bumps its epoch. Then the follower is
    let go and the ISR heals. a must be resent under its old epoch and sequence (the
    leader answers with the offset it already has), not renumbered under the new epoch
    (which wrote it twice); b fails with PossiblyWrittenError (it is in the log)."""
    caplog.set_level(logging.INFO, logger="client.producer")
    cluster.start_controller(session_timeout_ms=2000)
    cluster.start_brokers((1, 2), "--enable-test-faults", "--replica-lag-time-max-ms", "3000")
    await create_topic(cluster.brokers[1].address, 2, name=IN_DOUBT_TOPIC)
    leader, follower = await leader_and_follower(cluster, IN_DOUBT_TOPIC)
    bootstrap = ",".join(f"{h}:{p}" for h, p in (b.address for b in cluster.brokers.values()))
    async with AsyncProducer(
        bootstrap,
        linger_ms=0,
        retry_backoff_ms=50,
        retry_backoff_max_ms=200,
        request_timeout_ms=15_000,  # the leader answers when the ISR shrinks, not before
        delivery_timeout_ms=8_000,
    ) as producer:
        assert (await producer.send_and_wait(IN_DOUBT_TOPIC, b"v0", partition=0)).offset == 0
        await hold_fetches_from(cluster, leader, follower)
        b = await producer.send(IN_DOUBT_TOPIC, b"b", partition=0)
        await asyncio.sleep(2.0)  # a outlives b's delivery timeout by 2 s
        assert not b.done()  # b's first attempt still waits for the ISR
        a = await producer.send(IN_DOUBT_TOPIC, b"a", partition=0)
        await asyncio.wait([b], timeout=20)
        assert b.done() and not a.done()
        await clear_faults(cluster, leader)  # the follower catches up, the ISR heals
        outcomes = await asyncio.wait_for(asyncio.gather(b, a, return_exceptions=True), 20)
        c = await producer.send_and_wait(IN_DOUBT_TOPIC, b"c", partition=0)
        assert producer.producer_epoch == 1
    assert "NOT_ENOUGH_REPLICAS_AFTER_APPEND" in caplog.text  # both were in doubt
    assert "bumped from epoch 0" in caplog.text

    # Read the partition back from offset 0.
    tp = TopicPartition(IN_DOUBT_TOPIC, 0)
    values: list[bytes | None] = []
    async with AsyncConsumer(bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        consumer.seek(tp, 0)
        deadline = time.monotonic() + 20
        while len(values) < end:
            assert time.monotonic() < deadline, f"read {values} of {end} records"
            for records in (await consumer.poll(timeout_ms=500)).values():
                values += [r.value for r in records]
    assert values == [b"v0", b"b", b"a", b"c"]  # a once
    b_outcome, a_outcome = outcomes
    assert isinstance(b_outcome, PossiblyWrittenError), b_outcome
    assert isinstance(a_outcome, RecordMetadata) and a_outcome.offset == 2, a_outcome
    assert c.offset == 3
