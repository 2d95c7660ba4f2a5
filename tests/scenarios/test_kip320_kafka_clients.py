"""KIP-320 with Kafka's own clients (issue 15), DESIGN section 11 scenario 5 through
the brokers' Kafka listeners:

    "unclean election truncates the log; a consumer with reset policy none gets
    LogTruncationError with the exact divergence offset."

Invariant protected: a real Kafka client never returns records of the new lineage as
if they followed records of the truncated one. kafka-python 3.0.12 learns it from Fetch
v12's DivergingEpoch and raises LogTruncationError with the first diverging offset;
librdkafka 2.16 (confluent-kafka) validates its position with OffsetForLeaderEpoch v2
when the leader epoch rises and reports "Partition log truncation detected" with the
broker's end offset. Either way the divergence offset is the same one minibroker's own
consumer gets, and seeking there reads the new lineage exactly.

Protection off, shown by a client without KIP-320: aiokafka 0.14 sends no leader
epochs, so at position 9 it reads on in the new lineage (offsets 9-10, "new-4",
"new-5") without being told, having skipped "new-0..3": the anomaly KIP-320 exists for.

Staging: the unclean divergence of scenario 3 (`stage_unclean_divergence`): replicas
[1, 2, 3] (min.insync.replicas 1, unclean election on), offsets 0-4 everywhere (epoch
E0), 5-8 on broker 1 only, read by both clients (position 9 at E0); broker 1 killed,
broker 2 elected uncleanly at E2 with "new-0..5" at 5-10. Both clients bootstrap from
broker 4, which is no replica and stays up: Metadata names only live brokers, so a
client that had only seen broker 1 would otherwise never find broker 2.
"""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import KafkaError
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition
from kafka.errors import LogTruncationError as KafkaPythonLogTruncationError

from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import scenario_cluster
from tests.scenarios.test_kip101_appendix_unclean_divergence import BROKER_FLAGS
from tests.scenarios.test_kip101_appendix_unclean_divergence import DIVERGENCE
from tests.scenarios.test_kip101_appendix_unclean_divergence import IN_SYNC
from tests.scenarios.test_kip101_appendix_unclean_divergence import NEW
from tests.scenarios.test_kip101_appendix_unclean_divergence import NODES
from tests.scenarios.test_kip101_appendix_unclean_divergence import ONLY_ON_1
from tests.scenarios.test_kip101_appendix_unclean_divergence import SESSION_MS
from tests.scenarios.test_kip101_appendix_unclean_divergence import TOPIC
from tests.scenarios.test_kip101_appendix_unclean_divergence import Staged
from tests.scenarios.test_kip101_appendix_unclean_divergence import stage_unclean_divergence

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(240)]

OBSERVER = 4  # no replica of the topic; up throughout; the clients' bootstrap
OLD = IN_SYNC + ONLY_ON_1
WAIT_S = 60


def confluent_poll(consumer: ConfluentConsumer, count: int) -> list[Any]:
    """Up to `count` records or errors, whatever comes first, within WAIT_S."""
    out: list[Any] = []
    deadline = time.monotonic() + WAIT_S
    while len(out) < count and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is None:
            continue
        out.append(message.error() or message)
        if message.error() is not None:
            break
    return out


async def aio_read(consumer: AIOKafkaConsumer, count: int) -> list[tuple[int, bytes]]:
    """(offset, value) of the next `count` records (fewer if WAIT_S passes)."""
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + WAIT_S
    while len(out) < count and time.monotonic() < deadline:
        fetched = await consumer.getmany(timeout_ms=1_000, max_records=count - len(out))
        out += [(m.offset, m.value) for records in fetched.values() for m in records]
    return out


async def test_kafka_clients_report_the_truncation_at_the_divergence_offset(
    tmp_path: Path,
) -> None:
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    with scenario_cluster(tmp_path) as c:
        c.start_controller(session_timeout_ms=SESSION_MS)
        c.start_brokers([*NODES, OBSERVER], *BROKER_FLAGS, kafka=True)
        clients: dict[str, Any] = {}

        async def both_clients_read_the_old_lineage(c: ScenarioCluster, s: Staged) -> None:
            bootstrap = c.brokers[OBSERVER].kafka_address
            python = KafkaConsumer(
                bootstrap_servers=bootstrap,
                enable_auto_commit=False,
                auto_offset_reset="none",
                consumer_timeout_ms=WAIT_S * 1000,
            )
            python.assign([KTopicPartition(TOPIC, 0)])
            python.seek(KTopicPartition(TOPIC, 0), 0)
            read = list(itertools.islice(python, len(OLD)))
            assert [(m.offset, m.value, m.leader_epoch) for m in read] == [
                (i, v, s.e0) for i, v in enumerate(OLD)
            ]
            librdkafka = ConfluentConsumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": "kip320-confluent",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "error",  # librdkafka's policy "none"
                }
            )
            librdkafka.assign([ConfluentTopicPartition(TOPIC, 0, 0)])
            records = confluent_poll(librdkafka, len(OLD))
            assert [(m.offset(), m.value(), m.leader_epoch()) for m in records] == [
                (i, v, s.e0) for i, v in enumerate(OLD)
            ]
            aio = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
            await aio.start()
            aio.assign([AioTopicPartition(TOPIC, 0)])
            aio.seek(AioTopicPartition(TOPIC, 0), 0)
            assert [v for _, v in await aio_read(aio, len(OLD))] == OLD
            clients.update(python=python, librdkafka=librdkafka, aio=aio)

        s = await stage_unclean_divergence(
            c, [], before_leader_dies=both_clients_read_the_old_lineage
        )
        python, librdkafka, aio = clients["python"], clients["librdkafka"], clients["aio"]
        try:
            # kafka-python: Fetch v12 answered with DivergingEpoch (E0 ends at 5).
            with pytest.raises(KafkaPythonLogTruncationError) as raised:
                next(iter(python))
            (divergent,) = raised.value.divergent_offsets.values()
            assert (divergent.offset, divergent.leader_epoch) == (DIVERGENCE, s.e0)
            python.seek(KTopicPartition(TOPIC, 0), DIVERGENCE)
            after = list(itertools.islice(python, len(NEW)))
            assert [(m.offset, m.value) for m in after] == list(enumerate(NEW, start=DIVERGENCE))

            # librdkafka: its OffsetForLeaderEpoch validation finds the end offset 5.
            (error,) = confluent_poll(librdkafka, 1)
            assert isinstance(error, KafkaError), error
            assert error.code() == KafkaError._AUTO_OFFSET_RESET
            assert "truncation detected at offset 9" in error.str()
            assert f"end offset is {DIVERGENCE}" in error.str()
            # The partition stays in error until assigned again, here at the divergence.
            librdkafka.unassign()
            librdkafka.assign([ConfluentTopicPartition(TOPIC, 0, DIVERGENCE)])
            records = confluent_poll(librdkafka, len(NEW))
            assert [(m.offset(), m.value()) for m in records] == list(
                enumerate(NEW, start=DIVERGENCE)
            )
            # Without KIP-320: the new lineage's records after its position, silently.
            unseen = NEW[len(OLD) - DIVERGENCE :]
            assert await aio_read(aio, len(unseen)) == list(enumerate(unseen, start=len(OLD)))
        finally:
            python.close()
            librdkafka.close()
            await aio.stop()
