"""Three `python -m controller` processes as one quorum (issue 17), on real sockets:

- they elect one active controller; the others answer NOT_CONTROLLER, naming it, to
  what only it does (registrations, heartbeats, topic changes, the metadata feed);
- SIGKILL of the active controller: the other two elect a new one, which has every
  committed change (topics, brokers and their epochs) and takes new ones; a broker
  registering again gets a larger epoch than any before (KIP-903 across a failover);
- the killed controller comes back and follows;
- SIGSTOP of the active controller (a zombie): the others elect a new one; resumed, the
  zombie learns the new epoch and answers NOT_CONTROLLER (fenced by epoch);
- a controller whose data directory is lost comes back empty, catches up from the
  others and the quorum keeps every committed change;
- `minibroker metadata-quorum describe`, given one controller's address, names the
  active controller and every voter's progress;
- brokers given every controller's address follow the active one: after its SIGKILL
  they stay registered and unfenced, topics are created through them (forwarded to the
  new active controller) and produce goes on;
- a partition leader SIGKILLed together with the active controller: once the others
  elect a new active controller, the dead broker's session runs out there and its
  partitions get new leaders from their ISR; acks=all writes go on and every
  acknowledged record is still there;
- a SIGSTOPped active controller (sockets open, nothing answered): the brokers learn
  what the next active controller decides within a bound, not one metadata request
  timeout (31 s) later.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from client.admin import AsyncAdmin
from client.errors import MinibrokerError
from client.producer import AsyncProducer
from protocol.errors import ErrorCode
from protocol.messages import BrokerRegistrationRequest
from protocol.messages import BrokerRegistrationResponse
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DescribeQuorumRequest
from protocol.messages import DescribeQuorumResponse
from protocol.messages import Listener
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from runtime.active_controller import describe_quorum_at
from tests.integration.cluster import Cluster
from tests.integration.cluster import TestClient
from tests.integration.test_controller_process import REPO
from tests.integration.test_controller_process import START_TIMEOUT_S
from tests.integration.test_controller_process import Client
from tests.integration.test_controller_process import ControllerProc
from tests.integration.test_controller_process import free_port
from tests.integration.test_controller_process import unfence

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CLUSTER_ID = "quorum-test-cluster"


class QuorumMember(ControllerProc):
    def __init__(self, node_id: int, data_dir: Path, port: int, voters: str) -> None:
        super().__init__(
            data_dir,
            port,
            "--node-id",
            str(node_id),
            "--quorum-voters",
            voters,
            "--cluster-id",
            CLUSTER_ID,
            # The brokers here are this test's requests: no heartbeats between them.
            "--session-timeout-ms",
            "120000",
        )
        self.node_id = node_id

    async def start(self) -> None:
        self.proc = self.spawn(
            "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data_dir), *self.extra
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        needle = f"controller {self.node_id} listening on 127.0.0.1:{self.port}"
        while needle not in self.log_text():
            if self.proc.poll() is not None:
                raise AssertionError(f"controller exited {self.proc.returncode}: {self.log_text()}")
            assert time.monotonic() < deadline, f"did not start: {self.log_text()}"
            await asyncio.sleep(0.05)

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture
async def quorum(tmp_path: Path):
    ports = {n: free_port() for n in (1, 2, 3)}
    voters = ",".join(f"{n}@127.0.0.1:{p}" for n, p in ports.items())
    members = {n: QuorumMember(n, tmp_path / f"c{n}", p, voters) for n, p in ports.items()}
    try:
        await asyncio.gather(*(m.start() for m in members.values()))
        yield members
    finally:
        for m in members.values():
            m.cleanup()


async def describe(member: QuorumMember) -> DescribeQuorumResponse | None:
    try:
        client = await Client.connect(member.port)
    except OSError:
        return None
    try:
        body = await client.ok(DescribeQuorumRequest())
        assert isinstance(body, DescribeQuorumResponse)
        return body
    except (OSError, TimeoutError, AssertionError):
        return None
    finally:
        await client.close()


async def active(
    members: dict[int, QuorumMember], *, timeout: float = 15.0, other_than: int = -1
) -> tuple[QuorumMember, int]:
    """The active controller, agreed on by itself; (member, quorum epoch)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in members.values():
            if not m.up or m.node_id == other_than:
                continue
            d = await describe(m)
            if d is not None and d.role == "leader":
                return m, d.leader_epoch
        await asyncio.sleep(0.05)
    raise AssertionError("no active controller within the timeout")


async def register(member: QuorumMember, broker_id: int) -> int:
    """A broker registers and is unfenced (as a broker would: fetch, heartbeat)."""
    client = await Client.connect(member.port)
    try:
        body = await client.ok(
            BrokerRegistrationRequest(
                broker_id=broker_id,
                incarnation_id=uuid.uuid4().hex,
                listeners=[Listener(name="PLAINTEXT", host="127.0.0.1", port=19000 + broker_id)],
            )
        )
        assert isinstance(body, BrokerRegistrationResponse) and body.error_code == 0, body
        await unfence(client, broker_id, body.broker_epoch)
        return body.broker_epoch
    finally:
        await client.close()


async def create_topic(member: QuorumMember, name: str) -> None:
    client = await Client.connect(member.port)
    try:
        body = await client.ok(
            CreateTopicsRequest(
                topics=[CreatableTopic(name=name, num_partitions=2, replication_factor=1)]
            )
        )
        assert isinstance(body, CreateTopicsResponse)
        assert body.topics[0].error_code == 0, body
    finally:
        await client.close()


async def topics_of(member: QuorumMember) -> set[str]:
    client = await Client.connect(member.port)
    try:
        body = await client.ok(MetadataRequest())
        assert isinstance(body, MetadataResponse)
        return {t.name for t in body.topics}
    finally:
        await client.close()


async def eventually(what: str, check, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.05)


async def test_one_active_controller_the_others_redirect(quorum) -> None:  # type: ignore[no-untyped-def]
    leader, epoch = await active(quorum)
    assert epoch >= 1
    await register(leader, 1)
    await create_topic(leader, "t")
    for m in quorum.values():
        if m is leader:
            continue
        client = await Client.connect(m.port)
        try:
            response = await client.call(
                CreateTopicsRequest(topics=[CreatableTopic(name="u", num_partitions=1)])
            )
        finally:
            await client.close()
        assert response.error_code == ErrorCode.NOT_CONTROLLER
        # Reads are served by every voter from the committed log.
        await eventually(f"controller {m.node_id} sees topic t", lambda m=m: _has(m, "t"))


async def _has(member: QuorumMember, topic: str) -> bool:
    return topic in await topics_of(member)


async def test_sigkill_of_the_active_controller(quorum) -> None:  # type: ignore[no-untyped-def]
    old, old_epoch = await active(quorum)
    e1 = await register(old, 1)
    await create_topic(old, "before")
    killed_at = time.monotonic()
    old.kill9()
    new, epoch = await active(quorum, other_than=old.node_id)
    elected_s = time.monotonic() - killed_at
    assert epoch > old_epoch
    assert elected_s < 10, elected_s
    # Committed before the kill: the new leader has it (applied once its own first
    # entry commits, a moment after the election).
    await eventually("the new leader has topic before", lambda: _has(new, "before"), 5)
    client = await Client.connect(new.port)
    try:
        await unfence(client, 1, e1)  # broker 1 heartbeats to the new active controller
    finally:
        await client.close()
    await create_topic(new, "after")
    assert await register(new, 1) > e1  # KIP-903: epochs never reused across a failover
    await old.start()  # comes back: follows, catches up
    await eventually("the old leader catches up", lambda: _has(old, "after"))
    d = await describe(old)
    assert d is not None and d.role == "follower" and d.leader_id == new.node_id


async def test_sigstop_zombie_is_fenced_by_epoch(quorum) -> None:  # type: ignore[no-untyped-def]
    zombie, epoch = await active(quorum)
    assert zombie.proc is not None
    broker_epoch = await register(zombie, 1)
    zombie.proc.send_signal(signal.SIGSTOP)
    try:
        new, new_epoch = await active(quorum, other_than=zombie.node_id)
        assert new_epoch > epoch
        client = await Client.connect(new.port)
        try:
            await unfence(client, 1, broker_epoch)
        finally:
            await client.close()
        await create_topic(new, "while-stopped")
    finally:
        zombie.proc.send_signal(signal.SIGCONT)

    async def fenced() -> bool:
        d = await describe(zombie)
        return d is not None and d.role != "leader" and d.leader_epoch >= new_epoch

    await eventually("the zombie learns the new epoch", fenced)
    client = await Client.connect(zombie.port)
    try:
        response = await client.call(CreateTopicsRequest(topics=[CreatableTopic(name="z")]))
    finally:
        await client.close()
    assert response.error_code == ErrorCode.NOT_CONTROLLER
    await eventually("the zombie has the new change", lambda: _has(zombie, "while-stopped"))


async def test_a_controller_that_lost_its_disk_catches_up(quorum) -> None:  # type: ignore[no-untyped-def]
    leader, _ = await active(quorum)
    await register(leader, 1)
    for i in range(5):
        await create_topic(leader, f"t{i}")
    lost = next(m for m in quorum.values() if m is not leader)
    lost.kill9()
    shutil.rmtree(lost.data_dir)  # the volume is gone
    await lost.start()
    await eventually("the lost controller catches up", lambda: _has(lost, "t4"))
    assert {f"t{i}" for i in range(5)} <= await topics_of(lost)
    assert "its disk was lost" in lost.log_text()
    # The quorum still takes changes, and the others keep everything.
    leader, _ = await active(quorum)
    await register(leader, 1)
    await create_topic(leader, "later")
    for m in quorum.values():
        await eventually(f"{m.node_id} has it", lambda m=m: _has(m, "later"))


async def test_brokers_follow_the_active_controller(quorum, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path / "brokers")
    c.root.mkdir()
    c.controller_bootstrap = ",".join(f"127.0.0.1:{m.port}" for m in quorum.values())
    try:
        c.start_brokers((1, 2))
        servers = [f"{b.host}:{b.port}" for b in c.brokers.values()]
        async with (
            AsyncAdmin(servers) as admin,
            AsyncProducer(servers, linger_ms=0, acks="all", retry_backoff_ms=50) as producer,
        ):
            await admin.create_topic("before", 2, 2)
            for i in range(10):
                await producer.send_and_wait("before", b"b%d" % i, partition=i % 2)
            old, _ = await active(quorum)
            old.kill9()
            await active(quorum, other_than=old.node_id)
            deadline = time.monotonic() + 30
            while True:  # forwarded by a broker to whichever controller is active
                try:
                    await admin.create_topic("after", 2, 2)
                    break
                except MinibrokerError:
                    assert time.monotonic() < deadline, "no topic created after the failover"
                    await asyncio.sleep(0.2)
            for i in range(10):
                await producer.send_and_wait("after", b"a%d" % i, partition=i % 2)
                await producer.send_and_wait("before", b"c%d" % i, partition=i % 2)
            described = await admin.describe_cluster()
            assert sorted((b.node_id, b.is_fenced) for b in described.brokers) == [
                (1, False),
                (2, False),
            ]
        for b in c.brokers.values():
            assert "the active controller is controller" in b.log_text()
    finally:
        c.stop_all()


async def test_metadata_quorum_describe_from_any_controller(quorum) -> None:  # type: ignore[no-untyped-def]
    leader, epoch = await active(quorum)
    follower = next(m for m in quorum.values() if m is not leader)

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "client.cli", "metadata-quorum", "describe", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    status = await asyncio.to_thread(cli, "--controller", f"127.0.0.1:{follower.port}")
    assert f"LeaderId:       {leader.node_id}" in status
    assert f"LeaderEpoch:    {epoch}" in status
    assert "CurrentVoters:  [1,2,3]" in status
    address = f"127.0.0.1:{follower.port}"
    rows = (await asyncio.to_thread(cli, "--controller", address, "--replication")).splitlines()
    assert rows[0].split() == ["NodeId", "Address", "LogEndOffset", "Lag", "LastFetch", "Status"]
    by_node = {int(r.split()[0]): r.split() for r in rows[1:]}
    assert sorted(by_node) == [1, 2, 3]
    assert by_node[leader.node_id][-1] == "Leader"
    assert {by_node[m.node_id][-1] for m in quorum.values() if m is not leader} == {"Follower"}


async def test_a_leader_killed_with_the_active_controller_is_replaced(tmp_path: Path) -> None:
    """Issue 17: nobody is left to notice a dead broker while the active controller is
    dead too; the next active controller must. Its broker sessions start afresh on
    takeover (no live broker is fenced for the failover), so the dead one is fenced
    one session timeout after it, and its leaderships move within the ISR."""
    c = Cluster(tmp_path)
    c.root.mkdir(exist_ok=True)
    c.start_quorum(3, session_timeout_ms=3000)
    try:
        c.start_brokers((1, 2, 3))
        servers = [f"{b.host}:{b.port}" for b in c.brokers.values()]
        async with (
            AsyncAdmin(servers) as admin,
            AsyncProducer(servers, linger_ms=0, acks="all", retry_backoff_ms=50) as producer,
        ):
            await admin.create_topic("t", 1, 3, configs={"min.insync.replicas": "2"})
            for i in range(20):
                await producer.send_and_wait("t", b"before-%d" % i, partition=0)
            (before,) = await admin.describe_topics(["t"])
            dead_broker = before.partitions[0].leader
            answer = await describe_quorum_at(("127.0.0.1", c.quorum[0].port), "test", 2.0)
            dead_controller = answer.leader_id
            c.quorum[dead_controller].kill()
            c.brokers[dead_broker].kill()
            started = time.monotonic()
            survivors = [f"{b.host}:{b.port}" for n, b in c.brokers.items() if n != dead_broker]
            async with AsyncAdmin(survivors) as watcher:
                while True:
                    with contextlib.suppress(MinibrokerError, OSError):
                        (now,) = await watcher.describe_topics(["t"])
                        p = now.partitions[0]
                        if p.leader not in (-1, dead_broker) and dead_broker not in p.isr:
                            break
                    assert time.monotonic() - started < 30, "no new leader within 30 s"
                    await asyncio.sleep(0.1)
                moved_after = time.monotonic() - started
                assert p.leader_epoch > before.partitions[0].leader_epoch
                for i in range(10):
                    await producer.send_and_wait("t", b"after-%d" % i, partition=0)
                (final,) = await watcher.describe_topics(["t"])
            assert final.partitions[0].high_watermark == 30, final
        # Fenced one session timeout (3 s) after the new controller took over, plus the
        # election: well under the 30 s bound; the bench measures it (bench/README.md).
        assert moved_after < 15, moved_after
    finally:
        c.stop_all()


async def _leader_seen_by(broker: TestClient, topic: str) -> tuple[int, int]:
    """(leader, leader epoch) of partition 0 of `topic` as this broker's own metadata has it."""
    body = await broker.call(MetadataRequest(topics=[topic]))
    assert isinstance(body, MetadataResponse)
    (partition,) = body.topics[0].partitions
    return partition.leader_id, partition.leader_epoch


async def test_brokers_fail_over_from_a_silent_controller(tmp_path: Path) -> None:
    """A SIGSTOPped active controller keeps its sockets open and answers nothing, so a
    broker's metadata long-poll to it sits on a connection that looks alive. Invariant:
    a broker learns of the next active controller's decisions within heartbeat timeout
    + lookup + the decision's own time, never one metadata request timeout (31 s)
    later; meanwhile a broker that lost a leadership would go on answering as its
    leader. Off (the long-poll left to its timeout): the survivors learn of the new
    leader ~31 s after the stop, past the bound."""
    c = Cluster(tmp_path)
    c.root.mkdir(exist_ok=True)
    c.start_quorum(3, session_timeout_ms=3000)
    silent: subprocess.Popen[bytes] | None = None
    try:
        c.start_brokers((1, 2, 3))
        servers = [f"{b.host}:{b.port}" for b in c.brokers.values()]
        async with AsyncAdmin(servers) as admin:
            await admin.create_topic("t", 1, 3)
            (before,) = await admin.describe_topics(["t"])
        old_leader = before.partitions[0].leader
        answer = await describe_quorum_at(("127.0.0.1", c.quorum[0].port), "test", 2.0)
        silent = c.quorum[answer.leader_id].popen
        assert silent is not None
        await asyncio.sleep(1.5)  # every broker caught up and long-polling the active one
        silent.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        c.brokers[old_leader].kill()
        survivors = [b for n, b in c.brokers.items() if n != old_leader]
        # Fenced one session timeout after the next controller takes over (election
        # ~1-2 s); every survivor must know the new leader soon after.
        bound_s = 15.0
        for broker in survivors:
            async with TestClient(broker.host, broker.port) as client:
                while True:
                    leader, epoch = await _leader_seen_by(client, "t")
                    if leader not in (-1, old_leader):
                        break
                    waited = time.monotonic() - stopped
                    assert waited < bound_s, (
                        f"{broker.name} still names leader {leader} (epoch {epoch}) "
                        f"{waited:.1f} s after the active controller stopped:\n{broker.tail()}"
                    )
                    await asyncio.sleep(0.1)
            assert epoch > before.partitions[0].leader_epoch
            assert "is no longer the active controller" in broker.log_text(), broker.tail()
    finally:
        if silent is not None:
            silent.send_signal(signal.SIGCONT)
        c.stop_all()
