"""Connection bounds of the broker and the controller, as an attacker meets them:
real processes on 127.0.0.1, raw sockets (issue 13, item 3).

Each test names the bound it protects and fails without it:
- pipelined Fetches whose answers are never read do not pin the broker's memory nor
  stall its loop;
- a consumer's fetch is capped by --fetch-max-bytes (but gets one whole batch);
- slowloris connections and a 1-byte-per-100-ms trickle are closed at the request
  frame deadline, with a few log lines, while a normal client keeps working;
- an idle connection is closed after --connections-max-idle-ms;
- the (limit+1)th connection from one address is refused, with one log line;
- at the controller, ~1000 anonymous idle connections do not lock a restarting
  broker out: it registers and is unfenced; silent and trickling connections are
  closed by the first-request and frame deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest
from cluster import Cluster
from cluster import TestClient
from cluster import count_lines
from cluster import open_file_budget
from cluster import rss_bytes

from client.admin import AsyncAdmin
from client.producer import AsyncProducer
from protocol.connection import ClientConnection
from protocol.framing import RequestHeader
from protocol.framing import encode_request_header
from protocol.framing import frame
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from protocol.messages import MetadataRequest
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.record_batch import encode_batch
from protocol.record_batch import iter_headers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MAX_INT32 = 2**31 - 1


def fetch_request(topic: str, offset: int = 0, *, max_bytes: int = MAX_INT32) -> FetchRequest:
    return FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=max_bytes,
        topics=[
            FetchTopic(
                topic=topic,
                partitions=[
                    FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=max_bytes)
                ],
            )
        ],
    )


async def create_topic(bootstrap: str, name: str) -> None:
    async with AsyncAdmin(bootstrap) as admin:
        await admin.create_topic(name, num_partitions=1, replication_factor=1)


async def produce_batch(client: TestClient, topic: str, values: list[bytes]) -> int:
    """One batch of `values` to partition 0; its base offset."""
    records = encode_batch([(None, v, (), None) for v in values])
    resp = await client.call(
        ProduceRequest(
            acks=1,
            timeout_ms=5000,
            topics=[
                ProduceTopic(name=topic, partitions=[ProducePartition(index=0, records=records)])
            ],
        ),
        timeout=30,
    )
    assert isinstance(resp, ProduceResponse)
    part = resp.topics[0].partitions[0]
    assert part.error_code == 0, part
    return part.base_offset


async def api_versions_s(client: TestClient) -> float:
    """One ApiVersions round trip, in seconds."""
    started = time.monotonic()
    body = await client.call(ApiVersionsRequest(), timeout=30)
    assert isinstance(body, ApiVersionsResponse)
    return time.monotonic() - started


async def closed_by_peer(reader: asyncio.StreamReader, timeout: float) -> bool:
    """Whether the server closes this connection within `timeout` (False also when
    it answers something instead)."""
    try:
        data = await asyncio.wait_for(reader.read(65536), timeout)
    except TimeoutError:  # first: TimeoutError is an OSError
        return False
    except OSError:
        return True
    return data == b""


async def trickle_until_closed(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes, limit_s: float
) -> float | None:
    """Send `data` 1 byte per 100 ms until the server closes the connection: the
    seconds that took, or None when it was still open after `limit_s`."""
    assert len(data) > limit_s * 10, "the frame must outlast the trickle"
    started = time.monotonic()
    for byte in data:
        if time.monotonic() - started > limit_s:
            return None
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except OSError:
            return time.monotonic() - started
        if await closed_by_peer(reader, 0.1):
            return time.monotonic() - started
    return None


# ---------------------------------------------------------------- memory and loop


async def test_pipelined_fetches_never_read_do_not_pin_memory_or_stall_the_loop(
    cluster: Cluster,
) -> None:
    """Forty pipelined Fetch requests with max_bytes 2^31-1 on a ~50 MB partition,
    never reading the answers, grew the broker from 60 MB to 1,986 MB and stalled its
    loop up to 6.5 s. Now the broker holds about one answer for that connection: its
    RSS stays within +300 MB and another client's round trips stay under 1 s."""
    cluster.start_controller()
    broker = cluster.start_broker(1)
    bootstrap = f"{broker.host}:{broker.port}"
    await create_topic(bootstrap, "big")
    await create_topic(bootstrap, "small")
    value = b"v" * 1000
    async with AsyncProducer(bootstrap, acks=1, batch_size=1_000_000, linger_ms=20) as producer:
        futures = [await producer.send("big", value, partition=0) for _ in range(50_000)]
        await producer.flush()
    assert all(f.done() and f.exception() is None for f in futures)

    async with TestClient(broker.host, broker.port) as probe:
        for _ in range(3):
            await api_versions_s(probe)
        baseline = rss_bytes(broker.pid)
        attacker = socket.socket()
        attacker.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        attacker.connect((broker.host, broker.port))
        try:
            conn = ClientConnection("attacker")
            data = b"".join(conn.send_request(fetch_request("big"))[1] for _ in range(40))
            assert len(data) < 20_000
            attacker.sendall(data)  # and never read
            peak = baseline
            slowest = 0.0
            produce_fetch = []
            deadline = time.monotonic() + 6.0
            i = 0
            while time.monotonic() < deadline:
                slowest = max(slowest, await api_versions_s(probe))
                peak = max(peak, rss_bytes(broker.pid))
                if peak - baseline > 300e6:
                    break  # failed: stop before the machine runs short
                if i % 10 == 0:  # a produce and a fetch of it back, from another client
                    started = time.monotonic()
                    offset = await produce_batch(probe, "small", [b"x"])
                    got = await probe.call(fetch_request("small", offset), timeout=30)
                    assert isinstance(got, FetchResponse)
                    assert got.responses[0].partitions[0].records
                    produce_fetch.append(time.monotonic() - started)
                i += 1
                await asyncio.sleep(0.1)
        finally:
            attacker.close()
    grown = peak - baseline
    assert grown < 300e6, (
        f"the broker grew by {grown / 1e6:.0f} MB (from {baseline / 1e6:.0f} MB) "
        "for 40 fetches whose answers were never read"
    )
    assert slowest < 1.0, f"an ApiVersions round trip took {slowest:.2f}s during the attack"
    assert produce_fetch and max(produce_fetch) < 2.0, produce_fetch


async def test_consumer_fetch_is_capped_by_fetch_max_bytes_but_gets_one_whole_batch(
    cluster: Cluster,
) -> None:
    cap = 1_000_000
    cluster.start_controller()
    broker = cluster.start_broker(1, "--fetch-max-bytes", str(cap))
    await create_topic(f"{broker.host}:{broker.port}", "capped")
    async with TestClient(broker.host, broker.port) as client:
        batches = [[b"b" * 1000] * 1030] + [[b"s" * 1000] * 100] * 30  # 1.04 MB, then 30x100 KB
        for values in batches:
            await produce_batch(client, "capped", values)
        # The first batch alone is over the cap: it comes whole, and alone (KIP-74).
        first = await client.call(fetch_request("capped"))
        assert isinstance(first, FetchResponse)
        records = first.responses[0].partitions[0].records
        headers = [h for _, h in iter_headers(records)]
        assert len(headers) == 1, f"{len(records)} bytes in {len(headers)} batches, cap {cap}"
        header = headers[0]
        assert header.size == len(records) > cap
        # From there, as many whole batches as fit in the cap, not all 3 MB.
        rest = await client.call(fetch_request("capped", header.next_offset))
        assert isinstance(rest, FetchResponse)
        records = rest.responses[0].partitions[0].records
        headers = [h for _, h in iter_headers(records)]
        assert sum(h.size for h in headers) == len(records)
        assert 0 < len(records) <= cap, f"{len(records)} bytes for a cap of {cap}"
        assert len(headers) < 30


# ---------------------------------------------------------------- deadlines


async def test_slowloris_and_a_trickle_are_closed_at_the_frame_deadline(cluster: Cluster) -> None:
    """1,000 connections with a partial frame and one sending 1 byte per 100 ms were
    all held. With a 2 s request frame timeout, 200 partial frames and the trickle are
    closed at about 2 s, with a few log lines, and a normal client keeps working."""
    cluster.start_controller()
    broker = cluster.start_broker(1, "--request-frame-timeout-ms", "2000")
    host, port = broker.host, broker.port
    head = encode_request_header(RequestHeader(18, 0, 1, "slow"))
    big_frame = frame(head + b"\x80" + b"\x00" * 1000)  # a frame of ~1 KB, never finished
    partial = [await asyncio.open_connection(host, port) for _ in range(200)]
    for _, writer in partial:
        writer.write(big_frame[:7])

    trickle_reader, trickle_writer = await asyncio.open_connection(host, port)
    trickle_started = time.monotonic()
    trickle_task = asyncio.create_task(
        trickle_until_closed(trickle_reader, trickle_writer, big_frame, 8.0)
    )
    async with TestClient(host, port) as normal:
        slowest = 0.0
        while not trickle_task.done() and time.monotonic() - trickle_started < 15:
            slowest = max(slowest, await api_versions_s(normal))
            await asyncio.sleep(0.2)
        closed = await asyncio.gather(*(closed_by_peer(r, 5.0) for r, _ in partial))
        assert (await api_versions_s(normal)) < 1.0
    trickle_s = await trickle_task
    for _, writer in partial:
        writer.close()
    trickle_writer.close()
    assert all(closed), f"{closed.count(False)} of 200 partial frames still held"
    assert trickle_s is not None, "the connection sending 1 byte per 100 ms was held 8 s"
    assert 1.9 <= trickle_s < 6.0, f"the trickle was closed after {trickle_s:.1f}s"
    assert slowest < 1.0
    log = broker.log_text()
    lines = count_lines(log, "still incomplete")
    assert 1 <= lines <= 3, f"{lines} log lines for 201 closed connections:\n{log[-3000:]}"


async def test_idle_connection_is_closed_after_connections_max_idle_ms(cluster: Cluster) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, "--connections-max-idle-ms", "1500")
    async with (
        TestClient(broker.host, broker.port) as idle,
        TestClient(broker.host, broker.port) as busy,
    ):
        await api_versions_s(idle)
        started = time.monotonic()
        assert idle.reader is not None
        idle_closed = asyncio.create_task(closed_by_peer(idle.reader, 8.0))
        while not idle_closed.done():
            await api_versions_s(busy)  # a connection in use is never idle
            await asyncio.sleep(0.3)
        assert idle_closed.result(), "the idle connection was still open after 8 s"
        assert 1.4 <= time.monotonic() - started < 5.0
        await api_versions_s(busy)
    assert count_lines(broker.log_text(), "--connections-max-idle-ms 1500") == 1


async def test_connection_over_the_per_ip_limit_is_refused_with_one_log_line(
    cluster: Cluster,
) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, "--max-connections-per-ip", "5")
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(TestClient(broker.host, broker.port)) for _ in range(5)
        ]
        for client in clients:
            await api_versions_s(client)
        reader, writer = await asyncio.open_connection(broker.host, broker.port)
        writer.write(ClientConnection().send_request(MetadataRequest())[1])
        assert await closed_by_peer(reader, 5.0), "the 6th connection from 127.0.0.1 was served"
        writer.close()
        for client in clients:
            await api_versions_s(client)
        log = broker.log_text()
        assert count_lines(log, "refusing connection from 127.0.0.1") == 1, log[-2000:]
        assert "--max-connections-per-ip" in log
    # Once they are closed, the address may connect again.
    deadline = time.monotonic() + 5
    while True:
        try:
            async with TestClient(broker.host, broker.port) as again:
                await api_versions_s(again)
            break
        except (ConnectionError, TimeoutError):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)


# ---------------------------------------------------------------- the controller


@pytest.mark.parametrize("flood_speaks", [False, True], ids=["silent", "speaking"])
def test_anonymous_connections_do_not_lock_a_restarting_broker_out_of_the_controller(
    cluster: Cluster, flood_speaks: bool
) -> None:
    """994 anonymous idle connections locked a restarting broker out of registration.
    Here anonymous connections take every slot of the controller, and the broker's as
    soon as it is SIGKILLed. Restarted, it registers and is unfenced: silent ones are
    displaced by newcomers; ones that spoke (ApiVersions, then idle) may not hold the
    slots kept for brokers. The first-request timeout is set long so that it is not
    what lets the broker in."""
    max_connections = min(1000, open_file_budget(1010) - 10)
    cluster.start_controller(
        "--first-request-timeout-ms",
        "120000",
        "--max-connections-per-ip",
        str(max_connections),
        "--max-connections",
        str(max_connections),
        "--reserved-broker-connections",
        str(max_connections * 3 // 10),
    )
    broker = cluster.start_broker(1)
    assert cluster.controller is not None
    host, port = cluster.controller.host, cluster.controller.port
    api_versions = ClientConnection("flood").send_request(ApiVersionsRequest())[1]
    flood: list[socket.socket] = []

    def connect(n: int) -> None:
        for _ in range(n):
            sock = socket.create_connection((host, port), timeout=5)
            flood.append(sock)
            if flood_speaks:
                with contextlib.suppress(OSError):
                    sock.sendall(api_versions)
                    sock.recv(65536)

    try:
        connect(max_connections - 3)  # every slot but the broker's three
        broker.kill()
        time.sleep(0.5)
        connect(6)  # and the broker's, as soon as they are free
        started = time.monotonic()
        cluster.start_broker(1)  # waits for "broker 1 started": registered and unfenced
        took = time.monotonic() - started
        assert took < 20, f"the broker took {took:.1f}s to register and be unfenced"
    finally:
        for sock in flood:
            sock.close()
    lines = count_lines(cluster.controller.log_text(), "connection")
    assert lines <= 10, f"{lines} log lines about connections"


async def test_controller_closes_silent_and_trickling_connections(cluster: Cluster) -> None:
    cluster.start_controller(
        "--first-request-timeout-ms", "1000", "--request-frame-timeout-ms", "1500"
    )
    assert cluster.controller is not None
    host, port = cluster.controller.host, cluster.controller.port
    silent_reader, silent_writer = await asyncio.open_connection(host, port)
    tool = TestClient(host, port)
    async with tool:
        await api_versions_s(tool)
        trickle = TestClient(host, port)
        await trickle.__aenter__()
        await api_versions_s(trickle)  # a whole first request, then a trickled one
        trickle_reader, trickle_writer = trickle.reader, trickle.writer
        assert trickle_reader is not None and trickle_writer is not None
        head = encode_request_header(RequestHeader(18, 0, 1, "slow"))
        data = frame(head + b"\x80" + b"\x00" * 500)
        took = await trickle_until_closed(trickle_reader, trickle_writer, data, 8.0)
        assert took is not None, "the connection sending 1 byte per 100 ms was held 8 s"
        assert 1.4 <= took < 5.0, f"the trickle was closed after {took:.1f}s"
        assert await closed_by_peer(silent_reader, 3.0), "the silent connection is still open"
        await api_versions_s(tool)  # a tool that spoke stays (idle limit: 10 minutes)
    silent_writer.close()
    trickle_writer.close()
    log = cluster.controller.log_text()
    assert count_lines(log, "--first-request-timeout-ms") == 1
    assert count_lines(log, "still incomplete") == 1
