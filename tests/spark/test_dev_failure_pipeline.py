"""The README's "Try a failure", as a data engineer runs it: `minibroker dev`, a producer
(acks=all, RF 3, min ISR 2), a streaming query (its own driver process) from the
`minibroker` source to a parquet sink with a checkpoint; the leader of a partition
SIGKILLed and restarted with `minibroker dev kill/restart`, the driver SIGKILLed and the
query started again from its checkpoint. The parquet output (read through the file
sink's own log, as Spark does) holds every record exactly once and the sums match."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from client import Admin
from tests.integration.cluster import CLI_ENV
from tests.integration.cluster import mb
from tests.integration.dev_process import running_dev
from tests.spark.streams import create_topic
from tests.spark.streams import produce

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).with_name("pipeline_driver.py")
REPO = Path(__file__).resolve().parents[2]
RECORDS_PER_CHUNK = 5_000
CUSTOMERS = 13
DRIVER_TIMEOUT_S = 120


def order(i: int) -> bytes:
    return f"{i},{i % CUSTOMERS},{i % 97 + 1}".encode()


def start_driver(bootstrap: str, tmp: Path, mode: str) -> subprocess.Popen[bytes]:
    log = open(tmp / f"driver-{mode}.log", "ab")  # noqa: SIM115 - the child owns it
    args = [bootstrap, "orders", str(tmp / "out"), str(tmp / "checkpoint"), mode]
    return subprocess.Popen(
        [sys.executable, str(DRIVER), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=CLI_ENV,
        cwd=REPO,
        start_new_session=True,
    )


def committed_batches(tmp: Path) -> int:
    metadata = tmp / "out" / "_spark_metadata"
    return len(list(metadata.glob("[0-9]*"))) if metadata.exists() else 0


def wait_batches(tmp: Path, driver: subprocess.Popen[bytes], at_least: int) -> None:
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    while committed_batches(tmp) < at_least:
        assert driver.poll() is None, (tmp / "driver-continuous.log").read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {at_least} committed batches in time"
        time.sleep(0.3)


def leader_of(bootstrap: str, partition: int) -> int:
    with Admin(bootstrap) as admin:
        (topic,) = admin.describe_topics(["orders"], include_offsets=False)
    return next(p.leader for p in topic.partitions if p.partition == partition)


def test_leader_and_driver_killed_every_record_exactly_once(spark: Any, tmp_path: Path) -> None:
    with running_dev(tmp_path / "data") as dev:
        bootstrap = dev.wait_for_bootstrap()
        create_topic(bootstrap, "orders", 2, **{"min.insync.replicas": "2"})
        produce(bootstrap, "orders", [order(i) for i in range(RECORDS_PER_CHUNK)])
        driver = start_driver(bootstrap, tmp_path, "continuous")
        try:
            wait_batches(tmp_path, driver, 1)
            leader = leader_of(bootstrap, 0)
            killed = mb("dev", "kill", str(leader), "--data-dir", str(dev.data_dir))
            assert killed.returncode == 0, killed.stderr
            # acks=all goes on with two of three in sync, to whichever leader comes next.
            produce(
                bootstrap,
                "orders",
                [order(i) for i in range(RECORDS_PER_CHUNK, 2 * RECORDS_PER_CHUNK)],
            )
            restarted = mb("dev", "restart", str(leader), "--data-dir", str(dev.data_dir))
            assert restarted.returncode == 0, restarted.stderr
            wait_batches(tmp_path, driver, 3)
            produce(
                bootstrap,
                "orders",
                [order(i) for i in range(2 * RECORDS_PER_CHUNK, 3 * RECORDS_PER_CHUNK)],
            )
        finally:
            os.killpg(driver.pid, signal.SIGKILL)  # the driver, its JVM and workers
            driver.wait(30)
        assert dev.proc.poll() is None, dev.output()

        again = start_driver(bootstrap, tmp_path, "available-now")
        try:
            assert again.wait(DRIVER_TIMEOUT_S) == 0, (
                tmp_path / "driver-available-now.log"
            ).read_text()[-3000:]
        finally:
            if again.poll() is None:
                os.killpg(again.pid, signal.SIGKILL)

    total = 3 * RECORDS_PER_CHUNK
    rows = spark.read.parquet(str(tmp_path / "out")).select("value").collect()
    orders = [tuple(map(int, row.value.split(","))) for row in rows]
    assert len(orders) == total, f"{len(orders)} rows for {total} records"
    assert sorted(o[0] for o in orders) == list(range(total))  # each exactly once
    sums: dict[int, int] = {}
    for _, customer, amount in orders:
        sums[customer] = sums.get(customer, 0) + amount
    expected: dict[int, int] = {}
    for i in range(total):
        expected[i % CUSTOMERS] = expected.get(i % CUSTOMERS, 0) + i % 97 + 1
    assert sums == expected
