"""Incremental fetch sessions (KIP-227) over real sockets, attacked from outside: a
peer on the inter-broker listener that claims the follower's replica id keeps opening
sessions (each replaces the follower's own), sends out-of-order epochs and ids it
made up, and a fetch shaped as before sessions. The real follower starts over each
time its session is gone, so acks=all writes with min.insync.replicas=2 keep being
acknowledged, and the leader answers every lie with the session errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from client import AsyncAdmin
from client import AsyncProducer
from protocol.errors import ErrorCode
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from tests.integration.cluster import Cluster
from tests.integration.cluster import TestClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = "sessions"
WRITES = 20


def fetch(
    replica: int, epoch: int, *, session_id: int = 0, session_epoch: int = -1
) -> FetchRequest:
    return FetchRequest(
        replica_id=replica,
        replica_epoch=epoch,
        max_wait_ms=0,
        topics=[FetchTopic(topic=TOPIC, partitions=[FetchPartition(partition=0, fetch_offset=0)])],
        session_id=session_id,
        session_epoch=session_epoch,
    )


async def test_a_peer_lying_about_sessions_does_not_stop_replication(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    c.root.mkdir(exist_ok=True)
    try:
        c.start_controller()
        c.start_brokers((1, 2))
        bootstrap = ",".join(f"{b.host}:{b.port}" for b in c.brokers.values())
        async with AsyncAdmin(bootstrap) as admin:
            await admin.create_topic(TOPIC, 1, 2, configs={"min.insync.replicas": "2"})
            (desc,) = await admin.describe_topics([TOPIC])
            cluster = await admin.describe_cluster()
        leader = desc.partitions[0].leader
        follower = next(n for n in (1, 2) if n != leader)
        epoch = next(b.broker_epoch for b in cluster.brokers if b.node_id == follower)

        async def lie() -> list[int]:
            codes: list[int] = []
            async with TestClient(*c.brokers[leader].address) as peer:
                for _ in range(15):
                    # A fetch as sent before sessions: served in full, no session.
                    old = await peer.call(fetch(follower, epoch))
                    assert isinstance(old, FetchResponse) and old.session_id == 0
                    # The follower's id, a new session: the real one's is replaced.
                    opened = await peer.call(fetch(follower, epoch, session_epoch=0))
                    assert isinstance(opened, FetchResponse) and opened.session_id != 0
                    for session_id, session_epoch in (
                        (opened.session_id, 5),  # out of order
                        (opened.session_id ^ 0x5A5A, 1),  # made up
                    ):
                        answer = await peer.call(
                            fetch(
                                follower,
                                epoch,
                                session_id=session_id,
                                session_epoch=session_epoch,
                            )
                        )
                        assert isinstance(answer, FetchResponse)
                        codes.append(answer.error_code)
                    await asyncio.sleep(0.1)
            return codes

        async with AsyncProducer(bootstrap, acks="all", linger_ms=0) as producer:
            liar = asyncio.ensure_future(lie())
            for i in range(WRITES):
                # Each write waits for the follower: it kept (re)opening its session.
                await asyncio.wait_for(
                    producer.send_and_wait(TOPIC, f"v{i}".encode(), partition=0), 10
                )
                await asyncio.sleep(0.05)
            codes = await liar
        assert set(codes) <= {
            ErrorCode.INVALID_FETCH_SESSION_EPOCH,
            ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
        }
        assert ErrorCode.INVALID_FETCH_SESSION_EPOCH in codes
        assert ErrorCode.FETCH_SESSION_ID_NOT_FOUND in codes
        async with AsyncAdmin(bootstrap) as admin:
            (desc,) = await admin.describe_topics([TOPIC])
        assert desc.partitions[0].high_watermark == WRITES
        assert sorted(desc.partitions[0].isr) == [1, 2]
        assert "Traceback" not in c.brokers[leader].log_text()
    finally:
        c.stop_all()
