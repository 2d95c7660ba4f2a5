"""A real cluster for the seed scenarios, with the verbs the proposals speak in.

Wraps `tests/integration/cluster.py` (real `python -m controller` / `python -m broker`
processes on 127.0.0.1) with typed helpers for one-partition topics: create, produce
with a chosen current_leader_epoch and acks, read a replica's log and epoch cache over
the wire (DescribeReplicaLog), inject faults (FaultControl), wait for a leader or an ISR.
Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from client import AsyncConsumer
from client import ConsumerRecord
from client.errors import MinibrokerError
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DescribeReplicaLogRequest
from protocol.messages import DescribeReplicaLogResponse
from protocol.messages import FaultControlRequest
from protocol.messages import FaultControlResponse
from protocol.messages import FaultRule
from protocol.messages import ListOffsetsPartitionResponse
from protocol.messages import ListOffsetsResponse
from protocol.messages import MetadataPartition
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import ProducePartitionResponse
from protocol.record_batch import encode_batch
from tests.integration.cluster import Cluster
from tests.integration.cluster import TestClient
from tests.one_partition import list_offsets_request
from tests.one_partition import produce_request

__all__ = ["FaultRule", "ScenarioCluster", "scenario_cluster"]


# The failover timing of the three-broker scenarios: a broker silent for SESSION_MS is
# fenced (the controller's session timeout), a follower LAG_MS behind leaves the ISR.
NODES = [1, 2, 3]
SESSION_MS = 1500
LAG_MS = 3000
BROKER_FLAGS = ("--replica-lag-time-max-ms", str(LAG_MS))


def flags_under_test(protection: str, unsafe_switch: str, *flags: str) -> list[str]:
    """A process's flags in an on/off scenario: test faults on, `flags`, and with
    protection "off" the unsafe switch that turns the protection off."""
    unsafe = [unsafe_switch] if protection == "off" else []
    return ["--enable-test-faults", *flags, *unsafe]


async def wait_until(what: str, check, *, timeout: float = 20.0):
    """Poll the async `check` until it returns a truthy value (bounded)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = await check()
            if last:
                return last
        except (ConnectionError, OSError, TimeoutError, AssertionError) as exc:
            last = exc
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@contextmanager
def scenario_cluster(root: Path) -> Iterator[ScenarioCluster]:
    """A cluster that is always torn down, stopped processes included."""
    c = ScenarioCluster(root)
    try:
        yield c
    finally:
        for proc in c.brokers.values():  # a SIGSTOPped process cannot handle SIGTERM
            if proc.alive:
                os.kill(proc.pid, signal.SIGCONT)
        c.stop_all()


class ScenarioCluster(Cluster):
    # ------------------------------------------------------------ addresses

    def start_three_brokers(
        self, *broker_flags: str, session_timeout_ms: int, controller_faults: bool = True
    ) -> None:
        """The controller (test faults on unless `controller_faults` is False) and
        brokers 1, 2 and 3 with `broker_flags`."""
        flags = ("--enable-test-faults",) if controller_faults else ()
        self.start_controller(*flags, session_timeout_ms=session_timeout_ms)
        self.start_brokers(NODES, *broker_flags)

    async def create_on_three(self, topic: str, *, min_insync: int = 1) -> None:
        """`topic`: one partition on brokers 1, 2, 3 with `min_insync`, all in sync."""
        await self.create_topic(
            topic, replicas=NODES, configs={"min.insync.replicas": str(min_insync)}
        )
        await self.wait_isr(topic, set(NODES))

    def live_broker(self, but: int | None = None) -> tuple[str, int]:
        for node, proc in sorted(self.brokers.items()):
            if proc.alive and node != but:
                return proc.address
        raise AssertionError("no live broker")

    def client(self, node: int) -> TestClient:
        return TestClient(*self.brokers[node].address)

    def controller_client(self) -> TestClient:
        assert self.controller is not None
        return TestClient(self.controller.host, self.controller.port)

    # ------------------------------------------------------------ topics and metadata

    async def create_topic(
        self,
        name: str,
        *,
        replicas: list[int] | None = None,
        replication_factor: int = 3,
        configs: dict[str, str] | None = None,
    ) -> None:
        """One partition; `replicas` fixes the assignment (first = preferred leader)."""
        from protocol.messages import CreatableReplicaAssignment

        topic = CreatableTopic(name=name, configs=configs or {})
        if replicas is not None:
            topic.assignments = [CreatableReplicaAssignment(partition_index=0, broker_ids=replicas)]
        else:
            topic.num_partitions = 1
            topic.replication_factor = replication_factor
        async with TestClient(*self.live_broker()) as client:
            resp = await client.call(CreateTopicsRequest(topics=[topic]))
        assert isinstance(resp, CreateTopicsResponse)
        assert resp.topics[0].error_code == 0, resp.topics[0].error_message

    async def partition(self, topic: str, *, via: int | None = None) -> MetadataPartition:
        address = self.brokers[via].address if via is not None else self.live_broker()
        async with TestClient(*address) as client:
            md = await client.call(MetadataRequest(topics=[topic]))
        assert isinstance(md, MetadataResponse)
        return md.topics[0].partitions[0]

    async def wait_partition(
        self,
        topic: str,
        predicate: Callable[[MetadataPartition], bool],
        *,
        what: str,
        timeout: float = 30.0,
        via: int | None = None,
    ) -> MetadataPartition:
        """Poll Metadata until `predicate` holds (via one broker, or any live one)."""
        deadline = time.monotonic() + timeout
        last: MetadataPartition | None = None
        while time.monotonic() < deadline:
            try:
                last = await self.partition(topic, via=via)
                if predicate(last):
                    return last
            except (ConnectionError, OSError, TimeoutError, AssertionError, IndexError):
                pass
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last state {last}")

    async def wait_isr(
        self, topic: str, isr: set[int], *, timeout: float = 30.0
    ) -> MetadataPartition:
        return await self.wait_partition(
            topic, lambda p: set(p.isr_nodes) == isr, what=f"ISR {sorted(isr)}", timeout=timeout
        )

    async def wait_leader(
        self, topic: str, leader: int | None = None, *, min_epoch: int = 0, timeout: float = 30.0
    ) -> MetadataPartition:
        def ok(p: MetadataPartition) -> bool:
            if p.leader_id < 0 or p.leader_epoch < min_epoch:
                return False
            return leader is None or p.leader_id == leader

        return await self.wait_partition(
            topic, ok, what=f"leader {leader} at epoch >= {min_epoch}", timeout=timeout
        )

    # ------------------------------------------------------------ data path

    async def produce(
        self,
        node: int,
        topic: str,
        values: list[bytes],
        *,
        acks: int = -1,
        current_leader_epoch: int = -1,
        timeout_ms: int = 5000,
    ) -> ProducePartitionResponse:
        """One batch of `values` to broker `node`; the partition-level answer."""
        batch = encode_batch([(None, v, (), None) for v in values])
        request = produce_request(
            topic, batch, epoch=current_leader_epoch, acks=acks, timeout_ms=timeout_ms
        )
        async with self.client(node) as client:
            resp = await client.call(request, timeout=timeout_ms / 1000 + 10)
        return resp.topics[0].partitions[0]  # type: ignore[attr-defined]

    async def produce_ok(
        self, node: int, topic: str, epoch: int, values: list[bytes], *, timeout: float = 30
    ) -> int:
        """acks=all at `node` with current_leader_epoch `epoch`; retried while the leader
        catches up on metadata (NOT_LEADER_OR_FOLLOWER, UNKNOWN_LEADER_EPOCH); the base
        offset. Any other error fails the test."""
        deadline = time.monotonic() + timeout
        while True:
            resp = await self.produce(node, topic, values, current_leader_epoch=epoch)
            code = ErrorCode(resp.error_code)
            if code == ErrorCode.NONE:
                return resp.base_offset
            assert code in {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_LEADER_EPOCH}, code
            assert time.monotonic() < deadline, f"produce at {node} kept failing: {code.name}"
            await asyncio.sleep(0.1)

    async def wait_replica_end(
        self, node: int, topic: str, end: int, *, timeout: float = 60
    ) -> None:
        """Until broker `node`'s replica has log end offset and high watermark `end`."""
        deadline = time.monotonic() + timeout
        while True:
            lg = await self.replica_log(node, topic)
            if (lg.log_end_offset, lg.high_watermark) == (end, end):
                return
            assert time.monotonic() < deadline, (
                f"broker {node}: LEO {lg.log_end_offset} HW {lg.high_watermark}, want {end}"
            )
            await asyncio.sleep(0.1)

    async def read_values(self, node: int, topic: str, *, replica: bool = True) -> list[bytes]:
        """Every value in broker `node`'s replica, from its log start (as a debugging
        replica when `replica`, so past the high watermark; else as a consumer)."""
        async with self.client(node) as client:
            return [value for _, value in await client.read_partition(topic, replica=replica)]

    async def list_offsets(
        self, node: int, topic: str, timestamp: int, *, current_leader_epoch: int = -1
    ) -> ListOffsetsPartitionResponse:
        """A consumer's ListOffsets for partition 0 at broker `node` (-1 latest, -2
        earliest, else ms); the partition-level answer."""
        async with self.client(node) as client:
            resp = await client.call(
                list_offsets_request(topic, timestamp, epoch=current_leader_epoch)
            )
        assert isinstance(resp, ListOffsetsResponse)
        return resp.topics[0].partitions[0]

    async def replica_log(self, node: int, topic: str) -> DescribeReplicaLogResponse:
        async with self.client(node) as client:
            resp = await client.call(DescribeReplicaLogRequest(topic=topic, partition=0))
        assert isinstance(resp, DescribeReplicaLogResponse)
        assert resp.error_code == 0, resp.error_message
        return resp

    async def epoch_entries(self, node: int, topic: str) -> list[tuple[int, int]]:
        log = await self.replica_log(node, topic)
        return [(e.epoch, e.start_offset) for e in log.epoch_entries]

    # ------------------------------------------------------------ faults

    async def faults(
        self, node: int | str, *rules: FaultRule, clear: bool = False, release: bool = False
    ) -> FaultControlResponse:
        """FaultControl at broker `node` or at "controller"."""
        client = self.controller_client() if node == "controller" else self.client(int(node))
        async with client:
            resp = await client.call(
                FaultControlRequest(clear=clear, add_rules=list(rules), release_held=release)
            )
        assert isinstance(resp, FaultControlResponse)
        assert resp.error_code == 0, resp.error_message
        return resp

    @contextlib.asynccontextmanager
    async def faults_cleared_after(self) -> AsyncIterator[None]:
        """Around a test that injects controller faults: they are cleared at its end, pass
        or fail, so held requests are let go and the brokers can stop cleanly."""
        try:
            yield
        finally:
            await self.faults("controller", clear=True)

    async def wait_held(self, what: str = "the request", *, timeout: float = 30.0) -> None:
        """Until the controller has parked a request (a "hold" fault rule)."""
        deadline = time.monotonic() + timeout
        while (await self.faults("controller")).held < 1:
            assert time.monotonic() < deadline, f"the controller never held {what}"
            await asyncio.sleep(0.1)

    async def cut_off_metadata(self, node: int) -> None:
        """The controller holds broker `node`'s metadata fetch: from now on the broker
        hears of no change and keeps believing what it last heard."""
        await self.faults(
            "controller",
            FaultRule(api_key=int(ApiKey.FETCH_METADATA), action="hold", peer_id=node),
        )
        await self.wait_held()

    async def wait_new_leader(
        self, topic: str, leader: int, above_epoch: int, *, what: str, timeout: float = 30.0
    ) -> MetadataPartition:
        """Until `leader` leads `topic` at an epoch above `above_epoch` (asked of it)."""
        return await self.wait_partition(
            topic,
            lambda p: p.leader_id == leader and p.leader_epoch > above_epoch,
            what=what,
            via=leader,
            timeout=timeout,
        )

    def pause(self, node: int) -> None:
        os.kill(self.brokers[node].pid, signal.SIGSTOP)

    def resume(self, node: int) -> None:
        os.kill(self.brokers[node].pid, signal.SIGCONT)


async def consume_n(consumer: AsyncConsumer, n: int, timeout: float = 60) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"consumed {len(out)} of {n}: {out}"
        for records in (await consumer.poll(timeout_ms=500)).values():
            out.extend(records)
    return out


async def poll_until_error(consumer: AsyncConsumer, timeout: float = 60) -> tuple[Exception, list]:
    """Poll until poll() raises a non-retriable error (retriable ones, e.g. while a leader
    or coordinator comes back, are retried); the error and the records returned
    meanwhile."""
    returned: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            for records in (await consumer.poll(timeout_ms=500)).values():
                returned.extend(records)
        except MinibrokerError as exc:
            if exc.retriable:
                last = exc
                continue
            return exc, returned
    raise AssertionError(f"no error within {timeout}s; returned {returned}; last {last!r}")


def committed_batches(
    logs: dict[int, DescribeReplicaLogResponse], hw: int
) -> list[tuple[int, int, int, int]]:
    """(base offset, last offset, leader epoch, CRC) of the batches below the high
    watermark `hw`, asserted identical on every replica in `logs` (by node id): the
    replicas agree on everything committed."""
    below = {
        n: [
            (b.base_offset, b.last_offset, b.leader_epoch, b.crc)
            for b in lg.batches
            if b.last_offset < hw
        ]
        for n, lg in logs.items()
    }
    first = min(below)
    for n in below:
        assert below[n] == below[first], f"broker {n}'s batches differ from broker {first}'s"
    return below[first]
