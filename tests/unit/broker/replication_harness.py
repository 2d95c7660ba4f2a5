"""In-process replication for the broker unit tests: several ReplicaManagers (one per
broker id, each over a real storage engine in a temp directory) that share one
metadata stream, whose follower fetchers call the leader's ReplicaManager directly
(no sockets), and a fake controller that answers AlterPartition like the real one
(leader epoch, partition epoch and broker epoch checks) and publishes the result."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from pathlib import Path

from broker_harness import Harness

from protocol.errors import ErrorCode
from protocol.messages import AlterPartitionPartitionResult
from protocol.messages import AlterPartitionRequest
from protocol.messages import AlterPartitionResponse
from protocol.messages import AlterPartitionTopicResult
from protocol.messages import FetchRequest
from protocol.messages import ListOffsetsRequest
from protocol.messages import Message
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceTopic
from protocol.metadata_records import ListenerInfo
from protocol.metadata_records import PartitionRecord
from protocol.metadata_records import RegisterBrokerRecord
from protocol.metadata_records import TopicRecord
from protocol.record_batch import encode_batch
from protocol.record_batch import iter_headers
from runtime.peer_rpc import RpcConnectionError

FAST = {
    "replica_fetch_wait_max_ms": 50,
    "replica_fetch_backoff_ms": 20,
    "replica_lag_time_max_ms": 400,
    "hw_checkpoint_interval_ms": 60_000,
}


def batch(*values: bytes) -> bytes:
    return encode_batch([(None, v, (), None) for v in values])


class LocalClient:
    """A follower's 'connection' to leader `leader_id`: calls its ReplicaManager."""

    def __init__(self, cluster: LocalCluster, follower_id: int, leader_id: int) -> None:
        self.cluster = cluster
        self.follower_id = follower_id
        self.leader_id = leader_id
        self.closed = False

    async def request(self, body: Message, *, timeout_s: float | None = None) -> Message:
        self.cluster.requests.append((self.follower_id, self.leader_id, type(body).__name__))
        hook = self.cluster.on_request
        if hook is not None:
            await hook(self.follower_id, self.leader_id, body)
        if self.leader_id in self.cluster.unreachable or self.follower_id in self.cluster.paused:
            await asyncio.sleep(0.01)
            raise RpcConnectionError(f"broker {self.leader_id} unreachable (test)")
        rm = self.cluster.brokers[self.leader_id].rm
        if isinstance(body, FetchRequest):
            return await rm.fetch(body)
        if isinstance(body, OffsetForLeaderEpochRequest):
            return rm.offsets_for_leader_epoch(body)
        if isinstance(body, ListOffsetsRequest):
            return rm.list_offsets(body)
        raise AssertionError(f"unexpected request {body!r}")

    async def close(self) -> None:
        self.closed = True


class FakeController:
    """AlterPartition with the real controller's checks; success publishes the new
    PartitionRecord to every broker (after answering, like the metadata log)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.requests: list[AlterPartitionRequest] = []
        self.hold: asyncio.Event | None = None  # set: answer; None: answer at once
        self.fail_network = 0  # fail this many requests with a connection error
        self.publish = True
        self.refuse: ErrorCode | None = None  # answer every partition with this error

    async def alter_partition(self, request: AlterPartitionRequest) -> AlterPartitionResponse:
        self.requests.append(request)
        if self.hold is not None:
            await self.hold.wait()
        if self.fail_network > 0:
            self.fail_network -= 1
            raise RpcConnectionError("controller unreachable (test)")
        c = self.cluster
        if c.broker_epochs.get(request.broker_id) != request.broker_epoch:
            return AlterPartitionResponse(error_code=ErrorCode.STALE_BROKER_EPOCH)
        topics = []
        published: list[PartitionRecord] = []
        for t in request.topics:
            results = []
            for d in t.partitions:
                current = c.partitions[(t.topic_name, d.partition_index)]
                code = self.refuse or ErrorCode.NONE
                if code == ErrorCode.NONE:
                    if d.leader_epoch != current.leader_epoch:
                        code = ErrorCode.FENCED_LEADER_EPOCH
                    elif d.partition_epoch != current.partition_epoch:
                        code = ErrorCode.INVALID_UPDATE_VERSION
                    else:
                        for s in d.new_isr_with_epochs:
                            if s.broker_epoch not in (-1, c.broker_epochs.get(s.broker_id)):
                                code = ErrorCode.INELIGIBLE_REPLICA
                if code != ErrorCode.NONE:
                    results.append(
                        AlterPartitionPartitionResult(
                            partition_index=d.partition_index, error_code=code
                        )
                    )
                    continue
                new = PartitionRecord(
                    topic_id=current.topic_id,
                    partition_id=current.partition_id,
                    replicas=list(current.replicas),
                    isr=[s.broker_id for s in d.new_isr_with_epochs],
                    leader=current.leader,
                    leader_epoch=current.leader_epoch,
                    partition_epoch=current.partition_epoch + 1,
                    leader_recovery_state=d.leader_recovery_state,
                )
                c.partitions[(t.topic_name, d.partition_index)] = new
                published.append(new)
                results.append(
                    AlterPartitionPartitionResult(
                        partition_index=d.partition_index,
                        leader_id=new.leader,
                        leader_epoch=new.leader_epoch,
                        isr=list(new.isr),
                        partition_epoch=new.partition_epoch,
                    )
                )
            topics.append(AlterPartitionTopicResult(topic_name=t.topic_name, partitions=results))
        if published and self.publish:
            asyncio.get_running_loop().create_task(c.publish(*published))
        return AlterPartitionResponse(topics=topics)


class LocalCluster:
    def __init__(self, root: Path, ids: tuple[int, ...] = (1, 2, 3), **config: object) -> None:
        self.root = root
        self.controller = FakeController(self)
        self.requests: list[tuple[int, int, str]] = []
        self.unreachable: set[int] = set()
        self.paused: set[int] = set()  # brokers whose fetches fail (a stopped process)
        self.on_request: Callable[[int, int, Message], object] | None = None
        self.broker_epochs = {i: 100 + i for i in ids}
        self.partitions: dict[tuple[str, int], PartitionRecord] = {}
        self.topic_ids: dict[str, str] = {}
        self.brokers: dict[int, Harness] = {}
        self._config = {**FAST, **config}
        self._ids = itertools.count()
        for i in ids:
            self.add_broker(i)

    def add_broker(self, node_id: int, **config: object) -> Harness:
        h = Harness(
            self.root / f"broker-{node_id}",
            node_id,
            rm_kwargs={
                "fetcher_client_factory": lambda leader, host, port, me=node_id: LocalClient(
                    self, me, leader
                ),
                "send_alter_partition": self.controller.alter_partition,
            },
            **{**self._config, **config},
        )
        self.brokers[node_id] = h
        return h

    async def publish(self, *records: object) -> None:
        for h in self.brokers.values():
            await h.apply(*records)

    def registrations(self) -> list[RegisterBrokerRecord]:
        return [
            RegisterBrokerRecord(
                broker_id=i,
                broker_epoch=epoch,
                incarnation_id=f"inc-{i}-{epoch}",
                listeners=[ListenerInfo(name="PLAINTEXT", host="127.0.0.1", port=9000 + i)],
                fenced=False,
            )
            for i, epoch in self.broker_epochs.items()
        ]

    async def create_topic(
        self,
        name: str,
        *,
        replicas: list[int],
        leader: int | None = None,
        isr: list[int] | None = None,
        leader_epoch: int = 0,
        configs: dict[str, str] | None = None,
    ) -> None:
        topic_id = f"{name}-id"
        self.topic_ids[name] = topic_id
        record = PartitionRecord(
            topic_id=topic_id,
            partition_id=0,
            replicas=replicas,
            isr=isr or replicas,
            leader=replicas[0] if leader is None else leader,
            leader_epoch=leader_epoch,
            partition_epoch=leader_epoch,
        )
        self.partitions[(name, 0)] = record
        await self.publish(
            *self.registrations(), TopicRecord(name=name, topic_id=topic_id, configs=configs or {})
        )
        await self.publish(record)

    async def elect(self, name: str, leader: int, *, isr: list[int] | None = None) -> None:
        """A leader change (epochs bumped), as the controller does."""
        cur = self.partitions[(name, 0)]
        record = PartitionRecord(
            topic_id=cur.topic_id,
            partition_id=0,
            replicas=list(cur.replicas),
            isr=list(cur.isr) if isr is None else isr,
            leader=leader,
            leader_epoch=cur.leader_epoch + 1,
            partition_epoch=cur.partition_epoch + 1,
        )
        self.partitions[(name, 0)] = record
        await self.publish(record)

    def start(self, *ids: int) -> None:
        for i in ids or tuple(self.brokers):
            self.brokers[i].rm.start_background()

    def partition(self, node_id: int, name: str = "t"):
        return self.brokers[node_id].rm.partitions[(name, 0)]

    async def produce(
        self,
        leader: int,
        *values: bytes,
        acks: int = -1,
        timeout_ms: int = 5000,
        topic: str = "t",
    ):
        resp = await self.brokers[leader].rm.produce(
            ProduceRequest(
                acks=acks,
                timeout_ms=timeout_ms,
                topics=[
                    ProduceTopic(
                        name=topic,
                        partitions=[ProducePartition(index=0, records=batch(*values))],
                    )
                ],
            )
        )
        return resp.topics[0].partitions[0]

    def batches(self, node_id: int, name: str = "t") -> list[tuple[int, int, int]]:
        """(base offset, last offset, leader epoch) of every batch of a replica."""
        p = self.partition(node_id, name)
        data = p.log.read(p.log_start_offset, 1 << 30) if p.log_end_offset else b""
        return [
            (h.base_offset, h.last_offset, h.partition_leader_epoch) for _, h in iter_headers(data)
        ]

    async def wait_until(
        self, predicate: Callable[[], bool], timeout: float = 5.0, what: str = ""
    ) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or predicate}")
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        # Replication stops everywhere before any log closes.
        for h in self.brokers.values():
            await h.rm.fetchers.shutdown()
        for h in self.brokers.values():
            await h.close()
