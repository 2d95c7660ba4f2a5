"""Verbs of the Spark tests: create topics and produce with the client library, run a
streaming query to completion, read what it delivered."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from client import Admin
from client import Producer

QUERY_TIMEOUT_S = 120


def create_topic(servers: str, name: str, partitions: int = 2, **configs: str) -> None:
    with Admin(servers) as admin:
        admin.create_topic(name, num_partitions=partitions, replication_factor=3, configs=configs)


def produce(
    servers: str,
    topic: str,
    values: list[bytes],
    *,
    partition: int | None = None,
    headers: list[tuple[str, bytes | None]] | None = None,
) -> None:
    """acks=all, each value keyed by itself (so partitions are deterministic)."""
    with Producer(servers, acks="all", linger_ms=0) as producer:
        futures = [
            producer.send(topic, v, key=v, partition=partition, headers=headers) for v in values
        ]
        producer.flush()
        for f in futures:
            f.result(30)


def fill_topic(servers: str, topic: str, n: int, *, partitions: int = 2) -> list[bytes]:
    """A new topic holding `n` records "<topic>-<i>"; their values."""
    create_topic(servers, topic, partitions)
    values = [f"{topic}-{i}".encode() for i in range(n)]
    produce(servers, topic, values)
    return values


def stream_options(servers: str, topic: str, **extra: Any) -> dict[str, str]:
    opts = {"kafka.bootstrap.servers": servers, "subscribe": topic, "startingOffsets": "earliest"}
    opts.update({k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in extra.items()})
    return opts


class QueryRun:
    """One run of a streaming query (default: availableNow) whose micro-batches are
    collected here (foreachBatch runs in this process), in batch order."""

    def __init__(
        self, spark: Any, options: dict[str, str], checkpoint: Path, *, available_now: bool = True
    ) -> None:
        self.batches: list[tuple[int, list[Any]]] = []
        reader = spark.readStream.format("minibroker")
        for key, value in options.items():
            reader = reader.option(key, value)
        writer = (
            reader.load()
            .writeStream.foreachBatch(self._collect)
            .option("checkpointLocation", str(checkpoint))
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime="500 milliseconds")
        self.query = writer.start()

    def _collect(self, df: Any, batch_id: int) -> None:
        self.batches.append((batch_id, df.collect()))

    def wait_rows(self, n: int, timeout: float = QUERY_TIMEOUT_S) -> list[Any]:
        """A running query: wait until the sink got at least `n` rows."""
        deadline = time.monotonic() + timeout
        while len(self.rows()) < n:
            assert self.query.isActive, f"query stopped: {self.query.exception()}"
            assert time.monotonic() < deadline, f"{len(self.rows())} of {n} rows: {self.rows()}"
            time.sleep(0.2)
        # foreachBatch runs before Spark records the batch's progress: wait for it, so
        # end_offset() speaks of the batch that delivered the last rows, not the one before.
        last_batch = self.batches[-1][0] if self.batches else -1
        while (self.query.lastProgress or {}).get("batchId", -1) < last_batch:
            assert time.monotonic() < deadline, f"progress of batch {last_batch} never reported"
            time.sleep(0.1)
        return self.rows()

    def stop(self) -> None:
        self.query.stop()

    def wait(self) -> QueryRun:
        """Until the query ends; raises its failure (StreamingQueryException)."""
        finished = self.query.awaitTermination(QUERY_TIMEOUT_S)
        assert finished, f"query still running after {QUERY_TIMEOUT_S}s"
        return self

    def rows(self) -> list[Any]:
        rows = [r for _, batch in self.batches for r in batch]
        return sorted(rows, key=lambda r: (r.topic, r.partition, r.offset))

    def batch_sizes(self) -> list[int]:
        return [len(batch) for _, batch in self.batches if batch]

    def end_offset(self) -> dict[str, Any]:
        end = self.query.lastProgress["sources"][0]["endOffset"]
        return json.loads(end) if isinstance(end, str) else end


def run_available_now(spark: Any, options: dict[str, str], checkpoint: Path) -> QueryRun:
    return QueryRun(spark, options, checkpoint).wait()
