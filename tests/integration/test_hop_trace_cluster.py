"""The opt-in hop tracing (runtime/hop_trace.py) across real processes: a controller
and three brokers started with MINIBROKER_TRACE_DIR, an RF 3 acks=all record produced
and consumed by this process; every hop of the record is in the trace files, in the
order the protocol makes them happen. And the servers freeze their start-up heap out
of garbage collection once started (runtime/process_start.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster

from bench.hop_breakdown import read_traces
from bench.hop_breakdown import resolve_hops
from client.admin import AsyncAdmin
from client.consumer import AsyncConsumer
from client.producer import AsyncProducer
from client.types import TopicPartition
from runtime import hop_trace

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = "traced"
TP = TopicPartition(TOPIC, 0)
RECORDS = 3
# The chain of an acks=all record, and the producer's ack beside it.
CHAIN = (
    "send",
    "producer.write",
    "leader.recv",
    "leader.append",
    "leader.fetch.follower",
    "follower.fetched",
    "follower.append",
    "leader.hw",
    "leader.fetch.consumer",
    "consumer.fetched",
    "consumer.sees",
)
ACK_CHAIN = ("leader.hw", "leader.ack", "producer.answer", "producer.ack")


@pytest.fixture
def tracing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every process started by the test (and this one) traces every offset; this
    process stops tracing afterwards."""
    trace_dir = tmp_path / "trace"
    monkeypatch.setenv(hop_trace.TRACE_DIR_ENV, str(trace_dir))
    monkeypatch.setenv(hop_trace.TRACE_SAMPLE_ENV, "1")
    monkeypatch.setattr(hop_trace, "TRACER", None)
    yield trace_dir
    if hop_trace.TRACER is not None:
        hop_trace.TRACER.close()


async def wait_full_isr(admin: AsyncAdmin) -> None:
    deadline = time.monotonic() + 30
    while True:
        (desc,) = await admin.describe_topics([TOPIC], include_offsets=False)
        if desc.partitions and all(len(p.isr) == 3 for p in desc.partitions):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"no full ISR: {desc}")
        await asyncio.sleep(0.1)


async def test_a_traced_record_passes_every_hop_in_order(cluster: Cluster, tracing: Path) -> None:
    cluster.start_controller()
    cluster.start_brokers((1, 2, 3))
    servers = ",".join(f"{b.host}:{b.port}" for b in cluster.brokers.values())
    async with AsyncAdmin(servers) as admin:
        await admin.create_topic(TOPIC, 1, 3, {"min.insync.replicas": "2"})
        await wait_full_isr(admin)
    seen: list[tuple[int, int]] = []
    async with (
        AsyncProducer(servers, acks="all", linger_ms=0) as producer,
        AsyncConsumer(servers, auto_offset_reset="earliest") as consumer,
    ):
        tracer = hop_trace.TRACER
        assert tracer is not None, "the client did not turn tracing on"
        consumer.assign([TP])
        for i in range(RECORDS):
            sent_ns = time.monotonic_ns()
            meta = await producer.send_and_wait(TOPIC, b"r%d" % i, partition=0)
            tracer.stamp_each("send", TOPIC, 0, [(meta.offset, sent_ns)])
            tracer.stamp_each("producer.ack", TOPIC, 0, [(meta.offset, time.monotonic_ns())])
        deadline = time.monotonic() + 30
        while len(seen) < RECORDS and time.monotonic() < deadline:
            for records in (await consumer.poll(timeout_ms=500)).values():
                now = time.monotonic_ns()
                seen.extend((r.offset, now) for r in records)
        tracer.stamp_each("consumer.sees", TOPIC, 0, seen)
    assert [o for o, _ in seen] == list(range(RECORDS))

    trace = read_traces(tracing)
    for offset in range(RECORDS):
        hops = trace.hops[(TOPIC, 0, offset)]
        times = resolve_hops(hops)
        assert times is not None, f"offset {offset}: hops missing from {sorted(hops)}"
        for chain in (CHAIN, ACK_CHAIN):
            stamps = [times[h] for h in chain]
            assert stamps == sorted(stamps), f"offset {offset}: hops out of order: " + ", ".join(
                f"{h} {t - times['send']}" for h, t in zip(chain, stamps, strict=True)
            )
    # Both followers appended it; each broker and the controller traced (loop probe on).
    followers = {role for _, role in trace.hops[(TOPIC, 0, 0)]["follower.append"]}
    assert len(followers) == 2
    files = {p.name.rsplit("-", 1)[0] for p in tracing.glob("*.trace")}
    assert {"broker-1", "broker-2", "broker-3", "client"} <= files


def test_servers_freeze_their_start_up_heap(cluster: Cluster) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1)
    for proc, role in ((cluster.controller, "controller-0"), (broker, "broker-1")):
        assert proc is not None
        match = proc.wait_for(rf"{role}: (\d+) start-up objects frozen out of garbage collection")
        assert int(match[1]) > 10_000  # modules, functions, classes: the whole start-up heap
