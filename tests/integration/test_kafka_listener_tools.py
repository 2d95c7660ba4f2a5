"""aiokafka 0.14.0 and kcat 1.7.1 (Debian's package, on librdkafka 2.0, before KIP-320)
through the brokers' Kafka listeners, unmodified: neither checks leader epochs, both
only need to keep working (../shared/kafka-clients.md).

- aiokafka: its admin creates a topic, its idempotent acks=all producer writes with every
  codec (v0 InitProducerId, Produce <= 7), its consumer (Fetch <= 11, Metadata <= 5)
  reads everything once and commits.
- kcat (installed by tests/install_tools.sh; missing, these tests say so loudly and fail
  with CI set): lists the cluster, produces lines with each codec, consumes them back;
  the README's kcat example runs as written.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from cluster import Cluster

from tests.integration.cluster import REPO
from tests.integration.test_kafka_listener import CODECS
from tests.integration.test_kafka_listener import PARTITIONS
from tests.integration.test_kafka_listener import PER_CODEC
from tests.integration.test_kafka_listener import TOPIC
from tests.integration.test_kafka_listener import assert_exactly_once
from tests.integration.test_kafka_listener import cluster  # noqa: F401 (the fixture)
from tests.integration.test_kafka_listener import create_topic
from tests.integration.test_readme_examples import README_KAFKA_ADDRESS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


async def test_aiokafka_creates_produces_with_every_codec_reads_and_commits(
    cluster: Cluster,  # noqa: F811
) -> None:
    bootstrap = cluster.kafka_bootstrap()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([AioNewTopic(TOPIC, PARTITIONS, 3)])
    finally:
        await admin.close()

    sent: list[bytes] = []
    for codec in CODECS:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, compression_type=codec
        )
        await producer.start()
        try:
            values = [f"{codec}-{i}".encode() for i in range(PER_CODEC)]
            for value in values:
                await producer.send(TOPIC, value=value, key=value)
            await producer.flush()
            sent += values
        finally:
            await producer.stop()

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id="aio-readers", enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [AioTopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 60
        while len(got) < len(sent) and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=1_000)).values():
                got += [(r.partition, r.offset, r.value) for r in records]
        assert_exactly_once(got, sent)
        await consumer.commit()
        committed = await consumer.committed(tps[0])
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    assert committed == ends[tps[0]]


def kcat() -> str:
    path = shutil.which("kcat")
    if path is None:
        reason = "kcat is not installed: run tests/install_tools.sh (apt-get install kcat)"
        if os.environ.get("CI"):
            pytest.fail(f"KCAT TESTS CANNOT RUN IN CI: {reason}")
        pytest.skip(f"KCAT TESTS SKIPPED: {reason}")
    return path


def run_kcat(*args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [kcat(), *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"kcat {' '.join(args)} failed:\n{proc.stderr}"
    return proc.stdout


async def test_kcat_lists_produces_with_every_codec_and_consumes(
    cluster: Cluster,  # noqa: F811
) -> None:
    kcat()
    await create_topic(cluster)
    bootstrap = cluster.kafka_bootstrap()
    listing = run_kcat("-b", bootstrap, "-L", "-t", TOPIC)
    assert f'topic "{TOPIC}" with {PARTITIONS} partitions' in listing
    assert "3 brokers" in listing

    sent: list[str] = []
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        lines = [f"kcat-{codec}-{i}" for i in range(PER_CODEC)]
        run_kcat(
            "-b",
            bootstrap,
            "-P",
            "-t",
            TOPIC,
            "-z",
            codec,
            "-X",
            "acks=all",
            stdin="\n".join(lines),
        )
        sent += lines
    out = run_kcat("-b", bootstrap, "-C", "-t", TOPIC, "-o", "beginning", "-e", "-q")
    assert sorted(out.split()) == sorted(sent)


def readme_kcat_block() -> str:
    text = (REPO / "README.md").read_text()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "kcat -b" in b]
    assert len(blocks) == 1, "the README has one kcat example"
    return blocks[0]


def test_readme_kcat_example_runs_as_written(cluster: Cluster) -> None:  # noqa: F811
    """The README's kcat lines, against this cluster instead of `minibroker dev`'s ports:
    minibroker's CLI creates the topic (kcat cannot), kcat lists, produces, consumes."""
    kcat()
    host, port = cluster.brokers[1].address
    script = readme_kcat_block().replace(README_KAFKA_ADDRESS, cluster.kafka_bootstrap())
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "MINIBROKER_BOOTSTRAP_SERVERS": f"{host}:{port}",
    }
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"README kcat example failed:\n{script}\n{proc.stderr}"
    assert 'topic "from-kcat" with 1 partitions' in proc.stdout
    assert proc.stdout.split()[-5:] == ["1", "2", "3", "4", "5"]
