"""The machine's floor for a record that must wake several processes in series: a
token passed around a ring of N processes over loopback TCP (TCP_NODELAY), nothing of
minibroker in it. An acks=all record wakes four processes in series at least
(producer -> leader -> follower -> leader -> consumer), so the ring of 4 with one
trip per sample is the scheduling and wake-up floor of the end-to-end latency here.

    python -m bench.wakeup_floor [--processes 4] [--rate 5000] [--seconds 10] [--asyncio]

Each sample: process 0 stamps CLOCK_MONOTONIC, writes 100 B to process 1 (the time of
that send() call, which runs the receiver's TCP stack and wake-up, is reported too), which
forwards to 2, ... back to 0; the sample is the trip time. Blocking sockets by default
(the bare kernel); --asyncio runs every hop on a uvloop event loop (what our
processes do). Samples are paced at --rate per second (the token waits in process 0
between trips) so the CPUs are as busy as they are from the ring alone.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import time
from typing import Any

import uvloop

PAYLOAD = b"x" * 100


def _listen() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _forwarder(listener: socket.socket, next_port: int, use_asyncio: bool) -> None:
    inbound, _ = listener.accept()
    outbound = _connect(next_port)
    if use_asyncio:
        uvloop.run(_forward_async(inbound, outbound))
        return
    while True:
        data = inbound.recv(65536)
        if not data:
            return
        outbound.sendall(data)


async def _forward_async(inbound: socket.socket, outbound: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    out_transport, _ = await loop.create_connection(asyncio.Protocol, sock=outbound)

    class Forward(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            out_transport.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if not done.done():
                done.set_result(None)

    await loop.connect_accepted_socket(Forward, inbound)
    await done


def run_ring(
    processes: int, rate: int, seconds: float, use_asyncio: bool
) -> tuple[list[int], list[int]]:
    """(trip times, times of process 0's send() call, which wakes process 1) in ns."""
    ctx = multiprocessing.get_context("fork")
    listeners = [_listen() for _ in range(processes)]
    ports = [s.getsockname()[1] for s in listeners]
    children = [
        ctx.Process(target=_forwarder, args=(listeners[i], ports[(i + 1) % processes], use_asyncio))
        for i in range(1, processes)
    ]
    for child in children:
        child.start()
    outbound = _connect(ports[1])
    inbound, _ = listeners[0].accept()
    samples: list[int] = []
    sends: list[int] = []
    interval = 1 / rate
    deadline = time.monotonic() + seconds
    next_at = time.monotonic()
    try:
        while time.monotonic() < deadline:
            next_at += interval
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            start = time.monotonic_ns()
            outbound.sendall(PAYLOAD)
            sends.append(time.monotonic_ns() - start)
            got = 0
            while got < len(PAYLOAD):
                got += len(inbound.recv(65536))
            samples.append(time.monotonic_ns() - start)
    finally:
        outbound.close()
        inbound.close()
        for child in children:
            child.join(2)
            if child.is_alive():
                child.kill()
    return samples, sends


def summary(samples_ns: list[int]) -> dict[str, Any]:
    values = sorted(samples_ns)
    n = len(values)

    def q(p: float) -> float:
        return round(values[min(n - 1, int(p / 100 * n))] / 1e6, 3)

    return {"trips": n, "p50_ms": q(50), "p99_ms": q(99), "p99.9_ms": q(99.9), "max_ms": q(100)}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.wakeup_floor", description=__doc__)
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--rate", type=int, default=5000, help="trips per second [5000]")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--asyncio", action="store_true", help="forward on uvloop event loops")
    args = p.parse_args()
    samples, sends = run_ring(args.processes, args.rate, args.seconds, args.asyncio)
    kind = "uvloop" if args.asyncio else "blocking sockets"
    print(f"ring of {args.processes} processes ({kind}), {args.rate}/s: {summary(samples)}")
    print(f"  the send() that wakes the next process: {summary(sends)}")


if __name__ == "__main__":
    main()
