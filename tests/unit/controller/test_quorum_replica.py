"""Scripted scenarios of one quorum voter (controller/quorum/replica.py), each the rule
of KIP-595 / Raft it protects, shown failing with the protection off where the
simulation would need luck to hit it; and the quorum-state file, an on-disk contract.

- a vote is written to the quorum-state file before it is granted, so a voter that
  restarts never votes twice in one epoch (two leaders in an epoch otherwise);
- a leader commits only through an entry of its own epoch (Raft's figure 8): entries
  of earlier epochs on a majority are not committed by counting alone;
- a voter that hears from its leader refuses pre-votes (KIP-996): a voter cut off
  from the others cannot depose a healthy leader when it comes back;
- requests from another cluster or from a node outside the voter set are refused.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.errors import CorruptMetadataError
from controller.quorum.quorum_log import QuorumLog
from controller.quorum.quorum_log import Snapshot
from controller.quorum.quorum_state import QuorumStateFile
from controller.quorum.replica import QuorumReplica
from controller.quorum.replica import QuorumSettings
from controller.quorum.replica import QuorumState
from controller.quorum.replica import Role
from protocol.errors import ErrorCode
from protocol.messages.quorum_apis import BeginQuorumEpochRequest
from protocol.messages.quorum_apis import MetadataEntry
from protocol.messages.quorum_apis import QuorumFetchRequest
from protocol.messages.quorum_apis import VoteRequest
from protocol.messages.quorum_apis import VoteResponse
from protocol.metadata_records import LeaderChangeRecord

VOTERS = (1, 2, 3)
CLUSTER = "c1"
SETTINGS = QuorumSettings()


def voter(
    node: int,
    directory: Path,
    *,
    entries: list[MetadataEntry] = (),  # type: ignore[assignment]
    save: Callable[[QuorumState], None] | None = None,
) -> QuorumReplica:
    """A voter whose quorum state lives in a real quorum-state file in `directory`."""
    state_file = QuorumStateFile(directory)
    return QuorumReplica(
        node,
        VOTERS,
        cluster_id=CLUSTER,
        log=QuorumLog(None, list(entries)),
        state=state_file.read(),
        save_state=save or state_file.write,
        settings=SETTINGS,
        rng=random.Random(node),
        now=0.0,
    )


def vote(candidate: int, epoch: int, *, pre_vote: bool = False) -> VoteRequest:
    return VoteRequest(
        cluster_id=CLUSTER,
        candidate_id=candidate,
        candidate_epoch=epoch,
        last_offset_epoch=-1,
        last_offset=0,
        pre_vote=pre_vote,
    )


def granted(response: object) -> bool:
    assert isinstance(response, VoteResponse)
    return response.vote_granted


def test_a_vote_survives_a_restart_and_is_never_given_twice(tmp_path: Path) -> None:
    v = voter(2, tmp_path)
    assert granted(v.handle_request(1, vote(1, 1), now=1.0))
    restarted = voter(2, tmp_path)  # a crash right after answering: the file is all it has
    assert restarted.state == QuorumState(epoch=1, voted_for=1, leader_id=-1)
    assert not granted(restarted.handle_request(3, vote(3, 1), now=2.0)), "a second vote"
    assert granted(restarted.handle_request(3, vote(3, 2), now=3.0))  # a new epoch: yes


def test_without_persisting_the_vote_a_restarted_voter_votes_twice(tmp_path: Path) -> None:
    """Protection off: the vote is kept in memory only. Candidates 1 and 3 both get
    voter 2's vote in epoch 1; with their own, each has a majority: two leaders."""
    v = voter(2, tmp_path, save=lambda state: None)
    assert granted(v.handle_request(1, vote(1, 1), now=1.0))
    restarted = voter(2, tmp_path, save=lambda state: None)
    assert granted(restarted.handle_request(3, vote(3, 1), now=2.0))


def elect(leader: QuorumReplica, now: float) -> None:
    """Drive `leader` through pre-vote and vote with every voter granting."""
    leader.tick(now + 10_000)  # its election timeout passed
    for _ in range(2):  # pre-votes, then votes
        requests, leader.outbox = leader.outbox, []
        for node, request in requests:
            assert isinstance(request, VoteRequest)
            leader.handle_response(
                node,
                request,
                VoteResponse(voter_id=node, leader_epoch=leader.epoch, vote_granted=True),
                now,
            )
    assert leader.role is Role.LEADER


def fetch(replica: int, offset: int, last_epoch: int, epoch: int) -> QuorumFetchRequest:
    return QuorumFetchRequest(
        cluster_id=CLUSTER,
        replica_id=replica,
        current_leader_epoch=epoch,
        fetch_offset=offset,
        last_fetched_epoch=last_epoch,
    )


def test_a_leader_commits_only_through_an_entry_of_its_own_epoch(tmp_path: Path) -> None:
    """Raft's figure 8: the new leader's log ends with an entry of epoch 2 that voter 2
    also has. A majority has it, but an entry of an earlier epoch on a majority can
    still be replaced by a later leader, so it commits only once the leader's own
    first entry (epoch 3) is on a majority too."""
    old = [
        MetadataEntry(offset=0, epoch=1, record=LeaderChangeRecord(leader_id=2, leader_epoch=1)),
        MetadataEntry(offset=1, epoch=2, record=LeaderChangeRecord(leader_id=3, leader_epoch=2)),
    ]
    QuorumStateFile(tmp_path).write(QuorumState(epoch=2, voted_for=-1, leader_id=-1))
    leader = voter(1, tmp_path, entries=old)
    elect(leader, 1.0)
    assert (leader.epoch, leader.log.end_offset) == (3, 3)  # its own entry at offset 2
    leader.flushed(leader.log.flush_point(), 2.0)
    answer = leader.handle_request(2, fetch(2, 2, 2, 3), now=3.0)
    assert answer.error_code == 0 and answer.high_watermark == 0, "counted an epoch-2 entry"
    answer = leader.handle_request(2, fetch(2, 3, 3, 3), now=4.0)
    assert answer.high_watermark == 3


def test_a_voter_that_hears_from_its_leader_refuses_pre_votes(tmp_path: Path) -> None:
    follower = voter(2, tmp_path)
    begin = BeginQuorumEpochRequest(cluster_id=CLUSTER, leader_id=1, leader_epoch=4)
    assert follower.handle_request(1, begin, now=1.0).error_code == 0
    assert (follower.role, follower.leader_id) == (Role.FOLLOWER, 1)
    # Voter 3 was cut off, timed out and asks for a pre-vote in epoch 5.
    assert not granted(follower.handle_request(3, vote(3, 5, pre_vote=True), now=2.0))
    assert follower.epoch == 4, "a pre-vote must change nothing"
    # Once the leader has been silent for the fetch timeout, the pre-vote is granted.
    later = 1.0 + SETTINGS.fetch_timeout_ms + 1
    assert granted(follower.handle_request(3, vote(3, 5, pre_vote=True), now=later))
    assert follower.epoch == 4


def test_requests_from_another_cluster_or_a_non_voter_are_refused(tmp_path: Path) -> None:
    v = voter(2, tmp_path)
    foreign = VoteRequest(
        cluster_id="other", candidate_id=1, candidate_epoch=1, last_offset_epoch=-1, last_offset=0
    )
    assert v.handle_request(1, foreign, now=1.0).error_code == ErrorCode.INCONSISTENT_CLUSTER_ID
    assert v.handle_request(9, vote(9, 1), now=1.0).error_code == ErrorCode.INCONSISTENT_VOTER_SET
    assert v.state == QuorumState(), "a refused request changed the state"


# ------------------------------------------------------------------ the quorum-state file

# As issue 17's first build wrote it (version 1): epoch 5, voted for 2, leader 2.
FIXTURE = b'{"crc": 3598015657, "epoch": 5, "leader_id": 2, "version": 1, "voted_for": 2}\n'
# As this build writes it (version 2): the same, and a log that held entries.
FIXTURE_V2 = (
    b'{"catching_up": 0, "crc": 1877319215, "epoch": 5, "held_entries": 1, "leader_id": 2, '
    b'"version": 2, "voted_for": 2}\n'
)


def test_the_quorum_state_file_reads_its_fixtures(tmp_path: Path) -> None:
    """Version 1 reads as a log never marked (the behaviour of the builds that wrote
    it); what this build writes is version 2, byte for byte."""
    (tmp_path / "quorum-state").write_bytes(FIXTURE)
    assert QuorumStateFile(tmp_path).read() == QuorumState(epoch=5, voted_for=2, leader_id=2)
    (tmp_path / "quorum-state").write_bytes(FIXTURE_V2)
    held = QuorumState(epoch=5, voted_for=2, leader_id=2, held_entries=True)
    assert QuorumStateFile(tmp_path).read() == held
    QuorumStateFile(tmp_path).write(held)
    assert (tmp_path / "quorum-state").read_bytes() == FIXTURE_V2


def test_a_version_1_state_with_a_log_is_marked_at_start(tmp_path: Path) -> None:
    """Upgrading: a voter whose version 1 state sits beside a log with entries writes
    the mark at once, so a later loss of that log is seen."""
    (tmp_path / "quorum-state").write_bytes(FIXTURE)
    state_file = QuorumStateFile(tmp_path)
    leader_change = LeaderChangeRecord(leader_id=2, leader_epoch=5)
    log = QuorumLog(Snapshot(), [MetadataEntry(offset=0, epoch=5, record=leader_change)])
    QuorumReplica(
        1,
        (1, 2, 3),
        cluster_id="c",
        log=log,
        state=state_file.read(),
        save_state=state_file.write,
        settings=QuorumSettings(),
        rng=random.Random(1),
        now=0.0,
    )
    assert state_file.read().held_entries


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (FIXTURE.replace(b'"epoch": 5', b'"epoch": 6'), "CRC"),
        (FIXTURE[:30], "does not parse"),
        (b"", "does not parse"),
        (FIXTURE.replace(b'"version": 1', b'"version": 2'), "does not parse"),
        (FIXTURE.replace(b'"version": 1', b'"version": 3'), "has version 3"),
        (FIXTURE_V2.replace(b'"held_entries": 1', b'"held_entries": 0'), "CRC"),
        (b'{"epoch": "5"}', "does not parse"),
    ],
)
def test_a_damaged_quorum_state_file_is_refused_never_guessed(
    tmp_path: Path, content: bytes, why: str
) -> None:
    (tmp_path / "quorum-state").write_bytes(content)
    with pytest.raises(CorruptMetadataError, match=why) as raised:
        QuorumStateFile(tmp_path).read()
    assert "cannot be guessed" in str(raised.value)


def test_an_unreadable_quorum_state_file_is_refused_with_a_message(tmp_path: Path) -> None:
    """A directory where the file should be (EIO and EACCES take the same path): the
    refusal names it; it was a raw IsADirectoryError traceback."""
    (tmp_path / "quorum-state").mkdir()
    with pytest.raises(CorruptMetadataError, match=r"cannot be read .*Is a directory"):
        QuorumStateFile(tmp_path).read()


def test_no_quorum_state_file_is_a_voter_that_never_voted(tmp_path: Path) -> None:
    assert QuorumStateFile(tmp_path).read() == QuorumState()
