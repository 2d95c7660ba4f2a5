"""The sink: `df.write.format("minibroker")` and `df.writeStream.format("minibroker")`.

Columns (Spark's Kafka sink): `value` (binary or string, required), `key` (binary or
string), `topic` (string; the `topic` option, when set, overrides it), `partition`
(int; default: the producer's partitioner, murmur2 of the key like Kafka), `headers`
(array<struct<key string, value binary>>). Other columns are ignored.

Each Spark task writes its rows with its own AsyncProducer, idempotent with
kafka.acks=all (the default): retries inside a task never duplicate or reorder
(kafka.acks=1 or 0 write without idempotence, as a Kafka producer does). Delivery is
AT-LEAST-ONCE across task retries and query restarts: a task or micro-batch that Spark
runs again (after a failure, or a restart from a checkpoint whose last batch was not
committed) writes its rows again, with a new producer id, so they appear twice.
Deduplicate downstream by a key of your own if that matters.

The schema is checked on the driver (`check_sink_schema`) with errors naming the column.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter
from pyspark.sql.datasource import DataSourceStreamArrowWriter
from pyspark.sql.datasource import WriterCommitMessage

from client.producer import AsyncProducer
from client.spark.options import OptionError
from client.spark.options import SinkOptions

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

# Wait for acknowledgements every this many records, so a task never holds an
# unbounded list of futures.
_ACK_WINDOW = 10_000


@dataclass
class WrittenRecords(WriterCommitMessage):
    """What one task wrote."""

    records: int


def check_sink_schema(schema: StructType, options: SinkOptions) -> None:
    """Raise OptionError unless the DataFrame can be written."""
    from pyspark.sql.types import ArrayType
    from pyspark.sql.types import BinaryType
    from pyspark.sql.types import IntegerType
    from pyspark.sql.types import LongType
    from pyspark.sql.types import ShortType
    from pyspark.sql.types import StringType
    from pyspark.sql.types import StructType

    types = {f.name: f.dataType for f in schema.fields}
    text_or_bytes = (StringType, BinaryType)
    if "value" not in types:
        raise OptionError(
            f"the DataFrame to write needs a `value` column (binary or string); it has "
            f"{', '.join(types) or 'no columns'}"
        )
    for name in ("value", "key"):
        if name in types and not isinstance(types[name], text_or_bytes):
            raise OptionError(
                f"column `{name}` must be binary or string, not {types[name].simpleString()}; "
                f"cast it, e.g. col('{name}').cast('string')"
            )
    if options.topic is None and "topic" not in types:
        raise OptionError(
            'no topic to write to: set .option("topic", NAME) or add a string `topic` column'
        )
    if "topic" in types and not isinstance(types["topic"], StringType):
        raise OptionError(f"column `topic` must be a string, not {types['topic'].simpleString()}")
    if "partition" in types and not isinstance(
        types["partition"], IntegerType | LongType | ShortType
    ):
        raise OptionError(
            f"column `partition` must be an integer, not {types['partition'].simpleString()}"
        )
    if "headers" in types:
        h = types["headers"]
        ok = (
            isinstance(h, ArrayType)
            and isinstance(h.elementType, StructType)
            and [f.name for f in h.elementType.fields] == ["key", "value"]
            and isinstance(h.elementType.fields[0].dataType, StringType)
            and isinstance(h.elementType.fields[1].dataType, text_or_bytes)
        )
        if not ok:
            raise OptionError(
                "column `headers` must be array<struct<key: string, value: binary>>, not "
                f"{h.simpleString()}"
            )


def _as_bytes(value: Any) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


async def _produce(batches: Iterator[pa.RecordBatch], options: SinkOptions) -> int:
    """Send every row; wait for every acknowledgement (raising the first failure)."""
    written = 0
    pending: list[asyncio.Future[Any]] = []
    async with AsyncProducer(
        options.bootstrap_servers,
        client_id="minibroker-spark-sink",
        acks=options.acks,
        enable_idempotence=options.idempotent,
        max_in_flight=options.max_in_flight,
        linger_ms=options.linger_ms,
        batch_size=options.batch_size,
        compression_type=None if options.compression_type == "none" else options.compression_type,
        delivery_timeout_ms=options.delivery_timeout_ms,
    ) as producer:
        for batch in batches:
            cols = batch.to_pydict()
            n = batch.num_rows
            values = cols["value"]
            keys = cols.get("key") or [None] * n
            topics = [options.topic] * n if options.topic else cols["topic"]
            partitions = cols.get("partition") or [None] * n
            headers = cols.get("headers") or [None] * n
            for i in range(n):
                topic = topics[i]
                if not topic:
                    raise OptionError(
                        "a row has no topic (null `topic` column) and no topic option is set"
                    )
                hdrs = [(h["key"], _as_bytes(h["value"])) for h in headers[i] or ()]
                pending.append(
                    await producer.send(
                        topic,
                        _as_bytes(values[i]),
                        _as_bytes(keys[i]),
                        partitions[i],
                        headers=hdrs,
                    )
                )
            if len(pending) >= _ACK_WINDOW:
                written += await _acknowledged(pending)
        await producer.flush()
        written += await _acknowledged(pending)
    return written


async def _acknowledged(pending: list[asyncio.Future[Any]]) -> int:
    results = await asyncio.gather(*pending)
    pending.clear()
    return len(results)


class MinibrokerBatchWriter(DataSourceArrowWriter):
    """`df.write.format("minibroker")`."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenRecords:
        return WrittenRecords(asyncio.run(_produce(iterator, self.options)))


class MinibrokerStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("minibroker")` (at-least-once, see the module docstring)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenRecords:
        return WrittenRecords(asyncio.run(_produce(iterator, self.options)))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every record was acknowledged when its task finished: nothing left to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records already acknowledged stay written (at-least-once)."""
