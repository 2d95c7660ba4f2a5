"""Spark's floor for a Python streaming source: `bench spark --source floor`.

A PySpark data source named "bench_floor" with the minibroker source's columns whose
tasks build their rows in memory (one Arrow batch of 100 B values per 65,536 rows,
no network, no decoding), so a query over it costs what Spark itself spends on a
Python streaming source: starting the query, its Python processes (the data source,
the streaming runner, the read planner, the task workers), planning, moving Arrow
batches into the JVM. The gap between this and the minibroker source is what the
source adds; this row's own time is the bound the source cannot go below.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from client.spark.schema import arrow_schema
from client.spark.schema import spark_schema

_ROWS_PER_BATCH = 65_536
_VALUE = b"v" * 100


class _Range(InputPartition):
    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__(partition)
        self.partition = partition
        self.start = start
        self.end = end


class FloorStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.rows = int(options["rows"])
        self.partitions_count = int(options.get("partitions", "4"))

    def initialOffset(self) -> dict[str, Any]:
        return {"rows": 0}

    def latestOffset(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = int(start["rows"]), int(end["rows"])
        per = -(-(last - first) // self.partitions_count)
        return [
            _Range(p, first + p * per, min(last, first + (p + 1) * per))
            for p in range(self.partitions_count)
            if first + p * per < last
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa

        assert isinstance(partition, _Range)
        schema = arrow_schema(False)
        offset = partition.start
        while offset < partition.end:
            n = min(_ROWS_PER_BATCH, partition.end - offset)
            columns = [
                pa.nulls(n, pa.binary()),
                pa.array([_VALUE] * n, pa.binary()),
                pa.array(["bench-floor"] * n, pa.string()),
                pa.array([partition.partition] * n, pa.int32()),
                pa.array(range(offset, offset + n), pa.int64()),
                pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                pa.array([0] * n, pa.int32()),
                pa.array([0] * n, pa.int32()),
            ]
            yield pa.RecordBatch.from_arrays(columns, schema=schema)
            offset += n


class FloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_floor"

    def schema(self) -> StructType:
        return spark_schema(False)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FloorStreamReader(dict(self.options))
