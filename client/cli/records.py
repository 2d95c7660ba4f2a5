"""`minibroker produce TOPIC` (stdin lines -> records) and `minibroker consume TOPIC`
(records -> stdout)."""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable

import click

from client.cli.plumbing import TOPIC_WAIT_MS
from client.cli.plumbing import _fail
from client.cli.plumbing import client_command
from client.cli.plumbing import connection_options
from client.cli.plumbing import number_option
from client.cli.plumbing import run
from client.cli.root import cli
from client.consumer import AsyncConsumer
from client.errors import LogTruncationError
from client.producer import AsyncProducer
from client.producer import parse_acks
from client.types import ConsumerRecord
from client.types import OffsetAndMetadata
from client.types import RecordMetadata
from client.types import TopicPartition

# ------------------------------------------------------------------ produce


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option(
    "-k",
    "--key-separator",
    default=None,
    metavar="SEP",
    help="Split each line at the first SEP into key and value (a line without SEP "
    "is an error). Default: no key.",
)
@click.option(
    "--acks",
    type=click.Choice(["0", "1", "all", "-1"]),
    default="all",
    show_default=True,
    help="0: do not wait; 1: the leader wrote it; all: every in-sync replica has it.",
)
@number_option(
    "-p",
    "--partition",
    at_least=0,
    help="Write every record to this partition. Default: murmur2 of the key, or "
    "sticky batches across partitions without a key.",
)
@click.option(
    "-z",
    "--compression",
    type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]),
    default="none",
    show_default=True,
    help="Batch compression.",
)
@number_option(
    "--linger-ms", at_least=0, default=5, help="How long a batch waits for more records."
)
@number_option("--batch-size", at_least=1, default=16_384, help="Bytes per partition batch.")
@number_option(
    "--delivery-timeout-ms",
    at_least=1,
    default=30_000,
    help="Give up on a record (retrying included) after this long.",
)
@client_command
def produce(
    topic_name: str,
    key_separator: str | None,
    acks: str,
    partition: int | None,
    compression: str,
    linger_ms: int,
    batch_size: int,
    delivery_timeout_ms: int,
    bootstrap: str,
) -> None:
    """Produce stdin lines to TOPIC, one record per line (the newline stripped).

    A summary goes to stderr; the exit code is 1 if any record was not delivered."""
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    sep = key_separator.encode() if key_separator is not None else None
    stats = run(
        _produce,
        bootstrap,
        topic_name,
        sep,
        parse_acks(acks),
        partition,
        compression,
        linger_ms,
        batch_size,
        delivery_timeout_ms,
    )
    ok, failed, first_error, per_partition, seconds = stats
    parts = ", ".join(f"{p}: {n}" for p, n in sorted(per_partition.items()))
    click.echo(
        f"produced {ok} records to {topic_name} in {seconds:.2f} s"
        + (f" (partition {parts})" if parts else ""),
        err=True,
    )
    if failed:
        _fail(f"{failed} records were not delivered; first error: {first_error}")


async def _produce(
    bootstrap: str,
    topic_name: str,
    sep: bytes | None,
    acks: int,
    partition: int | None,
    compression: str,
    linger_ms: int,
    batch_size: int,
    delivery_timeout_ms: int,
) -> tuple[int, int, BaseException | None, Counter[int], float]:
    started = time.monotonic()
    per_partition: Counter[int] = Counter()
    failures: list[BaseException] = []

    def tally(future: asyncio.Future[RecordMetadata]) -> None:
        if future.cancelled():
            failures.append(asyncio.CancelledError())
            return
        exc = future.exception()
        if exc is not None:
            failures.append(exc)
        else:
            per_partition[future.result().partition] += 1

    producer = AsyncProducer(
        bootstrap,
        client_id="minibroker-cli",
        acks=acks,
        compression_type=compression,
        linger_ms=linger_ms,
        batch_size=batch_size,
        delivery_timeout_ms=delivery_timeout_ms,
        request_timeout_ms=min(delivery_timeout_ms, 30_000),
        max_block_ms=TOPIC_WAIT_MS,
        **connection_options(),
    )
    async with producer:
        await producer.partitions_for(topic_name)  # fail fast on a missing topic
        chunks = _stdin_chunks()
        tail = b""
        lineno = 0
        while True:
            chunk = await chunks.get()
            if not chunk:
                break
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            for line in lines:
                lineno += 1
                await _send_line(producer, topic_name, line, sep, partition, lineno, tally)
        if tail:
            lineno += 1
            await _send_line(producer, topic_name, tail, sep, partition, lineno, tally)
        await producer.flush()
    first = failures[0] if failures else None
    ok = sum(per_partition.values())
    return ok, len(failures), first, per_partition, time.monotonic() - started


def _stdin_chunks(max_chunks: int = 16) -> asyncio.Queue[bytes]:
    """Chunks of stdin (b"" at the end) from a daemon thread: a read blocked on a
    terminal must not keep the process alive after Ctrl-C, as an executor thread would."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue(max_chunks)
    # The raw fd, not sys.stdin.buffer: a daemon thread blocked inside the buffered
    # reader holds its lock, which aborts the interpreter at exit.
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):  # no stdin at all: nothing to send
        chunks.put_nowait(b"")
        return chunks

    def pump() -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            try:
                asyncio.run_coroutine_threadsafe(chunks.put(chunk), loop).result()
            except (RuntimeError, concurrent.futures.CancelledError):
                return  # the loop is gone
            if not chunk:
                return

    threading.Thread(target=pump, name="minibroker-stdin", daemon=True).start()
    return chunks


async def _send_line(
    producer: AsyncProducer,
    topic_name: str,
    line: bytes,
    sep: bytes | None,
    partition: int | None,
    lineno: int,
    tally: Callable[[asyncio.Future[RecordMetadata]], None],
) -> None:
    key = None
    if sep is not None:
        key, found, value = line.partition(sep)
        if not found:
            raise ValueError(
                f"line {lineno} has no key separator {sep.decode()!r} (records before it were sent)"
            )
    else:
        value = line
    future = await producer.send(topic_name, value, key=key, partition=partition)
    future.add_done_callback(tally)


# ------------------------------------------------------------------ consume


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode(errors="backslashreplace")


def _formatter(fmt: str) -> Callable[[ConsumerRecord], bytes]:
    if fmt == "value":
        return lambda r: (r.value or b"") + b"\n"
    if fmt == "full":
        return lambda r: (
            f"partition={r.partition} offset={r.offset} leader_epoch={r.leader_epoch} "
            f"timestamp={r.timestamp} key={_text(r.key)} value={_text(r.value)}\n"
        ).encode()
    if fmt == "json":
        return lambda r: (
            json.dumps(
                {
                    "topic": r.topic,
                    "partition": r.partition,
                    "offset": r.offset,
                    "leader_epoch": r.leader_epoch,
                    "timestamp": r.timestamp,
                    "key": None if r.key is None else _text(r.key),
                    "value": None if r.value is None else _text(r.value),
                    "headers": {k: _text(v) for k, v in r.headers},
                }
            )
            + "\n"
        ).encode()
    template = codecs.decode(fmt, "unicode_escape")  # "\n", "\t" as typed in a shell

    def render(r: ConsumerRecord) -> bytes:
        fields = {
            "t": r.topic,
            "p": str(r.partition),
            "o": str(r.offset),
            "e": str(r.leader_epoch),
            "T": str(r.timestamp),
            "k": _text(r.key),
            "v": _text(r.value),
            "%": "%",
        }
        out: list[str] = []
        i = 0
        while i < len(template):
            c = template[i]
            if c == "%" and i + 1 < len(template) and template[i + 1] in fields:
                out.append(fields[template[i + 1]])
                i += 2
            else:
                out.append(c)
                i += 1
        return "".join(out).encode()

    return render


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option(
    "--from-beginning",
    is_flag=True,
    help="Start at the log start offset. Default: only new records.",
)
@number_option(
    "-o", "--offset", at_least=0, help="Start at this offset (in every consumed partition)."
)
@click.option(
    "-p",
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="Consume only this partition (repeatable). Default: all partitions.",
)
@click.option(
    "-n", "--num", type=click.IntRange(min=1), default=None, help="Exit after this many records."
)
@click.option(
    "-f",
    "--format",
    "fmt",
    default="value",
    show_default=True,
    help="value (the value and a newline), full (partition, offset, leader epoch, "
    "timestamp, key, value), json (one object per line), or a template with "
    "%t topic, %p partition, %o offset, %e leader epoch, %T timestamp, %k key, "
    "%v value, and \\n, \\t escapes.",
)
@number_option(
    "--timeout-ms",
    at_least=1,
    help="Exit when no record arrived for this long. Default: wait forever.",
)
@click.option(
    "--reset",
    "reset",
    type=click.Choice(["none", "earliest", "latest"]),
    default="none",
    show_default=True,
    help="On a detected log truncation (KIP-320) or an offset out of range: 'none' "
    "reports it and exits 1; 'earliest'/'latest' print a warning and continue from the "
    "divergence offset (out of range: from the log start / end).",
)
@client_command
def consume(
    topic_name: str,
    from_beginning: bool,
    offset: int | None,
    partitions: tuple[int, ...],
    num: int | None,
    fmt: str,
    timeout_ms: int | None,
    reset: str,
    bootstrap: str,
) -> None:
    """Print records of TOPIC to stdout (Ctrl-C to stop)."""
    if offset is not None and from_beginning:
        raise click.UsageError("--offset and --from-beginning exclude each other")
    render = _formatter(fmt)
    count = run(
        _consume,
        bootstrap,
        topic_name,
        from_beginning,
        offset,
        partitions,
        num,
        render,
        timeout_ms,
        reset,
    )
    if num is not None and count < num:
        _fail(f"only {count} of {num} records arrived before --timeout-ms {timeout_ms} passed")


async def _consume(
    bootstrap: str,
    topic_name: str,
    from_beginning: bool,
    offset: int | None,
    partitions: tuple[int, ...],
    num: int | None,
    render: Callable[[ConsumerRecord], bytes],
    timeout_ms: int | None,
    reset: str = "none",
) -> int:
    out = sys.stdout.buffer
    count = 0

    def warn_truncation(tp: TopicPartition, position: int, divergence: OffsetAndMetadata) -> None:
        click.echo(
            f"warning: log truncation on topic {tp.topic} partition {tp.partition}: position "
            f"{position}, divergence offset {divergence.offset}; continuing from "
            f"{divergence.offset} (--reset {reset})",
            err=True,
        )

    consumer = AsyncConsumer(
        bootstrap,
        client_id="minibroker-cli",
        auto_offset_reset=reset,
        on_truncation=warn_truncation,
        **connection_options(),
    )
    async with consumer:
        existing = await consumer.partitions_for_topic(topic_name, timeout_ms=TOPIC_WAIT_MS)
        wanted = sorted(partitions) if partitions else sorted(existing)
        missing = [p for p in wanted if p not in existing]
        if missing:
            raise ValueError(
                f"topic {topic_name} has no partition {missing[0]} (it has {len(existing)})"
            )
        tps = [TopicPartition(topic_name, p) for p in wanted]
        consumer.assign(tps)
        for tp in tps:
            if offset is not None:
                consumer.seek(tp, offset)
        if offset is None:
            if from_beginning:
                consumer.seek_to_beginning(*tps)
            else:
                consumer.seek_to_end(*tps)
        last_record = time.monotonic()
        try:
            while num is None or count < num:
                wait_ms = 1_000
                if timeout_ms is not None:
                    left = timeout_ms - (time.monotonic() - last_record) * 1000
                    if left <= 0:
                        break
                    wait_ms = int(min(wait_ms, left)) + 1
                limit = None if num is None else num - count
                batches = await consumer.poll(timeout_ms=wait_ms, max_records=limit)
                if not batches:
                    continue
                last_record = time.monotonic()
                for records in batches.values():
                    for record in records:
                        out.write(render(record))
                        count += 1
                out.flush()
        except LogTruncationError as exc:
            out.flush()
            tp, divergence = next(iter(exc.divergent_offsets.items()))
            _fail(
                f"log truncation on topic {tp.topic} partition {tp.partition}: position "
                f"{exc.positions.get(tp, -1)}, divergence offset {divergence.offset} "
                "(records consumed from there on are gone); rerun with --offset "
                f"{divergence.offset} or --reset earliest to continue"
            )
        except BrokenPipeError:
            # `consume ... | head`: the reader is gone; stop quietly.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
    return count
