"""The Spark data source for minibroker (PySpark 4.x, `pip install 'minibroker[spark]'`).

    from client.spark import MinibrokerDataSource
    spark.dataSource.register(MinibrokerDataSource)
    df = (spark.readStream.format("minibroker")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "events")
          .load())

Modules: datasource (the DataSource), options (option parsing), offsets (the
checkpointed offset JSON), planning (pure planning rules), planner + cluster_view
(driver-side I/O), stream_reader / batch_reader, partition_reader (what a task runs),
writer (the sink), schema (the columns), session (local_session(): a local SparkSession
with PYSPARK_PYTHON set and the format registered).

Importing `client.spark` does not import pyspark (options, offsets and planning are
plain Python); `MinibrokerDataSource` does, on first access.
"""

from typing import Any

from client.spark.offsets import Position
from client.spark.offsets import SourceOffset
from client.spark.options import OptionError
from client.spark.options import SinkOptions
from client.spark.options import SourceOptions
from client.spark.planning import DataLossError

__all__ = [
    "DataLossError",
    "MinibrokerDataSource",
    "OptionError",
    "Position",
    "SinkOptions",
    "SourceOffset",
    "SourceOptions",
]


def __getattr__(name: str) -> Any:
    if name == "MinibrokerDataSource":
        from client.spark.datasource import MinibrokerDataSource

        return MinibrokerDataSource
    raise AttributeError(f"module 'client.spark' has no attribute {name!r}")
