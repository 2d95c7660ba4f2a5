"""`MinibrokerDataSource`: the PySpark (4.x) Python data source named "minibroker".

    spark.dataSource.register(MinibrokerDataSource)
    spark.readStream.format("minibroker").option("kafka.bootstrap.servers", ...)
    spark.read.format("minibroker") ...
    df.write.format("minibroker") ... / df.writeStream.format("minibroker") ...

Options are checked when Spark builds the reader or writer (client.spark.options),
so a bad option fails at once with a message naming it. Spark wraps what a Python data
source raises in an AnalysisException whose text is the worker's formatted traceback;
`_options_first` makes the option's one-line message the first thing after Spark's
error class, before that traceback.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from pyspark.sql.datasource import DataSource
from pyspark.sql.datasource import DataSourceReader
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.datasource import DataSourceStreamWriter
from pyspark.sql.datasource import DataSourceWriter
from pyspark.sql.types import StructType

from client.spark.batch_reader import MinibrokerBatchReader
from client.spark.options import OptionError
from client.spark.options import SinkOptions
from client.spark.options import SourceOptions
from client.spark.options import warn_ignored
from client.spark.schema import spark_schema
from client.spark.stream_reader import MinibrokerStreamReader
from client.spark.writer import MinibrokerBatchWriter
from client.spark.writer import MinibrokerStreamWriter
from client.spark.writer import check_sink_schema


def _include_headers(options: dict[str, str]) -> bool:
    raw = {k.lower(): v for k, v in options.items()}.get("includeheaders", "false")
    return str(raw).strip().lower() == "true"


T = TypeVar("T")


def _options_first(build: Callable[[], T]) -> T:
    """`build()`; when it raises OptionError, raise it so that Spark's text of it starts
    with the option's message. Spark's Python worker formats the exception it dies of
    (pyspark.util.handle_worker_exception) and the JVM puts that text after its error
    class; the worker exits right after, so what is set here lasts only for that:

    - planning workers simplify tracebacks (SPARK_SIMPLIFIED_TRACEBACK), which drops
      chained exceptions: there SPARK_HIDE_TRACEBACK makes the text the message alone;
    - the streaming source runner formats the whole chain (the exception it dies of may
      be a later one): a copy of the error that was never raised, chained as its
      context, is formatted first and without a traceback."""
    try:
        return build()
    except OptionError as exc:
        error = exc
    if os.environ.get("SPARK_SIMPLIFIED_TRACEBACK"):
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"
    # Outside the except block, so the raise below keeps this context.
    error.__context__ = OptionError(str(error))
    error.__suppress_context__ = False
    raise error


class MinibrokerDataSource(DataSource):
    """Read and write minibroker topics from Spark, like Spark's Kafka source, with
    leader epochs in the offsets (truncation detection)."""

    @classmethod
    def name(cls) -> str:
        return "minibroker"

    def schema(self) -> StructType:
        return spark_schema(_include_headers(dict(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = _options_first(lambda: SourceOptions.parse(self.options, streaming=False))
        return MinibrokerBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = _options_first(lambda: SourceOptions.parse(self.options, streaming=True))
        return MinibrokerStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = _options_first(lambda: _sink_options(self.options, schema, overwrite))
        return MinibrokerBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = _options_first(lambda: _sink_options(self.options, schema, overwrite))
        return MinibrokerStreamWriter(options)


def _sink_options(options: dict[str, str], schema: StructType, overwrite: bool) -> SinkOptions:
    if overwrite:
        raise OptionError(
            'a topic cannot be overwritten: write with mode("append") (records are appended)'
        )
    parsed = SinkOptions.parse(options)
    check_sink_schema(schema, parsed)
    warn_ignored(parsed.ignored_kafka_options, "sink")
    return parsed
