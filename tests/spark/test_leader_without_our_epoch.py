"""The Spark source and a leader elected from a replica that never had the epoch of
the query's last records (client/epochs.py rule 4; the consumer's side is commit
8e1657d, found by the chaos unclean-divergence run).

Invariant protected: records a query already delivered are never silently replaced by
records of another lineage at the same offsets; the source reports the truncation at
the offset where the lineages part.

Staging, with the in-test broker of the client's unit tests (tests/unit/client/
client_fakes.py: a real TCP server; no Java needed, the source's driver and executor
code run as Spark would call them): offsets 0-3 at leader epoch 2, then 4-5 at epoch 3
(an unclean leader). Micro-batch 1 delivers 0-5 and checkpoints
{"offset": 6, "epoch": 3, "epochStart": 4}. The next leader never followed epoch 3: its
epoch 2 runs on with "other-0", "other-1" at 4-5; it leads at epoch 4 and takes "new-0",
"new-1" at 6-7. Asked for epoch 3 it answers (epoch 2, ends at 6): not below the stored
offset, so KIP-320's end-offset rule alone finds nothing, and the executor's epoch
bounds (3 to 4) accept "new-0", "new-1": without rule 4 the stream goes on at 6 as if
4-5 were still what it delivered, and nothing tells.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from collections.abc import Callable
from typing import Any
from typing import TypeVar

import pytest

from client.spark.offsets import Position
from client.spark.offsets import SourceOffset
from client.spark.options import SourceOptions
from client.spark.partition_reader import read_range
from client.spark.planning import DataLossError
from client.spark.planning import OffsetRange
from client.types import TopicPartition
from protocol.messages import FetchRequest
from tests.spark.streams import stream_options
from tests.unit.client.client_fakes import FakeBroker
from tests.unit.client.client_fakes import produce_values

pytest.importorskip(
    "pyspark", reason="SPARK TESTS SKIPPED: pyspark is not installed: pip install -e '.[dev,spark]'"
)
pytest.importorskip(
    "pyarrow", reason="SPARK TESTS SKIPPED: pyarrow is not installed: pip install -e '.[dev,spark]'"
)

from pyspark.sql.streaming.datasource import ReadAllAvailable

from client.spark.stream_reader import MinibrokerStreamReader

TP = TopicPartition("t", 0)
DELIVERED = [b"old-0", b"old-1", b"old-2", b"old-3", b"unclean-0", b"unclean-1"]
OTHER = [b"other-0", b"other-1"]  # 4-5 on the next leader, epoch 2
NEW = [b"new-0", b"new-1"]  # 6-7, epoch 4
T = TypeVar("T")


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    b = FakeBroker()
    b.create_topic("t", 1, leader_epoch=2)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


def blocking(call: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    """The source's calls block (their own event loops): run them off this loop, which
    serves the in-test broker."""
    return asyncio.ensure_future(asyncio.to_thread(call, *args, **kwargs))


def options(broker: FakeBroker, **extra: Any) -> SourceOptions:
    extra.setdefault("kafkaConsumer.pollTimeoutMs", 10_000)
    return SourceOptions.parse(stream_options(broker.address, "t", **extra), streaming=True)


def micro_batch(
    reader: MinibrokerStreamReader, start: dict[str, Any]
) -> tuple[dict[str, Any], list[tuple[int, bytes, int]]]:
    """Plan from `start` and read the batch as Spark would: (end offset, rows)."""
    end = reader.latestOffset(start, ReadAllAvailable())
    rows = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            rows.extend(
                zip(
                    batch.column("offset").to_pylist(),
                    batch.column("value").to_pylist(),
                    batch.column("leaderEpoch").to_pylist(),
                    strict=True,
                )
            )
    return end, rows


def first_micro_batch(broker: FakeBroker) -> dict[str, Any]:
    reader = MinibrokerStreamReader(options(broker))
    try:
        end, rows = micro_batch(reader, reader.initialOffset())
    finally:
        reader.stop()
    assert rows == [(i, v, 2 if i < 4 else 3) for i, v in enumerate(DELIVERED)]
    assert end["partitions"]["t"]["0"] == {"offset": 6, "epoch": 3, "epochStart": 4}
    return end


async def elect_a_leader_that_never_had_epoch_3(broker: FakeBroker) -> None:
    part = broker.topics["t"][0]
    part.truncate_to(4)
    part.epochs = [(2, 0)]
    part.leader_epoch = 2
    await produce_values(broker, OTHER)
    part.become_leader(4)
    await produce_values(broker, NEW)
    assert part.end_offset_for(3) == (2, 6)  # not below the stored offset 6


def plan_from(broker: FakeBroker, stored: dict[str, Any], **extra: Any) -> Any:
    reader = MinibrokerStreamReader(options(broker, **extra))
    try:
        return micro_batch(reader, stored)
    finally:
        reader.stop()


async def test_a_leader_that_never_had_the_stored_epoch_is_a_truncation(
    broker: FakeBroker,
) -> None:
    await produce_values(broker, DELIVERED[:4])
    broker.topics["t"][0].become_leader(3)
    await produce_values(broker, DELIVERED[4:])
    stored = await blocking(first_micro_batch, broker)
    await elect_a_leader_that_never_had_epoch_3(broker)

    # failOnDataLoss=true: the plan fails, naming where the lineages part.
    with pytest.raises(DataLossError) as err:
        await blocking(plan_from, broker, stored)
    message = str(err.value)
    for part in (
        "topic t partition 0",
        "stored offset 6 (leader epoch 3)",
        "no records of leader epoch 3 at all",
        "diverges at offset 4",
        "Records 4 to 5 that this query already read",
        "failOnDataLoss",
    ):
        assert part in message, message

    # failOnDataLoss=false: go on from the divergence offset, on the new lineage.
    end, rows = await blocking(plan_from, broker, stored, failOnDataLoss=False)
    assert rows == [(4, b"other-0", 2), (5, b"other-1", 2), (6, b"new-0", 4), (7, b"new-1", 4)]
    assert end == {
        "partitions": {"t": {"0": {"offset": 8, "epoch": 4, "epochStart": 6}}},
        "dataLoss": 1,
        "truncations": 1,
    }


async def stage(broker: FakeBroker) -> None:
    """0-3 at epoch 2, 4-5 at epoch 3, then the election (no query ran before)."""
    await produce_values(broker, DELIVERED[:4])
    broker.topics["t"][0].become_leader(3)
    await produce_values(broker, DELIVERED[4:])
    await elect_a_leader_that_never_had_epoch_3(broker)


async def test_an_executor_validating_its_start_finds_it(broker: FakeBroker) -> None:
    """A range from the stored position, as a planner without rule 4 makes it (epochs
    3 to 4): its start is validated before anything is read."""
    await stage(broker)
    planned = OffsetRange.between(TP, Position(6, 3, 4), Position(8, 4, 6))
    with pytest.raises(DataLossError, match="diverges at offset 4"):
        await blocking(lambda: list(read_range(planned, options(broker))))
    lenient = options(broker, failOnDataLoss=False)
    assert await blocking(lambda: list(read_range(planned, lenient))) == []


async def test_an_executor_knows_where_the_epoch_it_read_began(broker: FakeBroker) -> None:
    """The election happens while a task reads: it read 2-3 (epoch 2, planned as
    beginning at 0) and 4-5 (epoch 3) when its next fetch is fenced by the new leader.
    Validating (6, epoch 3) it must know that epoch 3 began at 4 for it, from the
    records: the lineages part there, not at 0."""
    await produce_values(broker, DELIVERED[:4])
    broker.topics["t"][0].become_leader(3)
    await produce_values(broker, DELIVERED[4:])
    elected = False

    async def elect_on_the_fetch_at_6(request: FetchRequest) -> None:
        nonlocal elected
        offsets = {p.fetch_offset for t in request.topics for p in t.partitions}
        if 6 in offsets and not elected:
            elected = True
            await elect_a_leader_that_never_had_epoch_3(broker)
        # None: the broker answers as usual (fenced: the request's epoch is 3).

    broker.overrides[FetchRequest] = elect_on_the_fetch_at_6
    r = OffsetRange.between(TP, Position(2, 2, 0), Position(8))
    with pytest.raises(DataLossError) as err:
        await blocking(lambda: list(read_range(r, options(broker))))
    assert elected
    assert "the position 6 (leader epoch 3)" in str(err.value)
    assert "from offset 4 on" in str(err.value) and "diverges at offset 4" in str(err.value)


async def test_a_checkpoint_of_the_older_source_keeps_the_end_offset_rule(
    broker: FakeBroker,
) -> None:
    """The documented fallback: an offset written before "epochStart" existed does not
    say where its epoch began, so for it only the end-offset rule applies (the query
    goes on at 6); its next checkpoint has the field."""
    await stage(broker)
    old = SourceOffset.from_json(
        '{"partitions": {"t": {"0": {"offset": 6, "epoch": 3}}}, "dataLoss": 0}'
    )
    end, rows = await blocking(plan_from, broker, old.to_json())
    assert rows == [(6, b"new-0", 4), (7, b"new-1", 4)]
    assert end["partitions"]["t"]["0"] == {"offset": 8, "epoch": 4, "epochStart": 6}
