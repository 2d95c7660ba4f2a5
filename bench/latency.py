"""End-to-end latency, produce to consume, acks=all, replication factor 3, at a fixed
rate of about 10% of the measured maximum (`--rf 1` / `--acks 1` take replication
hops out of the path, to see what each costs).

The producer (AsyncProducer, acks=all, linger_ms=0) runs in this process and sends
100 B records at `--rate` records/s, paced every millisecond; each value starts with
the CLOCK_MONOTONIC time of its send() in ns. The consumer (AsyncConsumer, fetch
min bytes 1) runs in ANOTHER process (spawned), so its record decoding does not
share an event loop or a GIL with the producer; CLOCK_MONOTONIC is system-wide on
Linux, so the two clocks are the same. Latency = the consumer's clock when poll()
returns the record minus the stamp. The first `--warmup` seconds are left out.
The producer's own acknowledgement latency (send() to ack) is reported too.

Default rate: 10% of the best records/s of the RF=3 acks=all 100 B cells in
bench/results/produce.json, or 5,000/s when there is none (the JSON says which).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import multiprocessing
import os
import queue
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import RESULTS_DIR
from bench.harness import BenchCluster
from bench.harness import Progress
from bench.harness import common_args
from bench.harness import percentile
from bench.harness import report
from bench.harness import run
from bench.hop_breakdown import breakdown
from bench.hop_breakdown import format_breakdown
from bench.hop_breakdown import read_traces
from client.consumer import AsyncConsumer
from client.producer import AsyncProducer
from client.types import TopicPartition
from runtime import hop_trace
from runtime.process_start import freeze_start_up_heap

NAME = "latency"
RECORD_SIZE = 100
FALLBACK_RATE = 5_000
TOPIC = "bench-latency"
STAMP = struct.Struct(">q")
CONSUMER_START_TIMEOUT_S = 60.0
PERCENTILES = (50, 90, 99, 99.9)
CDF_POINTS = 200  # quantiles kept in the JSON for the plot


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench latency", description=__doc__.split("\n")[0])
    common_args(p)
    p.add_argument("--rate", type=int, help="records/s [10%% of produce.json's max, or 5000]")
    p.add_argument("--seconds", type=float, help="measured sending time [20; 3 with --quick]")
    p.add_argument("--warmup", type=float, help="seconds left out first [2; 0.5 with --quick]")
    p.add_argument("--partitions", type=int, default=1, help="partitions [1]")
    # The target is about RF 3 acks=all; RF 1 / acks 1 take hops out of the path, to
    # see what each one costs.
    p.add_argument("--rf", type=int, choices=(1, 2, 3), default=3, help="replication factor [3]")
    p.add_argument("--acks", choices=("all", "1"), default="all", help="producer acks [all]")
    p.add_argument(
        "--trace",
        action="store_true",
        help="trace sampled records through every hop (runtime/hop_trace.py) and print "
        "the per-hop breakdown of the p50 and p99 records",
    )
    p.add_argument(
        "--trace-sample", type=int, default=50, help="with --trace: every Nth offset [50]"
    )
    return p


def default_rate() -> tuple[int, str]:
    path = RESULTS_DIR / "produce.json"
    try:
        rows = json.loads(path.read_text())["results"]
        best = max(
            r["records_per_s"]
            for r in rows
            if r["rf"] == 3 and r["acks"] == "all" and r["record_size"] == RECORD_SIZE
        )
    except (OSError, ValueError, KeyError):
        return FALLBACK_RATE, f"no RF=3 acks=all 100 B result in {path.name}: fixed default"
    return max(100, best // 10), f"10% of {best:,} records/s (produce.json, RF=3 acks=all 100 B)"


# ------------------------------------------------------------------ the consumer process


def _consumer(bootstrap: str, partitions: int, ready: Any, stop: Any, results: Any) -> None:
    try:
        results.put(run(_consume(bootstrap, partitions, ready, stop)))
    except BaseException as exc:
        results.put({"error": f"{type(exc).__name__}: {exc}"})


async def _consume(bootstrap: str, partitions: int, ready: Any, stop: Any) -> dict[str, Any]:
    tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
    consumer = AsyncConsumer(bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=500)
    await consumer.start()
    try:
        consumer.assign(tps)
        for tp in tps:
            await consumer.position(tp)  # resolve "latest" before the producer starts
        freeze_start_up_heap()  # as the servers do once started (runtime/process_start.py)
        ready.set()
        stamps = array.array("q")  # int arrays: nothing for the collector to walk
        latencies = array.array("q")
        # With --trace: (offset, ns) of the sampled records, flat in an int array per
        # partition (a list of every record's tuple made the collector's full passes
        # grow to 16 ms over the run, a tail of the tracing's own).
        seen = {tp: array.array("q") for tp in tps}
        tracer = hop_trace.TRACER
        clock = time.monotonic_ns
        while not stop.is_set():
            for tp, records in (await consumer.poll(timeout_ms=100)).items():
                now = clock()
                for r in records:
                    sent = STAMP.unpack_from(r.value)[0]
                    stamps.append(sent)
                    latencies.append(now - sent)
                if tracer is not None:
                    sample = tracer.sample
                    for r in records:
                        if r.offset % sample == 0:
                            seen[tp].extend((r.offset, now))
        if tracer is not None:  # written at the end: no trace writes in the measured loop
            for tp, flat in seen.items():
                pairs = zip(flat[::2], flat[1::2], strict=True)
                tracer.stamp_each("consumer.sees", tp.topic, tp.partition, pairs)
        return {"stamps": list(stamps), "latencies_ns": list(latencies)}
    finally:
        await consumer.close()


# ------------------------------------------------------------------ the producer


async def produce_at_rate(
    bootstrap: str, rate: int, seconds: float, progress: Progress, producer_acks: str = "all"
) -> tuple[int, list[tuple[int, int]]]:
    """Send `rate` records/s for `seconds`; returns (count, [(stamp, ack ns)])."""
    # Plain int arrays, not a list of tuples: nothing the collector walks grows with
    # the run (a full collection over 10^5-10^6 results paused the producer for tens
    # of ms, and its records with it).
    ack_stamps = array.array("q")
    ack_latencies = array.array("q")
    # With --trace: (partition, offset, send ns, ack ns) of the sampled records, flat.
    traced = array.array("q")
    clock = time.monotonic_ns
    padding = b"\0" * (RECORD_SIZE - STAMP.size)
    async with AsyncProducer(
        bootstrap, acks="all" if producer_acks == "all" else int(producer_acks), linger_ms=0
    ) as producer:
        await producer.partitions_for(TOPIC)
        freeze_start_up_heap()  # as the servers do once started (runtime/process_start.py)
        tracer = hop_trace.TRACER
        start = time.monotonic()
        sent = 0
        next_report = start + 1
        while (now := time.monotonic()) < start + seconds:
            due = int((now - start) * rate) - sent
            for _ in range(due):
                stamp = clock()
                future = await producer.send(TOPIC, STAMP.pack(stamp) + padding)
                future.add_done_callback(
                    lambda f, s=stamp: (
                        f.exception() is None
                        and (ack_stamps.append(s), ack_latencies.append(clock() - s))
                    )
                )
                if tracer is not None:
                    future.add_done_callback(
                        lambda f, s=stamp: f.exception() is None and _keep_traced(f, s, traced)
                    )
                sent += 1
            if now >= next_report:
                progress.update(f"{sent:,} sent", int(now - start))
                next_report += 1
            await asyncio.sleep(0.001)
        await producer.flush()
    if tracer is not None:  # written at the end: no trace writes in the measured loop
        for i in range(0, len(traced), 4):
            partition, offset, sent_ns, ack_ns = traced[i : i + 4]
            tracer.stamp_each("send", TOPIC, partition, [(offset, sent_ns)])
            tracer.stamp_each("producer.ack", TOPIC, partition, [(offset, ack_ns)])
    return sent, list(zip(ack_stamps, ack_latencies, strict=True))


def _keep_traced(future: Any, sent_ns: int, traced: array.array[int]) -> None:
    meta = future.result()
    tracer = hop_trace.TRACER
    if tracer is not None and meta.offset % tracer.sample == 0:
        traced.extend((meta.partition, meta.offset, sent_ns, time.monotonic_ns()))


def summarize(samples_ns: list[int]) -> dict[str, Any]:
    values = sorted(v / 1e6 for v in samples_ns)
    out: dict[str, Any] = {"count": len(values)}
    for q in PERCENTILES:
        out[f"p{q:g}_ms"] = round(percentile(values, q), 3)
    out["max_ms"] = round(values[-1], 3)
    out["mean_ms"] = round(sum(values) / len(values), 3)
    step = max(1, len(values) // CDF_POINTS)
    out["cdf_ms"] = [round(v, 3) for v in values[::step]] + [round(values[-1], 3)]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 20.0
    if args.warmup is None:
        args.warmup = 0.5 if args.quick else 2.0
    if args.out is None and (args.rf, args.acks) != (3, "all"):
        # latency.json stays the target's configuration (the summary and plot read it).
        args.out = RESULTS_DIR / f"{NAME}-rf{args.rf}-acks{args.acks}.json"
    rate_source = "--rate"
    if args.rate is None:
        args.rate, rate_source = default_rate()
    total = args.warmup + args.seconds
    progress = Progress(int(total) + 1, NAME)
    ctx = multiprocessing.get_context("spawn")
    trace_dir: Path | None = None
    if args.trace:
        # Every process started from here on (controller, brokers, the consumer, this
        # process's producer) writes its trace file there.
        trace_dir = Path(tempfile.mkdtemp(prefix="minibroker-trace-"))
        os.environ[hop_trace.TRACE_DIR_ENV] = str(trace_dir)
        os.environ[hop_trace.TRACE_SAMPLE_ENV] = str(args.trace_sample)
        hop_trace.enable_from_environment("bench")
    with BenchCluster(3, keep_data=args.keep_data) as cluster:
        progress.update("creating the topic")
        run(cluster.create_topic(TOPIC, partitions=args.partitions, replication_factor=args.rf))
        ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
        consumer = ctx.Process(
            target=_consumer,
            args=(cluster.bootstrap, args.partitions, ready, stop, results),
            daemon=True,
        )
        consumer.start()
        try:
            if not ready.wait(CONSUMER_START_TIMEOUT_S):
                raise RuntimeError("the consumer process did not start")
            sent, acks = run(
                produce_at_rate(cluster.bootstrap, args.rate, total, progress, args.acks)
            )
            time.sleep(1.0)  # the last records reach the consumer
            stop.set()
            try:
                outcome = results.get(timeout=30)
            except queue.Empty:
                raise RuntimeError("the consumer did not report") from None
            if "error" in outcome:
                raise RuntimeError(f"consumer: {outcome['error']}")
        finally:
            consumer.join(10)
            if consumer.is_alive():
                consumer.kill()
    received = len(outcome["stamps"])
    if received != sent:
        raise RuntimeError(f"sent {sent} records but the consumer got {received}")
    cutoff = min(outcome["stamps"]) + int(args.warmup * 1e9)
    pairs = zip(outcome["stamps"], outcome["latencies_ns"], strict=True)
    e2e = [lat for s, lat in pairs if s >= cutoff]
    ack = [lat for s, lat in acks if s >= cutoff]
    row_e2e = {"measure": "end-to-end", **summarize(e2e)}
    row_ack = {"measure": "produce ack", **summarize(ack)}
    rows = [row_e2e, row_ack]
    table = [
        [r["measure"], r["count"], *(r[f"p{q:g}_ms"] for q in PERCENTILES), r["max_ms"]]
        for r in rows
    ]
    columns = ["measure", "records", *(f"p{q:g} ms" for q in PERCENTILES), "max ms"]
    print(
        f"RF {args.rf}, acks={args.acks}, rate {args.rate:,} records/s ({rate_source}); "
        "consumer in another process"
    )
    extra = {
        "rate_source": rate_source,
        "consumer": "separate process (spawned), CLOCK_MONOTONIC stamps",
        "replication_factor": args.rf,
        "acks": args.acks,
        "record_size": RECORD_SIZE,
    }
    if trace_dir is not None:
        result = breakdown(read_traces(trace_dir), warmup_until_ns=cutoff)
        print(format_breakdown(result))
        print(f"trace files in {trace_dir}")
        extra["trace"] = result
    return report(NAME, args, progress, columns, table, rows, **extra)


if __name__ == "__main__":
    sys.exit(main())
