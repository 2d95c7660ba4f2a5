"""The metadata cache's KIP-232 rule: a response older than the cache for a
partition (smaller leader epoch) does not replace it, and triggers another refresh."""

from __future__ import annotations

import asyncio

import pytest
from client_fakes import StartBroker
from client_fakes import dead_port

from client.bootstrap_servers import parse_bootstrap_servers
from client.cluster import ClusterClient
from client.cluster import ClusterMetadata
from client.errors import LeaderNotAvailableError
from client.errors import NoBrokersAvailableError
from client.types import TopicPartition
from protocol.messages import MetadataBroker
from protocol.messages import MetadataPartition
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import MetadataTopic

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def response(
    epochs: dict[int, int],
    *,
    leader: int = 1,
    topic_id: str = "id1",
    brokers: tuple[int, ...] = (1,),
) -> MetadataResponse:
    return MetadataResponse(
        brokers=[MetadataBroker(node_id=b, host="127.0.0.1", port=9000 + b) for b in brokers],
        controller_id=0,
        topics=[
            MetadataTopic(
                name="t",
                topic_id=topic_id,
                partitions=[
                    MetadataPartition(
                        partition_index=p,
                        leader_id=leader,
                        leader_epoch=e,
                        replica_nodes=[1, 2],
                        isr_nodes=[1, 2],
                    )
                    for p, e in epochs.items()
                ],
            )
        ],
    )


def test_newer_epoch_replaces_the_entry() -> None:
    meta = ClusterMetadata()
    meta.update(response({0: 3, 1: 3}))
    update = meta.update(response({0: 4, 1: 3}, leader=2, brokers=(1, 2)))
    assert not update.stale
    assert meta.partition(TP0).leader_epoch == 4
    assert meta.partition(TP0).leader == 2
    assert set(meta.brokers) == {1, 2}


def test_older_epoch_is_ignored_for_that_partition_only() -> None:
    meta = ClusterMetadata()
    meta.update(response({0: 5, 1: 5}, leader=2, brokers=(1, 2)))
    # A lagging broker: partition 0 is older, partition 1 newer.
    update = meta.update(response({0: 4, 1: 6}, leader=1, brokers=(1,)))
    assert update.stale == [TP0]
    assert meta.partition(TP0).leader_epoch == 5
    assert meta.partition(TP0).leader == 2  # still the fresher leader
    assert meta.partition(TP1).leader_epoch == 6
    # The kept entry names broker 2, which the stale answer did not list: keep it.
    assert meta.broker(2) is not None


def test_unsafe_switch_accepts_an_older_epoch() -> None:
    """Test-only `unsafe_accept_stale_metadata`: the rule is off, the older view wins."""
    meta = ClusterMetadata(unsafe_accept_stale_metadata=True)
    meta.update(response({0: 5}, leader=2, brokers=(1, 2)))
    update = meta.update(response({0: 4}, leader=1))
    assert update.stale == [] and update.updated == [TP0]
    assert (meta.partition(TP0).leader, meta.partition(TP0).leader_epoch) == (1, 4)
    assert meta.last_seen_epoch(TP0) == 4


def test_same_epoch_replaces_the_entry() -> None:
    # An ISR change keeps the leader epoch: equal is not older.
    meta = ClusterMetadata()
    meta.update(response({0: 5}))
    assert not meta.update(response({0: 5})).stale


def test_unknown_epoch_sentinel_is_accepted() -> None:
    meta = ClusterMetadata()
    meta.update(response({0: 5}))
    assert not meta.update(response({0: -1})).stale
    assert meta.partition(TP0).leader_epoch == -1
    assert meta.last_seen_epoch(TP0) == 5  # still remembered


def test_last_seen_epoch_survives_a_broker_that_does_not_know_the_topic() -> None:
    meta = ClusterMetadata()
    meta.update(response({0: 7}))
    meta.update(
        MetadataResponse(
            brokers=[MetadataBroker(node_id=1, host="h", port=1)],
            topics=[MetadataTopic(name="t", error_code=3)],
        )
    )
    assert meta.partitions_for_topic("t") is None
    assert meta.update(response({0: 6})).stale == [TP0]


def test_recreated_topic_resets_epochs() -> None:
    meta = ClusterMetadata()
    meta.update(response({0: 7, 1: 7}))
    update = meta.update(response({0: 0, 1: 0}, topic_id="id2"))
    assert not update.stale
    assert meta.partition(TP0).leader_epoch == 0
    assert meta.topic_id("t") == "id2"


def test_leader_for_reports_no_leader() -> None:
    client = ClusterClient("127.0.0.1:1")
    client.metadata.update(response({0: 3}, leader=-1))
    with pytest.raises(LeaderNotAvailableError):
        client.leader_for(TP0)


def test_parse_bootstrap_servers() -> None:
    assert parse_bootstrap_servers("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_bootstrap_servers(["a"]) == [("a", 9092)]
    assert parse_bootstrap_servers("[::1]:9093") == [("::1", 9093)]
    for bad in ("", "a:x", "a:0", ","):
        with pytest.raises(ValueError):
            parse_bootstrap_servers(bad)


async def test_stale_response_keeps_cache_and_refreshes_again(start_broker: StartBroker) -> None:
    broker = await start_broker(2, leader_epoch=5)
    client = ClusterClient(broker.address, retry_backoff_ms=10)
    try:
        await client.bootstrap()
        await client.refresh_metadata(["t"])
        assert client.leader_for(TP0) == (1, 5)
        # The broker's image lags: it now reports epoch 4.
        broker.topics["t"][0].metadata_epoch = 4
        before = len(broker.requests_of(MetadataRequest))
        update = await client.refresh_metadata()
        assert update.stale == [TP0]
        assert client.leader_for(TP0) == (1, 5)
        # Another refresh was scheduled by itself; once the broker catches up, the
        # newer epoch is taken.
        broker.topics["t"][0].metadata_epoch = None
        broker.topics["t"][0].leader_epoch = 6
        for _ in range(100):
            if client.metadata.partition(TP0).leader_epoch == 6:
                break
            await asyncio.sleep(0.01)
        assert len(broker.requests_of(MetadataRequest)) > before + 1
        assert client.leader_for(TP0) == (1, 6)
    finally:
        await client.close()


async def test_stale_refreshes_are_bounded(start_broker: StartBroker) -> None:
    broker = await start_broker(1, leader_epoch=5)
    client = ClusterClient(broker.address, retry_backoff_ms=1, max_stale_refreshes=3)
    try:
        await client.bootstrap()
        await client.refresh_metadata(["t"])
        broker.topics["t"][0].metadata_epoch = 1  # stuck in the past
        before = len(broker.requests_of(MetadataRequest))
        await client.refresh_metadata()
        await asyncio.sleep(0.3)
        extra = len(broker.requests_of(MetadataRequest)) - before - 1
        assert 1 <= extra <= 3
        assert client.leader_for(TP0) == (1, 5)
    finally:
        await client.close()


async def test_bootstrap_tries_every_address_then_says_what_to_do() -> None:
    port = await dead_port()
    client = ClusterClient(f"127.0.0.1:{port}", bootstrap_retries=2, retry_backoff_ms=1)
    with pytest.raises(NoBrokersAvailableError) as info:
        await client.bootstrap()
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "minibroker dev" in str(info.value)
    await client.close()


async def test_bootstrap_skips_a_dead_address(start_broker: StartBroker) -> None:
    broker = await start_broker()
    client = ClusterClient(f"127.0.0.1:{await dead_port()},{broker.address}")
    try:
        await client.bootstrap()
        assert set(client.metadata.brokers) == {1}
    finally:
        await client.close()
