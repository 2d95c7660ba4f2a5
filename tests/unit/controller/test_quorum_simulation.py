"""The controller quorum under the deterministic simulation (quorum_simulation.py):
thousands of seeds, each its own mix of message loss, delay, partitions, kills, power
cuts, lost disks and lost logs, checked for election safety, committed entries that never change,
leader completeness, log matching and, once the network heals, a leader with every
acknowledged append on every voter.

Each protection the quorum relies on is then switched off in turn and the simulation
must find a seed that breaks an invariant: a safety check that cannot fail proves
nothing. MINIBROKER_SIM_SEEDS=N runs N seeds instead of the default 1,000 (a longer
campaign); a failure prints its seed and the command that replays it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Iterator

import pytest

from controller.quorum.replica import QuorumReplica
from controller.quorum.replica import QuorumState
from controller.quorum.replica import Role
from controller.quorum.replica import VoterProgress
from controller.quorum.voting_rights import CATCH_UP
from tests.unit.controller import quorum_simulation
from tests.unit.controller.quorum_simulation import SimulationFailure
from tests.unit.controller.quorum_simulation import run_seed

SEEDS = int(os.environ.get("MINIBROKER_SIM_SEEDS", "1000"))
CHUNK = 250
# Seeds searched for a counterexample once a protection is off.
SEARCH = 2_000


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK), ids=lambda f: f"seeds-{f}")
def test_the_quorum_keeps_raft_safety_under_faults(first: int) -> None:
    acknowledged = 0
    for seed in range(first, min(first + CHUNK, SEEDS)):
        sim = run_seed(seed)  # raises SimulationFailure naming the seed
        acknowledged += len(sim.acked)
    assert acknowledged > 0


# ------------------------------------------------------------------ protections off


def _any_log_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vote granted whatever the candidate's log (Raft's election restriction off)."""
    monkeypatch.setattr(QuorumReplica, "_log_up_to_date", lambda self, epoch, end: True)


def _restarted_leader_leads_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader that restarts resumes leading its epoch (it may have lost entries it
    appended in that epoch, and appends others at the same offsets)."""
    original = QuorumReplica.__init__

    def init(self: QuorumReplica, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        if self.state.leader_id == self.node_id:
            self.role = Role.LEADER
            self._progress = {v: VoterProgress() for v in self.voters if v != self.node_id}
            for p in self._progress.values():
                p.last_fetch_ms = kwargs["now"]

    monkeypatch.setattr(QuorumReplica, "__init__", init)


def _follower_reports_unflushed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower fetches (so tells the leader it holds) entries not yet on its disk."""
    original = QuorumReplica._maybe_fetch

    def maybe_fetch(self: QuorumReplica, now: float) -> None:
        durable, self.log.flushed_end = self.log.flushed_end, self.log.end_offset
        try:
            original(self, now)
        finally:
            self.log.flushed_end = durable

    monkeypatch.setattr(QuorumReplica, "_maybe_fetch", maybe_fetch)


def _leader_counts_unflushed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader counts its own entries before they are on its disk."""

    def advance(self: QuorumReplica) -> None:
        ends = sorted(
            [self.log.end_offset, *(p.end_offset for p in self._progress.values())],
            reverse=True,
        )
        end = ends[self.majority - 1]
        if end > self.high_watermark and self.log.epoch_at(end - 1) == self.epoch:
            self._set_high_watermark(end)

    monkeypatch.setattr(QuorumReplica, "_advance_high_watermark", advance)


def _lost_log_votes_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A voter whose quorum state says its log held entries, and whose log is empty,
    votes at once (as if it had never held any)."""

    def rule(*, single_voter: bool, state: QuorumState | None, log_empty: bool) -> bool:
        return single_voter or (state is not None and not state.catching_up)

    monkeypatch.setattr(quorum_simulation, "may_vote_at_start", rule)


def _restart_gives_the_vote_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A voter still catching up after a lost disk or log votes again once it
    restarts (the state does not keep `catching_up`)."""

    def rule(*, single_voter: bool, state: QuorumState | None, log_empty: bool) -> bool:
        return single_voter or (state is not None and not (state.held_entries and log_empty))

    monkeypatch.setattr(quorum_simulation, "may_vote_at_start", rule)


def _start_probe_counts_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A voter that may not vote counts its own empty log among the answers."""

    def verdict(answers: list[tuple[int, int]], majority: int) -> int | str | None:
        if any(end > 0 for _, end in answers):
            return CATCH_UP
        if 1 + len(answers) >= majority:
            return max((epoch for epoch, _ in answers), default=0)
        return None

    monkeypatch.setattr(quorum_simulation, "start_verdict", verdict)


def _no_floor_for_forgotten_votes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A voter without its state votes again in the epochs the others answered (it may
    have voted in them before its disk went)."""
    original = QuorumReplica.allow_voting

    def allow(self: QuorumReplica, floor_epoch: int, now: float) -> None:
        original(self, -1, now)

    monkeypatch.setattr(QuorumReplica, "allow_voting", allow)


PROTECTIONS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "vote-only-for-an-up-to-date-log": _any_log_wins,
    "a-restarted-leader-does-not-lead-its-epoch-again": _restarted_leader_leads_again,
    "followers-report-only-durable-entries": _follower_reports_unflushed,
    "the-leader-counts-only-its-durable-entries": _leader_counts_unflushed,
    "a-voter-that-lost-its-log-catches-up-before-voting": _lost_log_votes_at_once,
    "a-restart-does-not-give-the-vote-back": _restart_gives_the_vote_back,
    "the-start-probe-does-not-count-itself": _start_probe_counts_itself,
    "a-voter-without-state-votes-above-the-epochs-it-heard": _no_floor_for_forgotten_votes,
}


def _first_failure(limit: int) -> Iterator[SimulationFailure]:
    for seed in range(limit):
        try:
            run_seed(seed)
        except SimulationFailure as failure:
            yield failure
            return


@pytest.mark.parametrize("protection", sorted(PROTECTIONS))
def test_each_protection_is_needed(protection: str, monkeypatch: pytest.MonkeyPatch) -> None:
    PROTECTIONS[protection](monkeypatch)
    found = list(_first_failure(SEARCH))
    assert found, f"with {protection} off, no seed of {SEARCH} broke an invariant"
    message = str(found[0])
    assert any(
        words in message
        for words in ("committed", "two leaders", "acknowledged", "another entry", "lacks")
    ), message


def test_a_replay_is_deterministic() -> None:
    a, b = run_seed(7), run_seed(7)
    assert (a.acked, a.stats, a.leaders) == (b.acked, b.stats, b.leaders)
