"""One consumer-group member in its own process, for the group tests: a real client
(kafka-python, confluent-kafka or aiokafka through the Kafka listener, or
minibroker's own through the native one) subscribes to a topic in a
group, commits after every batch it is given and when partitions are revoked, and
reports on stdout, one JSON object a line:

    {"event": "assigned", "partitions": [0, 3]}        after every rebalance
    {"event": "delivered", "records": [[p, offset, value], ...]}   before its commit
    {"event": "closed"}                                 after a clean leave (SIGTERM)

    python tests/integration/group_member.py CLIENT BOOTSTRAP TOPIC GROUP [SESSION_MS]
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

POLL_S = 0.2
stopping = False


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def on_sigterm(_signum: int, _frame: Any) -> None:
    global stopping
    stopping = True


def kafka_python(bootstrap: str, topic: str, group: str, session_ms: int) -> None:
    from kafka import ConsumerRebalanceListener
    from kafka import KafkaConsumer

    # With auto commit on, kafka-python commits what was consumed before it rejoins
    # (its commit on revoke) and on close; the long interval leaves the rest to the
    # commit after every batch below.
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        client_id="kafka-python-member",
        enable_auto_commit=True,
        auto_commit_interval_ms=600_000,
        auto_offset_reset="earliest",
        session_timeout_ms=session_ms,
        heartbeat_interval_ms=max(100, session_ms // 6),
    )

    class ReportAssignment(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, assigned: Any) -> None:
            report("assigned", partitions=sorted(tp.partition for tp in assigned))

    consumer.subscribe([topic], listener=ReportAssignment())
    while not stopping:
        batches = consumer.poll(timeout_ms=int(POLL_S * 1000))
        records = [[r.partition, r.offset, r.value.decode()] for rs in batches.values() for r in rs]
        if records:
            report("delivered", records=records)
            consumer.commit()
    consumer.close()  # commits, leaves the group
    report("closed")


def confluent(bootstrap: str, topic: str, group: str, session_ms: int) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": "confluent-member",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(100, session_ms // 6),
        }
    )

    def on_assign(_consumer: Any, partitions: Any) -> None:
        report("assigned", partitions=sorted(tp.partition for tp in partitions))

    def on_revoke(c: Any, partitions: Any) -> None:
        if partitions:
            try:
                c.commit(asynchronous=False)
            except Exception as exc:  # nothing consumed since the last commit
                if "NO_OFFSET" not in str(exc):
                    raise

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    while not stopping:
        messages = consumer.consume(num_messages=500, timeout=POLL_S)
        records = []
        for m in messages:
            if m.error() is not None:
                raise RuntimeError(f"consume error: {m.error()}")
            records.append([m.partition(), m.offset(), m.value().decode()])
        if records:
            report("delivered", records=records)
            consumer.commit(asynchronous=False)
    consumer.close()  # leaves the group
    report("closed")


def aiokafka(bootstrap: str, topic: str, group: str, session_ms: int) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka import ConsumerRebalanceListener

    async def run() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            client_id="aiokafka-member",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=max(100, session_ms // 6),
        )

        class CommitOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                if revoked:
                    await consumer.commit()

            async def on_partitions_assigned(self, assigned: Any) -> None:
                report("assigned", partitions=sorted(tp.partition for tp in assigned))

        await consumer.start()
        consumer.subscribe([topic], listener=CommitOnRevoke())
        while not stopping:
            batches = await consumer.getmany(timeout_ms=int(POLL_S * 1000))
            records = [
                [r.partition, r.offset, r.value.decode()] for rs in batches.values() for r in rs
            ]
            if records:
                report("delivered", records=records)
                await consumer.commit()
        await consumer.stop()  # leaves the group
        report("closed")

    asyncio.run(run())


def minibroker(bootstrap: str, topic: str, group: str, session_ms: int) -> None:
    import asyncio

    from client import AsyncConsumer

    class ReportAssignment:
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, assigned: Any) -> None:
            report("assigned", partitions=sorted(tp.partition for tp in assigned))

    async def run() -> None:
        # commit_on_revoke (the default) commits the consumed positions before a
        # rebalance takes partitions away and on close.
        consumer = AsyncConsumer(
            bootstrap,
            group_id=group,
            client_id="minibroker-member",
            auto_offset_reset="earliest",
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=max(100, session_ms // 6),
        )
        await consumer.start()
        consumer.subscribe([topic], listener=ReportAssignment())
        while not stopping:
            batches = await consumer.poll(timeout_ms=int(POLL_S * 1000))
            records = [
                [r.partition, r.offset, r.value.decode()] for rs in batches.values() for r in rs
            ]
            if records:
                report("delivered", records=records)
                await consumer.commit()
        await consumer.close()  # commits, leaves the group
        report("closed")

    asyncio.run(run())


CLIENTS = {
    "kafka-python": kafka_python,
    "confluent": confluent,
    "aiokafka": aiokafka,
    "minibroker": minibroker,
}

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    client, bootstrap, topic, group = sys.argv[1:5]
    session = int(sys.argv[5]) if len(sys.argv) > 5 else 6_000
    CLIENTS[client](bootstrap, topic, group, session)
