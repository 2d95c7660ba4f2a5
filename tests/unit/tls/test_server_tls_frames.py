"""runtime.tls.ServerTls handing its decrypted records, unjoined, to a connection's
frame decoder (`FrameDecoder.feed_chunks`, as the TLS listener does). A real TLS 1.3
session, over memory BIOs, against a client SSLObject: every frame comes out byte for
byte and in order, small and large, however the client's writes cut the frames into
records and however the ciphertext is cut into reads; a Produce decoded from such a
frame carries its records exactly."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from client.throwaway_ca import ThrowawayCA
from protocol.connection import ClientConnection
from protocol.connection import Request
from protocol.connection import ServerConnection
from protocol.framing import LARGE_FRAME_BYTES
from protocol.framing import FrameDecoder
from protocol.framing import frame
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceTopic
from runtime.tls import ServerTls
from runtime.tls import TlsFiles
from runtime.tls import server_context


def _pattern(size: int, salt: int) -> bytes:
    return bytes((i * 7 + salt) % 251 for i in range(251)) * (size // 251) + b"z" * (size % 251)


PAYLOADS = [
    b"a",
    _pattern(LARGE_FRAME_BYTES, 1),
    b"",
    _pattern(1024 * 1024 + 7, 2),  # a 1 MiB batch's frame
    _pattern(LARGE_FRAME_BYTES - 1, 3),
    _pattern(4 * 1024 * 1024 + 5, 4),
    b"last",
]


@pytest.fixture(scope="module")
def contexts(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    directory: Path = tmp_path_factory.mktemp("ca")
    ca = ThrowawayCA.create(directory)
    cert = ca.issue("server", hosts=["127.0.0.1"])
    client = ssl.create_default_context(cafile=str(ca.cafile))
    return server_context(TlsFiles(cert.certfile, cert.keyfile)), client


class Session:
    """A client SSLObject and a ServerTls, handshaken through memory BIOs."""

    def __init__(self, contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
        server_ctx, client_ctx = contexts
        self.server = ServerTls(server_ctx)
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.client = client_ctx.wrap_bio(self._in, self._out, server_hostname="127.0.0.1")
        handshake = FrameDecoder()
        for _ in range(5):
            try:
                self.client.do_handshake()
                break
            except ssl.SSLWantReadError:
                handshake.feed_chunks(self.server.receive(self._out.read()))
                self._in.write(self.server.outgoing())
        handshake.feed_chunks(self.server.receive(self._out.read()))  # the client's Finished
        assert self.server.established
        assert handshake.buffered == 0

    def encrypt(self, plaintext: bytes, write_size: int) -> bytes:
        """`plaintext` as the client sends it in writes of `write_size` (a record each,
        at most 16 KiB)."""
        for start in range(0, len(plaintext), write_size):
            self.client.write(plaintext[start : start + write_size])
        return self._out.read()


@pytest.mark.parametrize(
    ("write_size", "read_size"),
    [(16 * 1024, 256 * 1024), (16 * 1024 - 3, 16 * 1024 + 29), (4096 + 1, 1000), (65536, 7)],
    ids=["records-big-reads", "records-odd-reads", "small-records", "tiny-reads"],
)
def test_frames_come_out_whole_and_in_order(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext], write_size: int, read_size: int
) -> None:
    session = Session(contexts)
    wire = b"".join(frame(p) for p in PAYLOADS)
    ciphertext = session.encrypt(wire, write_size)
    if read_size == 7:  # every byte boundary of the frames' first records, then larger
        ciphertext_reads = [ciphertext[i : i + 7] for i in range(0, 70_000, 7)]
        ciphertext_reads.append(ciphertext[70_000:])
    else:
        ciphertext_reads = [
            ciphertext[i : i + read_size] for i in range(0, len(ciphertext), read_size)
        ]
    decoder = FrameDecoder()
    got: list[bytes] = []
    plaintext = 0
    for data in ciphertext_reads:
        chunks = session.server.receive(data)
        plaintext += sum(map(len, chunks))
        decoder.feed_chunks(chunks)
        while (payload := decoder.next_frame()) is not None:
            got.append(payload)
    assert plaintext == len(wire)
    assert [len(p) for p in got] == [len(p) for p in PAYLOADS]
    assert got == PAYLOADS
    assert decoder.buffered == 0


def test_a_produce_decodes_from_the_decrypted_records(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    """The records of a 1 MiB Produce, decrypted record by record and gathered by the
    frame decoder, are exactly those sent."""
    session = Session(contexts)
    records = _pattern(1024 * 1024, 6)
    topics = [ProduceTopic(name="t", partitions=[ProducePartition(index=0, records=records)])]
    client = ClientConnection()
    _, wire = client.send_request(ProduceRequest(acks=1, topics=topics))
    conn = ServerConnection()
    for start in range(0, len(wire), 300_000):  # several socket reads
        ciphertext = session.encrypt(wire[start : start + 300_000], 16384)
        conn.receive_chunks(session.server.receive(ciphertext))
    event = conn.next_event()
    assert isinstance(event, Request) and isinstance(event.body, ProduceRequest)
    assert bytes(event.body.topics[0].partitions[0].records) == records
    assert conn.next_event() is None
