"""`minibroker group list|describe|reset-offsets|delete` on a real cluster, run as a
user runs them, around a real group: a minibroker consumer subscribed in group
"tools" commits what it read; the tools show the member, its partitions, the
committed offsets with their leader epochs and the lag; resetting is refused while
the group has members and works once it is empty (a dry run first); deleting removes
the group and its offsets."""

from __future__ import annotations

import asyncio

import pytest
from cluster import Cluster
from cluster import mb

from client import AsyncAdmin
from client import AsyncConsumer
from client import AsyncProducer
from client import NewTopic
from tests.integration.test_kafka_listener import native_bootstrap

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GROUP = "tools"
TOPIC = "tooled"
RECORDS = 30


def ok(*args: str) -> str:
    result = mb(*args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def rows(out: str, first: str) -> list[list[str]]:
    """The table rows of `out` whose first column is `first`."""
    return [line.split() for line in out.splitlines() if line.split()[:1] == [first]]


async def test_group_tools_around_a_live_group(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_brokers((1, 2, 3), "--group-initial-rebalance-delay-ms", "0")
    bootstrap = native_bootstrap(cluster)
    async with AsyncAdmin(bootstrap) as admin:
        await admin.create_topics([NewTopic(TOPIC, 2, 3)], timeout_ms=20_000)
    async with AsyncProducer(bootstrap, acks="all") as producer:
        for i in range(RECORDS):
            await (await producer.send(TOPIC, value=b"v%d" % i, partition=i % 2))

    consumer = AsyncConsumer(
        bootstrap, group_id=GROUP, auto_offset_reset="earliest", session_timeout_ms=6_000
    )
    await consumer.start()
    consumer.subscribe([TOPIC])
    read = 0
    async with asyncio.timeout(60):
        while read < RECORDS:
            read += sum(len(rs) for rs in (await consumer.poll(timeout_ms=500)).values())
    await consumer.commit()
    b = ["-b", bootstrap]

    listed = ok("group", "list", *b)
    assert rows(listed, GROUP)[0][1] == "Stable"
    described = ok("group", "describe", GROUP, *b)
    assert "state Stable" in described and "1 member" in described
    assert f"{TOPIC}-0,{TOPIC}-1" in described  # the member owns both partitions
    for row in rows(described, TOPIC):
        # committed at the log end, with the leader epoch of the last record read: no lag
        assert row[2] == row[4] == str(RECORDS // 2) and row[3] == "0" and row[5] == "0", row

    refused = mb("group", "reset-offsets", GROUP, "-t", TOPIC, "--to-earliest", "--execute", *b)
    assert refused.returncode == 1
    assert "stop its consumers first" in refused.stderr

    await consumer.close()  # commits and leaves: the group is empty
    assert rows(ok("group", "list", *b), GROUP)[0][1] == "Empty"
    dry = mb("group", "reset-offsets", GROUP, "-t", f"{TOPIC}:1", "--to-earliest", *b)
    assert dry.returncode == 0 and "dry run" in dry.stderr
    assert rows(dry.stdout, TOPIC) == [[TOPIC, "1", str(RECORDS // 2), "0", "0"]]
    assert rows(ok("group", "describe", GROUP, *b), TOPIC)[1][2] == str(RECORDS // 2)
    ok("group", "reset-offsets", GROUP, "-t", f"{TOPIC}:1", "--to-earliest", "--execute", *b)
    lag = {int(r[1]): r for r in rows(ok("group", "describe", GROUP, *b), TOPIC)}
    assert (lag[0][2], lag[0][5]) == (str(RECORDS // 2), "0")
    assert (lag[1][2], lag[1][5]) == ("0", str(RECORDS // 2))

    # A time after every record: the log end, as Kafka resets to a time past the end.
    future = ok("group", "reset-offsets", GROUP, "-t", TOPIC, "--to-datetime", "2999-01-01", *b)
    assert [r[3] for r in rows(future, TOPIC)] == [str(RECORDS // 2)] * 2
    bad = mb("group", "reset-offsets", GROUP, "-t", TOPIC, "--to-datetime", "soon", *b)
    assert bad.returncode == 1 and "not an ISO date-time" in bad.stderr

    ok("group", "delete", GROUP, *b)
    assert rows(ok("group", "list", *b), GROUP) == []
    again = mb("group", "delete", GROUP, *b)
    assert again.returncode == 1 and "GROUP_ID_NOT_FOUND" in again.stderr
