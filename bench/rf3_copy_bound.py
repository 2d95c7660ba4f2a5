"""The RF 3 acks=all produce path as bare Python copies, no broker code:
`python -m bench.rf3_copy_bound [--mib N] [--dir PATH] [--reuse-files]`

Issue 20 item 3's bound. Four processes, 1 MiB batches: a producer `sendall`s each
batch to a leader; the leader `recv_into`s it, `os.write`s it to its log file,
`os.pread`s it back (the fetch) and `sendall`s it to two followers; each follower
`recv_into`s it, `os.write`s it to its own log file and answers 8 bytes; the leader
answers the producer once both followers have (4 batches in flight, TCP_NODELAY
everywhere). Prints the wall rate and the CPU seconds per MB of all four processes
(utime + stime), and the rate two cores would allow at that CPU cost. New files
("cold": the page cache allocates every page) unless `--reuse-files` (the previous
run's files are overwritten in place: "warm").
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import socket
import time
from pathlib import Path

BATCH = 1 << 20
IN_FLIGHT = 4
ACK = b"a" * 8


def recv_exact(sock: socket.socket, buf: bytearray) -> None:
    view = memoryview(buf)
    got = 0
    while got < len(buf):
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError("peer closed")
        got += n


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def follower(port: int, path: str, count: int) -> None:
    sock = connect(port)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    buf = bytearray(BATCH)
    for _ in range(count):
        recv_exact(sock, buf)
        os.write(fd, buf)
        sock.sendall(ACK)
    os.close(fd)


def leader(listener: socket.socket, path: str, count: int) -> None:
    conns = [listener.accept()[0] for _ in range(3)]  # the producer first, then followers
    for conn in conns:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    producer, *followers = conns
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    buf = bytearray(BATCH)
    ack = bytearray(len(ACK))
    for i in range(count):
        recv_exact(producer, buf)
        os.write(fd, buf)
        fetched = os.pread(fd, BATCH, i * BATCH)
        for conn in followers:
            conn.sendall(fetched)
        for conn in followers:
            recv_exact(conn, ack)
        producer.sendall(ACK)
    os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.rf3_copy_bound", description=__doc__)
    p.add_argument("--mib", type=int, default=512, help="MiB produced [512]")
    p.add_argument("--dir", type=Path, default=Path("."), help="where the 3 log files go [.]")
    p.add_argument("--reuse-files", action="store_true", help="overwrite the last run's files")
    args = p.parse_args()
    paths = [args.dir / f"rf3-bound-{name}.log" for name in ("leader", "f1", "f2")]
    if not args.reuse_files:
        for path in paths:
            path.unlink(missing_ok=True)
    multiprocessing.set_start_method("fork")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    workers = [multiprocessing.Process(target=leader, args=(listener, str(paths[0]), args.mib))]
    workers[0].start()
    producer = connect(port)
    for path in paths[1:]:
        time.sleep(0.1)  # the leader takes the producer's connection first, then these
        workers.append(multiprocessing.Process(target=follower, args=(port, str(path), args.mib)))
        workers[-1].start()
    payload = os.urandom(BATCH)
    ack = bytearray(len(ACK))
    began, cpu_before = time.perf_counter(), os.times()
    for i in range(args.mib):
        producer.sendall(payload)
        if i >= IN_FLIGHT:
            recv_exact(producer, ack)
    for _ in range(min(IN_FLIGHT, args.mib)):
        recv_exact(producer, ack)
    wall = time.perf_counter() - began
    for worker in workers:
        worker.join(timeout=60)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_after = os.times()
    own = cpu_after.user - cpu_before.user + cpu_after.system - cpu_before.system
    cpu = children.ru_utime + children.ru_stime + own
    mb = args.mib * BATCH / 1e6
    print(
        f"{args.mib} MiB in {wall:.2f} s: {mb / wall:.0f} MB/s; CPU {cpu:.2f} s = "
        f"{cpu / mb * 1000:.2f} ms/MB (two cores' bound {2 * mb / cpu:.0f} MB/s)"
    )


if __name__ == "__main__":
    main()
