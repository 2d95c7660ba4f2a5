"""The blocking API (client/sync.py) from plain threads, against the in-test broker
running on its own loop thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from client_fakes import FakeBroker

from client.errors import IllegalStateError
from client.errors import LogTruncationError
from client.sync import Admin
from client.sync import Consumer
from client.sync import Producer
from client.types import OffsetAndMetadata
from client.types import TopicPartition

T0 = TopicPartition("t", 0)


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    b = FakeBroker()
    b.create_topic("t", 2, leader_epoch=1)
    asyncio.run_coroutine_threadsafe(b.start(), loop).result(5)
    b.loop = loop  # type: ignore[attr-defined]
    yield b
    asyncio.run_coroutine_threadsafe(b.stop(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def on_broker_loop(broker: FakeBroker, fn) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        fn()

    asyncio.run_coroutine_threadsafe(run(), broker.loop).result(5)  # type: ignore[attr-defined]


def test_produce_consume_admin_from_a_plain_thread(broker: FakeBroker) -> None:
    errors: list[BaseException] = []
    seen: dict[str, object] = {}

    def script() -> None:
        try:
            with Producer(broker.address, linger_ms=0) as producer:
                futures = [producer.send("t", b"v%d" % i, partition=0) for i in range(5)]
                producer.flush()
                seen["offsets"] = [f.result(5).offset for f in futures]
                seen["last"] = producer.send_and_wait("t", b"v5", partition=0).offset
            with Consumer(broker.address, auto_offset_reset="earliest") as consumer:
                consumer.assign([T0])
                records = []
                for _ in range(50):
                    for rs in consumer.poll(200).values():
                        records.extend(rs)
                    if len(records) >= 6:
                        break
                seen["values"] = [r.value for r in records]
                seen["position"] = consumer.position_with_epoch(T0)
                seen["ends"] = consumer.end_offsets([T0])
            with Admin(broker.address) as admin:
                seen["topics"] = admin.list_topics()
                seen["offsets_admin"] = admin.list_offsets({T0: "latest"})
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=script)
    thread.start()
    thread.join(30)
    assert not errors, errors
    assert seen["offsets"] == [0, 1, 2, 3, 4] and seen["last"] == 5
    assert seen["values"] == [b"v%d" % i for i in range(6)]
    assert seen["position"] == OffsetAndMetadata(6, "", 1)
    assert seen["ends"] == {T0: 6}
    assert seen["topics"] == ["t"]
    assert seen["offsets_admin"][T0].offset == 6  # type: ignore[index]


def test_close_stops_the_loop_thread(broker: FakeBroker) -> None:
    consumer = Consumer(broker.address)
    producer = Producer(broker.address)
    threads = [consumer.thread, producer.thread]
    assert all(t.is_alive() and t.daemon for t in threads)
    consumer.close()
    producer.close()
    for t in threads:
        assert not t.is_alive()
    consumer.close()  # idempotent
    with pytest.raises(IllegalStateError):
        consumer.poll(10)
    with pytest.raises(IllegalStateError):
        producer.send("t", b"x")


def test_sync_consumer_raises_log_truncation(broker: FakeBroker) -> None:
    with Producer(broker.address, linger_ms=0) as producer:
        for i in range(10):
            producer.send_and_wait("t", b"old%d" % i, partition=0)
    with Consumer(broker.address, auto_offset_reset="none", retry_backoff_ms=5) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 0)
        got = 0
        while got < 10:
            got += sum(len(rs) for rs in consumer.poll(200).values())

        def election() -> None:
            part = broker.topics["t"][0]
            part.truncate_to(4)
            part.become_leader(2)

        on_broker_loop(broker, election)
        with pytest.raises(LogTruncationError) as info:
            for _ in range(50):
                consumer.poll(50)
        assert info.value.divergent_offsets == {T0: OffsetAndMetadata(4, "", 1)}


def test_sync_iteration(broker: FakeBroker) -> None:
    with Producer(broker.address, linger_ms=0) as producer:
        for i in range(3):
            producer.send_and_wait("t", b"r%d" % i, partition=1)
    with Consumer(broker.address, auto_offset_reset="earliest", fetch_max_wait_ms=50) as c:
        c.subscribe("t")
        values = []
        for record in c:
            values.append(record.value)
            if len(values) == 3:
                break
        assert values == [b"r0", b"r1", b"r2"]


def _truncate_later(broker: FakeBroker, delay: float) -> threading.Thread:
    """After `delay`, an unclean election cuts partition 0 at 6 and takes new writes."""

    def act() -> None:
        import time

        time.sleep(delay)

        def election() -> None:
            part = broker.topics["t"][0]
            part.truncate_to(6)
            part.become_leader(2)

        on_broker_loop(broker, election)
        with Producer(broker.address, linger_ms=0) as producer:
            for i in range(4):
                producer.send_and_wait("t", b"new%d" % i, partition=0)

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("reset", ["none", "earliest"])
def test_cli_consume_reports_truncation(broker: FakeBroker, reset: str) -> None:
    from click.testing import CliRunner

    from client.cli import cli

    with Producer(broker.address, linger_ms=0) as producer:
        for i in range(10):
            producer.send_and_wait("t", b"old%d" % i, partition=0)
    mover = _truncate_later(broker, 0.8)
    args = ["consume", "t", "-p", "0", "--from-beginning", "--timeout-ms", "2500"]
    result = CliRunner().invoke(cli, [*args, "--reset", reset, "-b", broker.address])
    mover.join(10)
    lines = [ln for ln in result.stderr.splitlines() if "truncation" in ln]
    assert len(lines) == 1, result.stderr
    assert "topic t partition 0" in lines[0] and "position 10" in lines[0]
    assert "divergence offset 6" in lines[0]
    values = result.stdout.split()
    assert values[:10] == [f"old{i}" for i in range(10)]
    if reset == "none":
        assert result.exit_code == 1
        assert lines[0].startswith("error: ")
    else:
        assert result.exit_code == 0, result.stderr
        assert lines[0].startswith("warning: ")
        assert values[10:] == [f"new{i}" for i in range(4)]


def test_sync_poll_batches(broker: FakeBroker) -> None:
    """Consumer.poll_batches: the blocking twin of AsyncConsumer.poll_batches."""
    with Producer(broker.address, linger_ms=0) as producer:
        for i in range(5):
            producer.send_and_wait("t", b"b%d" % i, key=b"k%d" % i, partition=1)
    t1 = TopicPartition("t", 1)
    with Consumer(broker.address, auto_offset_reset="earliest", fetch_max_wait_ms=50) as c:
        c.assign([t1])
        offsets: list[int] = []
        values: list[bytes | None] = []
        for _ in range(50):
            for tp, columns in c.poll_batches(timeout_ms=200).items():
                assert tp == t1
                offsets += columns.offsets
                values += columns.values
            if len(offsets) >= 5:
                break
        assert offsets == [0, 1, 2, 3, 4]
        assert values == [b"b0", b"b1", b"b2", b"b3", b"b4"]
        assert c.position(t1) == 5
