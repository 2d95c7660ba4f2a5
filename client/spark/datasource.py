"""`MinibrokerDataSource`: the PySpark (4.x) Python data source named "minibroker".

    spark.dataSource.register(MinibrokerDataSource)
    spark.readStream.format("minibroker").option("kafka.bootstrap.servers", ...)
    spark.read.format("minibroker") ...
    df.write.format("minibroker") ... / df.writeStream.format("minibroker") ...

Options are checked when Spark builds the reader or writer (client.spark.options),
so a bad option fails at once with a message naming it. Spark wraps what a Python data
source raises in an AnalysisException whose text is the worker's formatted traceback;
`option_errors_first` makes the option's one-line message the first thing after Spark's
error class, before that traceback.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.datasource import DataSourceReader
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.datasource import DataSourceStreamWriter
from pyspark.sql.datasource import DataSourceWriter
from pyspark.sql.types import StructType

from client.spark.options import OptionError
from client.spark.options import SinkOptions
from client.spark.options import SourceOptions
from client.spark.options import option_errors_first
from client.spark.options import warn_ignored
from client.spark.schema import spark_schema


def _include_headers(options: dict[str, str]) -> bool:
    raw = {k.lower(): v for k, v in options.items()}.get("includeheaders", "false")
    return str(raw).strip().lower() == "true"


class MinibrokerDataSource(DataSource):
    """Read and write minibroker topics from Spark, like Spark's Kafka source, with
    leader epochs in the offsets (truncation detection)."""

    @classmethod
    def name(cls) -> str:
        return "minibroker"

    def schema(self) -> StructType:
        return spark_schema(_include_headers(dict(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = option_errors_first(lambda: SourceOptions.parse(self.options, streaming=False))
        from client.spark.batch_reader import MinibrokerBatchReader

        return MinibrokerBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = option_errors_first(lambda: SourceOptions.parse(self.options, streaming=True))
        from client.spark.stream_reader import MinibrokerStreamReader

        return MinibrokerStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = option_errors_first(lambda: _sink_options(self.options, schema, overwrite))
        from client.spark.writer import MinibrokerBatchWriter

        return MinibrokerBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = option_errors_first(lambda: _sink_options(self.options, schema, overwrite))
        from client.spark.writer import MinibrokerStreamWriter

        return MinibrokerStreamWriter(options)


def _sink_options(options: dict[str, str], schema: StructType, overwrite: bool) -> SinkOptions:
    if overwrite:
        raise OptionError(
            'a topic cannot be overwritten: write with mode("append") (records are appended)'
        )
    from client.spark.writer import check_sink_schema

    parsed = SinkOptions.parse(options)
    check_sink_schema(schema, parsed)
    warn_ignored(parsed.ignored_kafka_options, "sink")
    return parsed
