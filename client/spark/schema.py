"""The source's output columns: Spark's Kafka source columns plus `leaderEpoch`.

key binary, value binary, topic string, partition int, offset long,
timestamp timestamp, timestampType int, [headers array<struct<key string,
value binary>>  (includeHeaders=true)], leaderEpoch int
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType


@cache
def spark_schema(include_headers: bool) -> StructType:
    from pyspark.sql.types import ArrayType
    from pyspark.sql.types import BinaryType
    from pyspark.sql.types import IntegerType
    from pyspark.sql.types import LongType
    from pyspark.sql.types import StringType
    from pyspark.sql.types import StructField
    from pyspark.sql.types import StructType
    from pyspark.sql.types import TimestampType

    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    fields.append(StructField("leaderEpoch", IntegerType()))
    return StructType(fields)


@cache
def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark's Python worker expects for this source's batches."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema(include_headers), timezone="UTC")
