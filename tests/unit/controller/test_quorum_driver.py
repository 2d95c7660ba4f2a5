"""Three controller quorum voters on real sockets (loopback) and real data directories,
each a listener, a QuorumDriver and a metadata log, in one process:

- a leader is elected and what it appends is committed on every voter's disk;
- the leader is killed (no resignation, as SIGKILL): the others elect a new one within
  the fetch timeout and an election round or two (the 2 s target is measured by
  `python -m bench failover --target controller`), and what was committed is in the
  new leader's log;
- the old leader comes back, follows, and catches up (its diverging uncommitted tail,
  if any, truncated);
- a leader that stops gracefully hands over at once (EndQuorumEpoch);
- two voters that lost their disks do not take each other's emptiness for a new
  quorum while the third holds what was committed;
- a voter whose disk was lost comes back empty, catches up from the others (snapshot
  and log) and only then votes again.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from controller.metadata_log import MetadataLog
from controller.quorum.driver import QuorumDriver
from controller.quorum.quorum_log import Snapshot
from controller.quorum.quorum_state import QuorumStateFile
from controller.quorum.replica import QuorumSettings
from controller.quorum.replica import Role
from controller.quorum.voting_rights import may_vote_at_start
from controller.server import QUORUM_APIS
from protocol.errors import ErrorCode
from protocol.messages import BeginQuorumEpochResponse
from protocol.messages import DescribeQuorumRequest
from protocol.messages import DescribeQuorumResponse
from protocol.messages import Message
from protocol.messages import MetadataEntry
from protocol.messages import QuorumFetchRequest
from protocol.messages import QuorumFetchResponse
from protocol.messages import VoteRequest
from protocol.messages import VoteResponse
from protocol.metadata_records import LeaderChangeRecord
from protocol.metadata_records import TopicRecord
from runtime.faults import Faults
from runtime.server import ListenerServer
from runtime.server import RequestContext

pytestmark = pytest.mark.timeout(120)

SETTINGS = QuorumSettings()  # the defaults: the failover bound is theirs


class Voter:
    def __init__(self, node_id: int, directory: Path) -> None:
        self.node_id = node_id
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.driver: QuorumDriver | None = None
        self.log: MetadataLog | None = None
        self.server: ListenerServer | None = None
        self.port = 0

    async def bind(self) -> int:
        async def serve(ctx: RequestContext, body: Message) -> Message:
            assert self.driver is not None
            return await self.driver.handle(-1, body)

        self.server = ListenerServer(
            f"controller-{self.node_id}",
            "127.0.0.1",
            self.port,
            dict.fromkeys(QUORUM_APIS, serve),
            role="controller",
        )
        self.port = await self.server.bind()
        return self.port

    async def start(self, voters: dict[int, tuple[str, int]], *, may_vote: bool = True) -> None:
        if self.server is None:
            await self.bind()
        assert self.server is not None
        self.log, recovered = MetadataLog.open(self.directory)
        self.driver = QuorumDriver(
            node_id=self.node_id,
            voters=voters,
            cluster_id="test-cluster",
            metadata_log=self.log,
            recovered=recovered,
            state_file=QuorumStateFile(self.directory),
            settings=SETTINGS,
            faults=Faults("controller"),
            may_vote=may_vote,
        )
        self.driver.start()
        await self.server.start_serving()

    async def crash(self) -> None:
        """As a SIGKILL: no goodbye, connections dropped, what was written stays."""
        assert self.driver is not None and self.server is not None and self.log is not None
        await self.server.close()
        await self.driver.stop(resign=False)
        self.log.close()
        self.server = self.driver = self.log = None

    async def stop(self) -> None:
        if self.driver is None:
            return
        assert self.server is not None and self.log is not None
        await self.driver.stop(resign=True)
        await self.server.close()
        self.log.close()
        self.server = self.driver = self.log = None


async def cluster(tmp_path: Path) -> tuple[list[Voter], dict[int, tuple[str, int]]]:
    voters = [Voter(n, tmp_path / f"c{n}") for n in (1, 2, 3)]
    addresses = {v.node_id: ("127.0.0.1", await v.bind()) for v in voters}
    for v in voters:
        await v.start(addresses)
    return voters, addresses


async def leader_of(voters: list[Voter], timeout: float = 10.0, exclude: int = -1) -> Voter:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for v in voters:
            if v.driver is not None and v.node_id != exclude and v.driver.replica.is_leader:
                return v
        await asyncio.sleep(0.01)
    raise AssertionError(f"no leader within {timeout}s")


async def commit(leader: Voter, names: list[str]) -> int:
    assert leader.driver is not None
    end = leader.driver.append([TopicRecord(name=n, topic_id=n.ljust(22, "x")) for n in names])
    await leader.driver.wait_committed(end, timeout_s=10)
    return end


async def all_at(voters: list[Voter], hw: int, timeout: float = 10.0) -> None:
    """Every voter knows `hw` is committed and has its log written that far. A follower
    learns the high watermark from the leader before its own write of those entries
    completes, so a test that reads its disk waits for both."""

    def behind(v: Voter) -> bool:
        if v.driver is None:
            return False
        replica = v.driver.replica
        return replica.high_watermark < hw or replica.log.flushed_end < hw

    deadline = time.monotonic() + timeout
    while any(behind(v) for v in voters):
        assert time.monotonic() < deadline, [
            (v.node_id, v.driver.replica.high_watermark, v.driver.replica.log.flushed_end)
            for v in voters
            if v.driver
        ]
        await asyncio.sleep(0.01)


def topics_on_disk(v: Voter) -> list[str]:
    """What the voter's data directory holds, read back as at a restart."""
    _, recovered = MetadataLog.open(v.directory)
    records = list(recovered.snapshot_records) + [e.record for e in recovered.entries]
    return [r.name for r in records if isinstance(r, TopicRecord)]


async def test_a_leader_is_elected_and_commits_on_every_disk(tmp_path: Path) -> None:
    voters, _ = await cluster(tmp_path)
    try:
        leader = await leader_of(voters)
        end = await commit(leader, ["a", "b", "c"])
        await all_at(voters, end)
        for v in voters:
            assert v.driver is not None
            committed = v.driver.committed_entries(0, 100)
            assert isinstance(committed[0].record, LeaderChangeRecord)
            assert [e.record.name for e in committed[1:]] == ["a", "b", "c"]  # type: ignore[union-attr]
        described = leader.driver.describe()  # type: ignore[union-attr]
        assert (described.role, described.leader_id) == ("leader", leader.node_id)
        assert {s.replica_id: s.log_end_offset for s in described.voters} == dict.fromkeys(
            (1, 2, 3), end
        )
    finally:
        for v in voters:
            await v.stop()
    for v in voters:
        assert topics_on_disk(v) == ["a", "b", "c"]


async def test_a_killed_leader_is_replaced_and_catches_up(tmp_path: Path) -> None:
    voters, addresses = await cluster(tmp_path)
    try:
        old = await leader_of(voters)
        old_epoch = old.driver.replica.epoch  # type: ignore[union-attr]
        await commit(old, ["before"])
        killed_at = time.monotonic()
        await old.crash()
        new = await leader_of(voters, timeout=5.0, exclude=old.node_id)
        failover = time.monotonic() - killed_at
        # Detection (fetch timeout), then at most two election rounds and a backoff.
        bound = (
            SETTINGS.fetch_timeout_ms
            + 4 * SETTINGS.election_timeout_ms
            + SETTINGS.election_backoff_max_ms
        ) / 1000
        assert failover <= bound, f"new leader after {failover:.2f}s (bound {bound:.1f}s)"
        assert new.driver is not None and new.driver.replica.epoch > old_epoch
        end = await commit(new, ["after"])
        await old.start(addresses)  # back from the dead: follows, catches up
        await all_at(voters, end)
        assert old.driver is not None and old.driver.replica.role is Role.FOLLOWER
        names = [
            e.record.name
            for e in old.driver.committed_entries(0, 100)  # type: ignore[union-attr]
            if isinstance(e.record, TopicRecord)
        ]
        assert names == ["before", "after"]
    finally:
        for v in voters:
            await v.stop()


async def test_a_leader_that_stops_gracefully_hands_over_at_once(tmp_path: Path) -> None:
    voters, _ = await cluster(tmp_path)
    try:
        old = await leader_of(voters)
        await commit(old, ["x"])
        stopped_at = time.monotonic()
        await old.stop()
        await leader_of(voters, timeout=5.0, exclude=old.node_id)
        # EndQuorumEpoch: no waiting out the fetch timeout.
        assert time.monotonic() - stopped_at < SETTINGS.fetch_timeout_ms / 1000
    finally:
        for v in voters:
            await v.stop()


async def test_a_voter_that_lost_its_disk_catches_up_before_voting(tmp_path: Path) -> None:
    voters, addresses = await cluster(tmp_path)
    try:
        leader = await leader_of(voters)
        end = await commit(leader, [f"t{i}" for i in range(20)])
        await all_at(voters, end)
        # The leader snapshots what is committed: the lost voter gets it by FetchSnapshot.
        assert leader.driver is not None
        replica = leader.driver.replica
        hw = replica.high_watermark
        records = tuple(e.record for e in leader.driver.committed_entries(0, hw))
        replica.compact(Snapshot(hw, replica.log.epoch_at(hw - 1), records))
        leader.driver._after()
        lost = next(v for v in voters if v is not leader)
        await lost.crash()
        for path in lost.directory.iterdir():
            path.unlink()  # the volume is gone
        await lost.start(addresses, may_vote=False)
        end = await commit(leader, ["later"])
        await all_at(voters, end)
        assert lost.driver is not None and lost.driver.replica.may_vote
        names = topics_on_disk(lost)
        assert names == [f"t{i}" for i in range(20)] + ["later"]
    finally:
        for v in voters:
            await v.stop()


async def test_two_voters_that_lost_their_disks_do_not_make_a_new_quorum(
    tmp_path: Path,
) -> None:
    """Committed entries survive on the one voter that kept its disk: the two that
    lost theirs ask each other at start, each sees the other empty, and must not take
    that for a new quorum (voting_rights.py: a majority of the *others* must answer
    empty). Counting themselves, they elected a leader of an empty log within a
    second, and the cluster's metadata was gone."""
    voters, addresses = await cluster(tmp_path)
    try:
        leader = await leader_of(voters)
        end = await commit(leader, ["kept"])
        await all_at(voters, end)
        keeper = next(v for v in voters if v is not leader)
        lost = [v for v in voters if v is not keeper]
        await keeper.crash()
        for v in lost:
            await v.crash()
            for path in v.directory.iterdir():
                path.unlink()  # the volume is gone
        for v in lost:
            await v.start(addresses, may_vote=False)
        await asyncio.sleep(2.0)  # ~13 election timeouts
        for v in lost:
            assert v.driver is not None
            replica = v.driver.replica
            assert not replica.may_vote and not replica.is_leader, (v.node_id, replica.role)
            assert replica.log.end_offset == 0
        assert topics_on_disk(keeper) == ["kept"]
    finally:
        for v in voters:
            await v.stop()


async def test_a_voter_that_lost_only_its_log_catches_up_before_voting(tmp_path: Path) -> None:
    """Its quorum state says its log held entries (voting_rights.py): with the log
    gone it may have acknowledged committed entries it no longer has, so it neither
    votes nor stands until it has caught up, and a restart meanwhile does not give
    the vote back (`catching_up` is in the state)."""
    voters, addresses = await cluster(tmp_path)
    try:
        leader = await leader_of(voters)
        end = await commit(leader, ["a", "b"])
        await all_at(voters, end)
        lost = next(v for v in voters if v is not leader)
        await lost.crash()
        for path in lost.directory.glob("metadata-*.log"):
            path.unlink()  # the log is gone, quorum-state and meta.properties stay
        state = QuorumStateFile(lost.directory).read()
        assert state.held_entries
        may_vote = may_vote_at_start(single_voter=False, state=state, log_empty=True)
        assert not may_vote
        await leader.crash()  # the third cannot win without its vote: no leader
        await lost.start(addresses, may_vote=may_vote)
        await asyncio.sleep(1.0)
        assert lost.driver is not None and not lost.driver.replica.may_vote
        assert QuorumStateFile(lost.directory).read().catching_up
        await lost.crash()
        state = QuorumStateFile(lost.directory).read()
        assert not may_vote_at_start(single_voter=False, state=state, log_empty=True)
        await lost.start(addresses, may_vote=False)
        await leader.start(addresses)
        leader = await leader_of(voters)
        end = await commit(leader, ["c"])
        await all_at(voters, end)
        assert lost.driver.replica.may_vote
        assert not QuorumStateFile(lost.directory).read().catching_up
        assert topics_on_disk(lost) == ["a", "b", "c"]
    finally:
        for v in voters:
            await v.stop()


class LyingVoter:
    """A peer on a real socket that claims to be voter 1 and leader of epoch 5, and
    answers QuorumFetch with the `lies` in turn, then with one true entry."""

    EPOCH = 5

    def __init__(self, lies: list[dict[str, object]]) -> None:
        self.lies = list(lies)
        self.fetches = 0
        self.server: ListenerServer | None = None

    async def bind(self) -> int:
        async def serve(ctx: RequestContext, body: Message) -> Message:
            return self.answer(body)

        self.server = ListenerServer(
            "liar", "127.0.0.1", 0, dict.fromkeys(QUORUM_APIS, serve), role="controller"
        )
        port = await self.server.bind()
        await self.server.start_serving()
        return port

    def answer(self, body: Message) -> Message:
        if isinstance(body, DescribeQuorumRequest):
            return DescribeQuorumResponse(node_id=1, leader_id=1, leader_epoch=self.EPOCH)
        if isinstance(body, VoteRequest):  # "I lead epoch 5": the voter follows
            return VoteResponse(voter_id=1, leader_id=1, leader_epoch=self.EPOCH)
        if isinstance(body, QuorumFetchRequest):
            self.fetches += 1
            base = {"leader_id": 1, "leader_epoch": self.EPOCH, "high_watermark": 1}
            if self.lies:
                return QuorumFetchResponse(**{**base, **self.lies.pop(0)})  # type: ignore[arg-type]
            if body.fetch_offset == 0:
                return QuorumFetchResponse(**base, entries=[entry(0, self.EPOCH)])  # type: ignore[arg-type]
            return QuorumFetchResponse(**base)  # type: ignore[arg-type]
        return BeginQuorumEpochResponse(error_code=int(ErrorCode.INVALID_REQUEST))


def entry(offset: int, epoch: int) -> MetadataEntry:
    return MetadataEntry(
        offset=offset, epoch=epoch, record=TopicRecord(name=f"t{offset}", topic_id="x" * 22)
    )


async def test_a_peer_that_lies_in_its_answers_is_ignored_not_obeyed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant: a peer's answer that cannot be true (a leader that is no voter, fetched
    entries that do not continue the log or outrun the leader's epoch, a divergence
    below the high watermark) changes nothing: one ERROR line, the voter treats it as
    no answer and goes on fetching. Without the check the gap and the divergence
    raised inside the fetch task (an exception nobody saw) and the entry of epoch 9,
    which no leader wrote, was committed."""
    lies: list[dict[str, object]] = [
        {"entries": [entry(7, 5)]},  # a gap: the log ends at 0
        {"leader_id": 99},  # not a voter
        {"entries": [entry(0, 9)]},  # an epoch past the leader's 5
        {"entries": [entry(0, 5)], "diverging_epoch": 2, "diverging_end_offset": 0},
    ]
    liar = LyingVoter(lies)
    liar_port = await liar.bind()
    voter = Voter(0, tmp_path / "c0")
    port = await voter.bind()
    dead_port = await Voter(2, tmp_path / "c2").bind()  # bound, never served
    try:
        await voter.start(
            {0: ("127.0.0.1", port), 1: ("127.0.0.1", liar_port), 2: ("127.0.0.1", dead_port)}
        )
        assert voter.driver is not None
        replica = voter.driver.replica
        deadline = time.monotonic() + 20
        while replica.high_watermark < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert replica.high_watermark == 1, (replica.role, replica.epoch, liar.fetches)
        assert (replica.leader_id, replica.epoch) == (1, LyingVoter.EPOCH)
        assert [(e.offset, e.epoch) for e in replica.log.entries] == [(0, LyingVoter.EPOCH)]
        ignored = [r.getMessage() for r in caplog.records if "ignored the answer" in r.getMessage()]
        assert len(ignored) == 4, ignored
        assert "continues the log" in ignored[0] and "not a voter" in ignored[1]
        assert "outside" in ignored[2] and "at most one" in ignored[3]

        # A divergence that would cut the committed entry at offset 0.
        liar.lies.append({"diverging_epoch": 3, "diverging_end_offset": 0})
        while len(liar.lies) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        assert replica.high_watermark == 1 and replica.log.end_offset == 1
        assert any("would truncate committed" in r.getMessage() for r in caplog.records)
    finally:
        await voter.stop()
        assert liar.server is not None
        await liar.server.close()
