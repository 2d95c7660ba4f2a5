"""An in-test broker for the client's unit tests: a real asyncio TCP server around
`protocol.connection.ServerConnection`, with an in-memory partition state machine
(leader epochs, logs of batches, fencing by current_leader_epoch) and hooks to
script answers (stale metadata, fenced epochs, silence)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

from protocol.connection import RejectedRequest
from protocol.connection import Request
from protocol.connection import ServerConnection
from protocol.errors import ErrorCode
from protocol.messages import DescribeClusterBroker
from protocol.messages import DescribeClusterRequest
from protocol.messages import DescribeClusterResponse
from protocol.messages import DescribeLogDirsRequest
from protocol.messages import DescribeLogDirsResponse
from protocol.messages import DescribeLogDirsResult
from protocol.messages import EpochEndOffsetResult
from protocol.messages import FetchPartitionResponse
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopicResponse
from protocol.messages import FindCoordinatorRequest
from protocol.messages import FindCoordinatorResponse
from protocol.messages import InitProducerIdRequest
from protocol.messages import InitProducerIdResponse
from protocol.messages import LeaderIdAndEpoch
from protocol.messages import ListOffsetsPartitionResponse
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsResponse
from protocol.messages import ListOffsetsTopicResponse
from protocol.messages import Message
from protocol.messages import MetadataBroker
from protocol.messages import MetadataPartition
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import MetadataTopic
from protocol.messages import OffsetCommitPartitionResponse
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitResponse
from protocol.messages import OffsetCommitTopicResponse
from protocol.messages import OffsetFetchPartitionResponse
from protocol.messages import OffsetFetchRequest
from protocol.messages import OffsetFetchResponse
from protocol.messages import OffsetFetchTopicResponse
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import OffsetForLeaderEpochResponse
from protocol.messages import OffsetForLeaderTopicResult
from protocol.messages import ProducePartitionResponse
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopicResponse
from protocol.messages import StrayReplica
from protocol.record_batch import stamp
from protocol.record_batch import validate_batches

if TYPE_CHECKING:
    from client.consumer import AsyncConsumer
    from client.types import ConsumerRecord
    from protocol.messages import FetchPartition
    from protocol.messages import ListOffsetsPartition
    from protocol.messages import OffsetForLeaderPartition
    from protocol.messages import ProducePartition

# Returned by an override: close the connection without answering (a lost response).
DROP_CONNECTION = object()

# One replica's log positions and leadership, as the DescribeReplicaLog answer of the
# admin tests and the ReplicaLogDescription of the CLI tests both give them.
REPLICA_LOG_NUMBERS: dict[str, int] = {
    "log_start_offset": 0,
    "log_end_offset": 6,
    "high_watermark": 5,
    "leader_id": 1,
    "leader_epoch": 2,
    "partition_epoch": 4,
}


def produce_refused(code: ErrorCode, *, topic: str = "t", partition: int = 0) -> ProduceResponse:
    """A Produce answer refusing the partition's batch with `code`."""
    return ProduceResponse(
        topics=[
            ProduceTopicResponse(
                name=topic,
                partitions=[ProducePartitionResponse(index=partition, error_code=code)],
            )
        ]
    )


async def produce_values(
    broker: FakeBroker, values: list[bytes], *, topic: str = "t", partition: int = 0
) -> None:
    """Each value as its own batch, acknowledged, in order."""
    from client.producer import AsyncProducer

    async with AsyncProducer(broker.address, linger_ms=0) as producer:
        for v in values:
            await producer.send_and_wait(topic, v, partition=partition)


async def dead_port() -> int:
    """A port on 127.0.0.1 where a FakeBroker listened and nobody listens now."""
    broker = FakeBroker()
    await broker.start()
    await broker.stop()
    return broker.port


async def poll_records(consumer: AsyncConsumer, n: int, tries: int = 100) -> list[ConsumerRecord]:
    """Poll (50 ms each, at most `tries` times) until `n` records came back."""
    out: list[ConsumerRecord] = []
    for _ in range(tries):
        for records in (await consumer.poll(timeout_ms=50)).values():
            out.extend(records)
        if len(out) >= n:
            break
    return out


Handler = Callable[[Message], Awaitable[Message | None] | Message | None]

# The `start_broker` fixture (conftest.py): start_broker(partitions=0, leader_epoch=...).
StartBroker = Callable[..., Awaitable["FakeBroker"]]


@dataclass
class FakePartition:
    leader_epoch: int = 0
    # What Metadata reports; None: the real epoch (set it to simulate a lagging image).
    metadata_epoch: int | None = None
    batches: list[tuple[int, bytes]] = field(default_factory=list)  # (base offset, bytes)
    log_end: int = 0
    log_start: int = 0
    # Leader epoch cache: (epoch, start offset), as KIP-101 keeps it.
    epochs: list[tuple[int, int]] = field(default_factory=list)
    # Idempotence: producer id -> (epoch, last sequence, {base sequence: base offset}).
    producers: dict[int, tuple[int, int, dict[int, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.epochs:
            self.epochs.append((self.leader_epoch, 0))

    def become_leader(self, epoch: int) -> None:
        """A new leader epoch starting at the log end (a leader change)."""
        assert epoch > self.leader_epoch
        self.leader_epoch = epoch
        self.epochs.append((epoch, self.log_end))

    def truncate_to(self, offset: int) -> None:
        """Drop every batch at or above `offset` (an unclean election's divergence)."""
        self.batches = [(b, d) for b, d in self.batches if b < offset]
        self.log_end = offset
        self.epochs = [(e, o) for e, o in self.epochs if o <= offset]

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch as Kafka's leader answers it."""
        if epoch == self.leader_epoch:
            return epoch, self.log_end
        later = [(e, o) for e, o in self.epochs if e > epoch]
        if not later:
            return -1, -1
        floor = [e for e, _ in self.epochs if e <= epoch]
        return (floor[-1] if floor else epoch), later[0][1]

    def check_epoch(self, current: int) -> ErrorCode:
        if current == -1 or current == self.leader_epoch:
            return ErrorCode.NONE
        if current < self.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        return ErrorCode.UNKNOWN_LEADER_EPOCH


R = TypeVar("R")


def answer_each(
    topics: Iterable[Any], name_field: str, answer: Callable[[str, Any], R]
) -> list[tuple[str, list[R]]]:
    """(topic name, `answer(name, partition)` for each of its partitions) per requested
    topic; `name_field`: where the request's topic entries keep the name."""
    answers = []
    for topic in topics:
        name = getattr(topic, name_field)
        answers.append((name, [answer(name, p) for p in topic.partitions]))
    return answers


class FakeBroker:
    """One node that leads every partition of every topic it knows."""

    def __init__(self, node_id: int = 1) -> None:
        self.node_id = node_id
        self.host = "127.0.0.1"
        self.port = 0
        self.topics: dict[str, list[FakePartition]] = {}
        self.requests: list[Message] = []
        # Scripted answers: a handler returning None falls through to the default.
        self.overrides: dict[type, Handler] = {}
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.Transport] = set()
        # False: answer InitProducerId with INVALID_REQUEST (a broker without it).
        self.supports_idempotence = True
        self.next_producer_id = 1000
        self.strays: list[StrayReplica] = []  # what DescribeLogDirs reports
        self.committed: dict[tuple[str, str, int], tuple[int, int, str | None]] = {}

    def create_topic(self, name: str, partitions: int, leader_epoch: int = 0) -> None:
        self.topics[name] = [FakePartition(leader_epoch=leader_epoch) for _ in range(partitions)]

    def requests_of(self, kind: type) -> list[Message]:
        return [r for r in self.requests if isinstance(r, kind)]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Proto(self), self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for t in list(self._writers):
            t.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    # ------------------------------------------------------------ dispatch

    async def handle(self, body: Message) -> Message | None:
        self.requests.append(body)
        override = self.overrides.get(type(body))
        if override is not None:
            result = override(body)
            if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
                result = await result  # type: ignore[misc]
            if result is not None:
                return result  # type: ignore[return-value]
        if isinstance(body, MetadataRequest):
            return self.metadata(body)
        if isinstance(body, ProduceRequest):
            return self.produce(body)
        if isinstance(body, FetchRequest):
            return self.fetch(body)
        if isinstance(body, ListOffsetsRequest):
            return self.list_offsets(body)
        if isinstance(body, OffsetForLeaderEpochRequest):
            return self.offsets_for_leader_epoch(body)
        if isinstance(body, InitProducerIdRequest):
            if not self.supports_idempotence:
                return InitProducerIdResponse(error_code=ErrorCode.INVALID_REQUEST)
            if body.producer_id >= 0:  # KIP-360: the next epoch of the same id
                return InitProducerIdResponse(
                    producer_id=body.producer_id, producer_epoch=body.producer_epoch + 1
                )
            self.next_producer_id += 1
            return InitProducerIdResponse(producer_id=self.next_producer_id, producer_epoch=0)
        if isinstance(body, FindCoordinatorRequest):
            return FindCoordinatorResponse(node_id=self.node_id, host=self.host, port=self.port)
        if isinstance(body, OffsetCommitRequest):
            for t in body.topics:
                for p in t.partitions:
                    self.committed[(body.group_id, t.name, p.partition_index)] = (
                        p.committed_offset,
                        p.committed_leader_epoch,
                        p.committed_metadata,
                    )
            return OffsetCommitResponse(
                topics=[
                    OffsetCommitTopicResponse(
                        name=t.name,
                        partitions=[
                            OffsetCommitPartitionResponse(partition_index=p.partition_index)
                            for p in t.partitions
                        ],
                    )
                    for t in body.topics
                ]
            )
        if isinstance(body, OffsetFetchRequest):
            return self.offset_fetch(body)
        if isinstance(body, DescribeClusterRequest):
            return DescribeClusterResponse(
                cluster_id="fake",
                controller_id=0,
                brokers=[
                    DescribeClusterBroker(broker_id=self.node_id, host=self.host, port=self.port)
                ],
            )
        if isinstance(body, DescribeLogDirsRequest):
            return DescribeLogDirsResponse(
                results=[DescribeLogDirsResult(log_dir="/fake", strays=list(self.strays))]
            )
        raise NotImplementedError(type(body).__name__)

    def metadata(self, req: MetadataRequest) -> MetadataResponse:
        names = list(self.topics) if req.topics is None else req.topics
        topics = []
        for name in names:
            parts = self.topics.get(name)
            if parts is None:
                topics.append(
                    MetadataTopic(name=name, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                )
                continue
            topics.append(
                MetadataTopic(
                    name=name,
                    topic_id=f"id-{name}",
                    partitions=[
                        MetadataPartition(
                            partition_index=i,
                            leader_id=self.node_id,
                            leader_epoch=p.leader_epoch
                            if p.metadata_epoch is None
                            else p.metadata_epoch,
                            replica_nodes=[self.node_id],
                            isr_nodes=[self.node_id],
                        )
                        for i, p in enumerate(parts)
                    ],
                )
            )
        return MetadataResponse(
            brokers=[MetadataBroker(node_id=self.node_id, host=self.host, port=self.port)],
            cluster_id="fake",
            controller_id=0,
            topics=topics,
        )

    def _partition(self, topic: str, index: int) -> FakePartition | None:
        parts = self.topics.get(topic)
        if parts is None or not 0 <= index < len(parts):
            return None
        return parts[index]

    def _leader_of(
        self, topic: str, index: int, current_leader_epoch: int
    ) -> tuple[FakePartition | None, ErrorCode]:
        """The partition and the error a leader answers for it before serving it:
        UNKNOWN_TOPIC_OR_PARTITION when it has none, else the fencing of the
        request's current_leader_epoch (the one rule Produce, Fetch, ListOffsets
        and OffsetsForLeaderEpoch share)."""
        part = self._partition(topic, index)
        if part is None:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return part, part.check_epoch(current_leader_epoch)

    def produce(self, req: ProduceRequest) -> ProduceResponse:
        answers = answer_each(req.topics, "name", self._produce_one)
        return ProduceResponse(
            topics=[ProduceTopicResponse(name=n, partitions=a) for n, a in answers]
        )

    def _produce_one(self, topic: str, p: ProducePartition) -> ProducePartitionResponse:
        part, code = self._leader_of(topic, p.index, p.current_leader_epoch)
        if part is None:
            return ProducePartitionResponse(index=p.index, error_code=code)
        if code != ErrorCode.NONE:
            return ProducePartitionResponse(
                index=p.index,
                error_code=code,
                current_leader=LeaderIdAndEpoch(
                    leader_id=self.node_id, leader_epoch=part.leader_epoch
                ),
            )
        data = bytearray(p.records)
        base = part.log_end
        batches = list(validate_batches(data))
        pid = batches[0][1].producer_id if batches else -1
        if pid >= 0:
            header = batches[0][1]
            code, dup = _check_sequence(part, header)
            if code != ErrorCode.NONE or dup is not None:
                return ProducePartitionResponse(
                    index=p.index, error_code=code, base_offset=-1 if dup is None else dup
                )
            last = header.base_sequence + header.last_offset_delta
            old_epoch, _, recent = part.producers.get(pid, (0, -1, {}))
            if old_epoch != header.producer_epoch:
                recent = {}
            recent = dict(list(recent.items())[-4:])
            recent[header.base_sequence] = base
            part.producers[pid] = (header.producer_epoch, last, recent)
        for pos, header in batches:
            stamp(data, pos, part.log_end, part.leader_epoch)
            part.batches.append((part.log_end, bytes(data[pos : pos + header.size])))
            part.log_end += header.last_offset_delta + 1
        return ProducePartitionResponse(index=p.index, base_offset=base, log_start_offset=0)

    def fetch(self, req: FetchRequest) -> FetchResponse:
        answers = answer_each(req.topics, "topic", self._fetch_one)
        return FetchResponse(
            responses=[FetchTopicResponse(topic=n, partitions=a) for n, a in answers]
        )

    def _fetch_one(self, topic: str, p: FetchPartition) -> FetchPartitionResponse:
        part, code = self._leader_of(topic, p.partition, p.current_leader_epoch)
        out_of_range = part is not None and not part.log_start <= p.fetch_offset <= part.log_end
        if code == ErrorCode.NONE and out_of_range:
            code = ErrorCode.OFFSET_OUT_OF_RANGE
        if part is None or code != ErrorCode.NONE:
            return FetchPartitionResponse(partition_index=p.partition, error_code=code)
        data = b"".join(b for base, b in part.batches if base + _last_delta(b) >= p.fetch_offset)
        return FetchPartitionResponse(
            partition_index=p.partition,
            high_watermark=part.log_end,
            log_start_offset=part.log_start,
            records=data[: max(p.partition_max_bytes, 1)],
        )

    def offsets_for_leader_epoch(
        self, req: OffsetForLeaderEpochRequest
    ) -> OffsetForLeaderEpochResponse:
        answers = answer_each(req.topics, "topic", self._epoch_end_one)
        return OffsetForLeaderEpochResponse(
            topics=[OffsetForLeaderTopicResult(topic=n, partitions=a) for n, a in answers]
        )

    def _epoch_end_one(self, topic: str, p: OffsetForLeaderPartition) -> EpochEndOffsetResult:
        part, code = self._leader_of(topic, p.partition, p.current_leader_epoch)
        if part is None or code != ErrorCode.NONE:
            return EpochEndOffsetResult(partition=p.partition, error_code=code)
        epoch, end = part.end_offset_for(p.leader_epoch)
        return EpochEndOffsetResult(partition=p.partition, leader_epoch=epoch, end_offset=end)

    def offset_fetch(self, req: OffsetFetchRequest) -> OffsetFetchResponse:
        topics = []
        for t in req.topics or []:
            parts = []
            for i in t.partition_indexes:
                offset, epoch, meta = self.committed.get((req.group_id, t.name, i), (-1, -1, ""))
                parts.append(
                    OffsetFetchPartitionResponse(
                        partition_index=i,
                        committed_offset=offset,
                        committed_leader_epoch=epoch,
                        metadata=meta,
                    )
                )
            topics.append(OffsetFetchTopicResponse(name=t.name, partitions=parts))
        return OffsetFetchResponse(topics=topics)

    def list_offsets(self, req: ListOffsetsRequest) -> ListOffsetsResponse:
        return ListOffsetsResponse(
            topics=[
                ListOffsetsTopicResponse(
                    name=t.name, partitions=[self._list_offset_one(t.name, p) for p in t.partitions]
                )
                for t in req.topics
            ]
        )

    def _list_offset_one(self, topic: str, p: ListOffsetsPartition) -> ListOffsetsPartitionResponse:
        part, code = self._leader_of(topic, p.partition_index, p.current_leader_epoch)
        if part is None or code != ErrorCode.NONE:
            return ListOffsetsPartitionResponse(partition_index=p.partition_index, error_code=code)
        return ListOffsetsPartitionResponse(
            partition_index=p.partition_index,
            offset=part.log_start if p.timestamp == -2 else part.log_end,
            leader_epoch=part.leader_epoch,
        )


def _check_sequence(part: FakePartition, header: object) -> tuple[ErrorCode, int | None]:
    """(error, offset of the duplicate batch) for an idempotent batch, as a leader
    checks it: the next sequence of a known producer, or 0 for a new one/epoch."""
    pid = header.producer_id  # type: ignore[attr-defined]
    epoch = header.producer_epoch  # type: ignore[attr-defined]
    seq = header.base_sequence  # type: ignore[attr-defined]
    known = part.producers.get(pid)
    if known is None and seq != 0:
        return ErrorCode.UNKNOWN_PRODUCER_ID, None  # its state was lost here
    if known is None or epoch > known[0]:
        return (
            (ErrorCode.NONE, None) if seq == 0 else (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None)
        )
    if epoch < known[0]:
        return ErrorCode.INVALID_PRODUCER_EPOCH, None
    if seq in known[2]:
        return ErrorCode.DUPLICATE_SEQUENCE_NUMBER, known[2][seq]
    if seq != known[1] + 1:
        return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None
    return ErrorCode.NONE, None


def _last_delta(batch: bytes) -> int:
    return int.from_bytes(batch[23:27], "big", signed=True)


class _Proto(asyncio.Protocol):
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.conn = ServerConnection()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.broker._writers.add(self.transport)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        self.broker._writers.discard(self.transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        while (event := self.conn.next_event()) is not None:
            if isinstance(event, RejectedRequest):
                self._write(self.conn.send_rejection(event))
            else:
                asyncio.get_running_loop().create_task(self._serve(event))

    async def _serve(self, request: Request) -> None:
        try:
            body = await self.broker.handle(request.body)
        except Exception as exc:
            self._write(self.conn.send_error(request, ErrorCode.UNKNOWN_SERVER_ERROR, str(exc)))
            return
        if body is None:
            return  # scripted silence
        if body is DROP_CONNECTION:
            if self.transport is not None:
                self.transport.abort()
            return
        self._write(self.conn.send_response(request, body))

    def _write(self, data: bytes) -> None:
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
