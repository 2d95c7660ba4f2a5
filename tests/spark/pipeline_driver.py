"""A Spark driver as its own process, for tests/spark/test_dev_failure_pipeline.py: a
streaming query from the `minibroker` source to a parquet sink with a checkpoint, so the
test can SIGKILL the driver and start it again on the same checkpoint.

    python tests/spark/pipeline_driver.py BOOTSTRAP TOPIC OUTPUT CHECKPOINT MODE

MODE `continuous`: a micro-batch every 500 ms until killed; `available-now`: what is in
the topic now, then exit 0."""

from __future__ import annotations

import sys

from client.spark.session import local_session


def main(bootstrap: str, topic: str, output: str, checkpoint: str, mode: str) -> None:
    spark = local_session("pipeline-driver", **{"spark.default.parallelism": "2"})
    writer = (
        spark.readStream.format("minibroker")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 4000)
        .load()
        .selectExpr("partition", "offset", "leaderEpoch", "CAST(value AS STRING) AS value")
        .writeStream.format("parquet")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
    )
    if mode == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="500 milliseconds")
    query = writer.start()
    print("query started", flush=True)
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
