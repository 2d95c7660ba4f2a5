"""One consumer-group member in its own process, for the group tests: a real client
(kafka-python, confluent-kafka or aiokafka through the Kafka listener, or
minibroker's own through the native one) subscribes to a topic in a
group, commits after every batch it is given and when partitions are revoked, and
reports on stdout, one JSON object a line:

    {"event": "assigned", "partitions": [0, 3]}        after every rebalance
    {"event": "delivered", "records": [[p, offset, value], ...]}   before its commit
    {"event": "closed"}                                 after a clean leave (SIGTERM)
    {"event": "commit_failed", "reason": "..."}         a commit refused for good

A commit that fails with a retriable error (the coordinator moved) is retried for up
to COMMIT_RETRY_S, as an application would.

    python tests/integration/group_member.py CLIENT BOOTSTRAP TOPIC GROUP [SESSION_MS
        [ASSIGNOR [INSTANCE_ID]]]

ASSIGNOR "cooperative-sticky" makes every client rebalance cooperatively (KIP-429);
without it, each client's default assignors (eager). INSTANCE_ID makes a minibroker
member static (group_instance_id, KIP-345).
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

POLL_S = 0.2
COMMIT_RETRY_S = 30.0
stopping = False


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


owned: set[int] = set()  # this member's partitions, as its callbacks told them


def gained(partitions: Any) -> None:
    """Partitions assigned (all of them with an eager assignor, only the new ones with
    a cooperative one): the whole assignment is reported."""
    owned.update(tp.partition for tp in partitions)
    report("assigned", partitions=sorted(owned))


def lost(partitions: Any) -> None:
    owned.difference_update(tp.partition for tp in partitions)
    report("assigned", partitions=sorted(owned))


def commit_retrying(commit: Any, retriable: Any) -> None:
    """commit() until it succeeds or fails for a reason retrying cannot fix."""
    import time

    deadline = time.monotonic() + COMMIT_RETRY_S
    while True:
        try:
            commit()
            return
        except Exception as exc:
            if not retriable(exc) or time.monotonic() > deadline:
                report("commit_failed", reason=repr(exc))
                return
            time.sleep(0.1)


async def commit_retrying_async(commit: Any, retriable: Any) -> None:
    import asyncio
    import time

    deadline = time.monotonic() + COMMIT_RETRY_S
    while True:
        try:
            await commit()
            return
        except Exception as exc:
            if not retriable(exc) or time.monotonic() > deadline:
                report("commit_failed", reason=repr(exc))
                return
            await asyncio.sleep(0.1)


async def consume_until_stopped(poll: Any, commit: Any, retriable: Any) -> None:
    """An asyncio client's loop: poll, report what was delivered, commit it."""
    while not stopping:
        batches = await poll()
        records = [[r.partition, r.offset, r.value.decode()] for rs in batches.values() for r in rs]
        if records:
            report("delivered", records=records)
            await commit_retrying_async(commit, retriable)


def on_sigterm(_signum: int, _frame: Any) -> None:
    global stopping
    stopping = True


def kafka_python(bootstrap: str, topic: str, group: str, session_ms: int, assignor: str) -> None:
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
        **kafka_python_assignors(assignor),
    )

    class ReportAssignment(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            lost(revoked)

        def on_partitions_assigned(self, assigned: Any) -> None:
            gained(assigned)

        def on_partitions_lost(self, partitions: Any) -> None:
            lost(partitions)

    consumer.subscribe([topic], listener=ReportAssignment())
    while not stopping:
        batches = consumer.poll(timeout_ms=int(POLL_S * 1000))
        records = [[r.partition, r.offset, r.value.decode()] for rs in batches.values() for r in rs]
        if records:
            report("delivered", records=records)
            commit_retrying(consumer.commit, lambda e: getattr(e, "retriable", False))
    consumer.close()  # commits, leaves the group
    report("closed")


def kafka_python_assignors(assignor: str) -> dict[str, Any]:
    if assignor != "cooperative-sticky":
        return {}
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor

    return {"partition_assignment_strategy": (CooperativeStickyAssignor,)}


def librdkafka_retriable(exc: Exception) -> bool:
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError):
        return False
    # Waiting for the coordinator, or a transport error while it moves.
    return bool(error.retriable()) or error.code() in (
        KafkaError._WAIT_COORD,
        KafkaError._TRANSPORT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    )


def confluent(bootstrap: str, topic: str, group: str, session_ms: int, assignor: str) -> None:
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
            **({"partition.assignment.strategy": assignor} if assignor else {}),
        }
    )

    def on_assign(_consumer: Any, partitions: Any) -> None:
        gained(partitions)

    def on_revoke(c: Any, partitions: Any) -> None:
        # Commit what was consumed before the partitions go (a lost membership goes to
        # on_lost instead: its generation is gone, nothing to commit to).
        if partitions:
            try:
                c.commit(asynchronous=False)
            except Exception as exc:  # nothing consumed since the last commit, or refused
                if "NO_OFFSET" not in str(exc):
                    report("commit_failed", reason=repr(exc))
        lost(partitions)

    def on_lost(_consumer: Any, partitions: Any) -> None:
        lost(partitions)

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    while not stopping:
        messages = consumer.consume(num_messages=500, timeout=POLL_S)
        records = []
        for m in messages:
            if m.error() is not None:
                raise RuntimeError(f"consume error: {m.error()}")
            records.append([m.partition(), m.offset(), m.value().decode()])
        if records:
            report("delivered", records=records)
            commit_retrying(lambda: consumer.commit(asynchronous=False), librdkafka_retriable)
    consumer.close()  # leaves the group
    report("closed")


def aiokafka_retriable(exc: Exception) -> bool:
    return bool(getattr(exc, "retriable", False))


def aiokafka(bootstrap: str, topic: str, group: str, session_ms: int, assignor: str) -> None:
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
                lost(revoked)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                gained(assigned)

        await consumer.start()
        consumer.subscribe([topic], listener=CommitOnRevoke())
        poll = lambda: consumer.getmany(timeout_ms=int(POLL_S * 1000))  # noqa: E731
        await consume_until_stopped(poll, consumer.commit, aiokafka_retriable)
        await consumer.stop()  # leaves the group
        report("closed")

    asyncio.run(run())


def minibroker(
    bootstrap: str, topic: str, group: str, session_ms: int, assignor: str, instance: str = ""
) -> None:
    import asyncio

    from client import AsyncConsumer

    class ReportAssignment:
        def on_partitions_revoked(self, revoked: Any) -> None:
            lost(revoked)

        def on_partitions_assigned(self, assigned: Any) -> None:
            gained(assigned)

        def on_partitions_lost(self, partitions: Any) -> None:
            lost(partitions)

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
            **({"partition_assignment_strategy": [assignor]} if assignor else {}),
            group_instance_id=instance or None,
        )
        await consumer.start()
        consumer.subscribe([topic], listener=ReportAssignment())
        poll = lambda: consumer.poll(timeout_ms=int(POLL_S * 1000))  # noqa: E731
        # commit() retries what is retriable itself (default_api_timeout_ms)
        await consume_until_stopped(poll, consumer.commit, lambda e: False)
        await consumer.close()  # commits, leaves the group (a static member stays)
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
    assignor = sys.argv[6] if len(sys.argv) > 6 else ""
    if len(sys.argv) > 7:
        minibroker(bootstrap, topic, group, session, assignor, sys.argv[7])
    else:
        CLIENTS[client](bootstrap, topic, group, session, assignor)
