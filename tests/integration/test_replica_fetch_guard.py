"""A client posing as a follower (issue 18). The attack as the issue found it: with the
real follower frozen, a client sends Fetches under its replica id and broker epoch, the
leader counts it in sync and acknowledges an acks=all, min.insync.replicas=2 write that
the next leader does not have.

The protection: a Fetch with a replica id is honoured only on the inter-broker listener
(the first; Kafka's inter.broker.listener.name), which an operator keeps to the brokers
(a private network, or SSL with --ssl-client-auth required); on a client listener it is
answered CLUSTER_AUTHORIZATION_FAILED and changes nothing. Shown here with a second
native listener for clients: the spoof is refused there, the write is not acknowledged
while the real follower is frozen; the same Fetch on the inter-broker listener is served
(the protection is the listener's, so that is where access must be kept to brokers).
"""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import pytest

from client import AsyncAdmin
from client import AsyncProducer
from client.errors import MinibrokerError
from protocol.errors import ErrorCode
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from tests.integration.cluster import Cluster
from tests.integration.cluster import TestClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = "guarded"


def clients_address(log: str) -> tuple[str, int]:
    found = re.search(r"CLIENTS://([\w.-]+):(\d+)", log)
    assert found is not None, log
    return found[1], int(found[2])


def spoof(follower: int, epoch: int, offset: int) -> FetchRequest:
    return FetchRequest(
        replica_id=follower,
        replica_epoch=epoch,
        max_wait_ms=0,
        topics=[
            FetchTopic(topic=TOPIC, partitions=[FetchPartition(partition=0, fetch_offset=offset)])
        ],
    )


async def test_a_replica_fetch_is_honoured_only_on_the_inter_broker_listener(
    tmp_path: Path,
) -> None:
    c = Cluster(tmp_path)
    c.root.mkdir(exist_ok=True)
    try:
        c.start_controller()
        c.start_brokers((1, 2), "--listeners", "PLAINTEXT://127.0.0.1:0,CLIENTS://127.0.0.1:0")
        clients = {n: clients_address(b.log_text()) for n, b in c.brokers.items()}
        bootstrap = ",".join(f"{h}:{p}" for h, p in clients.values())
        async with AsyncAdmin(bootstrap) as admin:
            await admin.create_topic(TOPIC, 1, 2, configs={"min.insync.replicas": "2"})
            (desc,) = await admin.describe_topics([TOPIC])
            cluster = await admin.describe_cluster()
        leader = desc.partitions[0].leader
        follower = next(n for n in (1, 2) if n != leader)
        epoch = next(b.broker_epoch for b in cluster.brokers if b.node_id == follower)

        c.brokers[follower].popen.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            async with AsyncProducer(
                bootstrap,
                acks="all",
                linger_ms=0,
                request_timeout_ms=3_000,
                delivery_timeout_ms=6_000,
                retry_backoff_ms=200,
            ) as producer:
                send = asyncio.ensure_future(producer.send_and_wait(TOPIC, b"x", partition=0))
                await asyncio.sleep(0.5)
                async with TestClient(*clients[leader]) as attacker:
                    for offset in (0, 1, 1, 1):  # keep "catching up" as the follower would
                        answer = await attacker.call(spoof(follower, epoch, offset))
                        assert isinstance(answer, FetchResponse)
                        assert answer.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                        await asyncio.sleep(0.3)
                with pytest.raises(MinibrokerError):
                    await send  # never acknowledged: the only follower is frozen
        finally:
            c.brokers[follower].popen.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        assert "refused a Fetch as replica" in c.brokers[leader].log_text()
        # The inter-broker listener serves the same request: it is the one to keep
        # to the brokers.
        async with TestClient(*c.brokers[leader].address) as broker_side:
            answer = await broker_side.call(spoof(follower, epoch, 0))
            assert isinstance(answer, FetchResponse) and answer.error_code == 0
    finally:
        c.stop_all()
