"""Per-record client CPU cost, and the broker's produce validation: `python -m bench micro`.

- decode: the consumer's decode of a fetched record set (`AsyncConsumer` turning
  16 KiB batches of 100 B records into ConsumerRecords), in process, no network;
  microseconds of CPU per record, best of a few repeats. `--compression zstd` (or
  gzip, snappy, lz4) compresses the batches, to see what decompression adds.
- send: `AsyncProducer.send()` of 100 B records to a 1-broker cluster (acks 1),
  send loop plus flush; microseconds of this process's CPU per record, so the
  producer's encode, futures, requests and acks all count, the broker does not.
- send_batch: the same records through `create_batch()` / `send_batch()` (16 KiB
  batches round robin over the 3 partitions), one future per batch.
- validate: the broker's produce-side check of one 16 KiB batch of 100 B records, in
  process: "header+CRC" (validate_batches, all the broker did before issue 13) and
  "full" (validate_produce_batches: the record walk of Kafka's LogValidator, after
  inflating a compressed batch); microseconds of CPU per batch, best of a few
  repeats. "mixed sizes" draws values of 50-150 B, so no two records are laid out
  alike and the walk goes record by record (alike records are checked in bulk).

Decode and send are what bounds one client process at 100 B records; compare
before/after a change back to back (the machine is shared, so noise is a few percent).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

from bench.harness import BenchCluster
from bench.harness import build_batch
from bench.harness import common_args
from bench.harness import format_table
from bench.harness import run
from bench.harness import write_results
from client.consumer import AsyncConsumer
from client.consumer import _PartitionState
from client.producer import AsyncProducer
from client.types import TopicPartition
from protocol.record_batch import BatchBuilder
from protocol.record_batch import Compression
from protocol.record_batch import stamp
from protocol.record_batch import validate_batches
from protocol.record_batch import validate_produce_batches


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench micro",
        description="Client CPU per record: consumer decode (no network) and producer send; "
        "the broker's produce validation per batch.",
    )
    common_args(p)
    p.add_argument("--records", type=int, default=300_000, help="records per case [300000]")
    p.add_argument("--repeats", type=int, default=5, help="decode repeats, best kept [5]")
    p.add_argument(
        "--compression",
        choices=[c.name.lower() for c in Compression],
        default="none",
        help="codec of the decoded and validated batches [none]",
    )
    p.add_argument(
        "--case",
        default="decode,send,send_batch,validate",
        help="comma-separated: decode, send, send_batch, validate [all four]",
    )
    return p


def fetched_record_set(
    records: int, record_size: int = 100, compression: Compression = Compression.NONE
) -> tuple[bytes, int]:
    """Copies of one 16 KiB batch with consecutive offsets, as a fetch returns them."""
    batch, per_batch = build_batch(record_size, 16 * 1024, compression)
    parts = []
    offset = 0
    while offset < records:
        one = bytearray(batch)
        stamp(one, 0, offset, 0)
        parts.append(bytes(one))
        offset += per_batch
    return b"".join(parts), offset


def measure_decode(records: int, repeats: int, compression: Compression) -> dict[str, Any]:
    data, count = fetched_record_set(records, compression=compression)
    consumer = AsyncConsumer("127.0.0.1:1")  # never started: no connection
    tp = TopicPartition("micro", 0)
    best = float("inf")
    for _ in range(max(1, repeats)):
        state = _PartitionState()
        state.set_position(0, 0)
        consumer._buffer.clear()
        started = time.process_time()
        consumer._buffer_records(tp, state, 0, data)
        best = min(best, time.process_time() - started)
        assert len(consumer._buffer[tp].records) == count
    case = "decode" if compression == Compression.NONE else f"decode ({compression.name.lower()})"
    return {"case": case, "records": count, "us_per_record": best / count * 1e6}


def produce_batch(compression: Compression, *, mixed: bool) -> tuple[bytearray, int]:
    """One 16 KiB batch (before compression) of 100 B records as a producer sends it;
    `mixed`: values of 50-150 B instead. Returns (batch, record count)."""
    if not mixed:
        batch, count = build_batch(100, 16 * 1024, compression)
        return bytearray(batch), count
    sizes = random.Random(13)
    builder = BatchBuilder(compression=compression)
    now = int(time.time() * 1000)
    while builder.estimated_size < 16 * 1024 - 160:
        builder.append(bytes(sizes.randrange(50, 151)), None, (), now)
    return bytearray(builder.build()), len(builder)


def measure_validate(repeats: int, compression: Compression) -> list[dict[str, Any]]:
    rows = []
    codec = compression.name.lower()
    for mixed in (False, True):
        buf, count = produce_batch(compression, mixed=mixed)
        loops = 500
        for name, check in (("header+CRC", validate_batches), ("full", validate_produce_batches)):
            best = float("inf")
            for _ in range(max(1, repeats)):
                started = time.process_time()
                for _ in range(loops):
                    check(buf)
                best = min(best, (time.process_time() - started) / loops)
            what = f"{codec}, mixed sizes" if mixed else codec
            rows.append(
                {
                    "case": f"validate {name} ({what})",
                    "records": count,
                    "us_per_record": best / count * 1e6,
                    "us_per_batch": best * 1e6,
                }
            )
    return rows


async def measure_send(bootstrap: str, records: int, *, batches: bool) -> dict[str, Any]:
    producer = AsyncProducer(bootstrap, acks=1, batch_size=16384, linger_ms=5)
    await producer.start()
    try:
        await producer.partitions_for("micro")
        value = bytes(100)
        send = producer.send
        started = time.process_time()
        wall = time.perf_counter()
        futures = []
        if batches:
            sent = 0
            while sent < records:
                batch = producer.create_batch()
                while sent < records and batch.append(value=value) is not None:
                    sent += 1
                futures.append(await producer.send_batch(batch, "micro", partition=sent % 3))
                await asyncio.sleep(0)
        else:
            for i in range(records):
                future = await send("micro", value)
                if i % 1000 == 0:
                    futures.append(future)
                    await asyncio.sleep(0)
            futures.append(future)
        await producer.flush()
        cpu = time.process_time() - started
        wall = time.perf_counter() - wall
        for f in futures:
            f.result()
    finally:
        await producer.close()
    return {
        "case": "send_batch" if batches else "send",
        "records": records,
        "us_per_record": cpu / records * 1e6,
        "records_per_s": records / wall,
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    began = time.monotonic()
    records = 50_000 if args.quick else args.records
    cases = set(args.case.split(","))
    results: list[dict[str, Any]] = []
    codec = Compression.from_name(args.compression)
    if "decode" in cases:
        results.append(measure_decode(records, args.repeats, codec))
    if "validate" in cases:
        results += measure_validate(args.repeats, codec)
    if cases & {"send", "send_batch"}:
        with BenchCluster(brokers=1, keep_data=args.keep_data) as cluster:
            run(cluster.create_topic("micro", partitions=3, replication_factor=1))
            for case in ("send", "send_batch"):
                if case in cases:
                    batches = case == "send_batch"
                    results.append(run(measure_send(cluster.bootstrap, records, batches=batches)))
    rows = [
        [
            r["case"],
            r["records"],
            round(r["us_per_record"], 2),
            round(r.get("records_per_s", 0)),
            round(r["us_per_batch"], 1) if "us_per_batch" in r else "",
        ]
        for r in results
    ]
    columns = ["case", "records", "CPU us/record", "records/s (wall)", "CPU us/batch"]
    print(format_table(columns, rows))
    write_results("micro", args=args, rows=results, started=began, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
