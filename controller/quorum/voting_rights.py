"""When a controller that starts may vote: the one rule for lost disks and lost logs.

Raft's safety needs a voter's votes and its log to be what it promised before. A
voter of a quorum of several may start without them:

- no `quorum-state` (a lost disk, or a first start): it may have voted in epochs it
  forgot, and a second vote in one epoch can make two leaders;
- its quorum state, which says its log held entries (`held_entries`, set before the
  first was reported or counted), and an empty metadata log (an emptied or replaced
  log directory): it may have acknowledged entries a leader then committed, and with
  an empty log it grants its vote to any candidate, so a candidate without them can
  win with its vote and the committed entries are lost.

Such a voter neither votes nor stands until it has caught up with a leader
(replica.py `_learn_high_watermark`), or until as many of the other voters as make a
majority have answered and every log among the answers is empty: then nothing was
ever committed, and it may vote (driver.py asks them). Not counting itself: its own
emptiness is what is in doubt. Counted, a voter of three that lost its disk, and
another that lost its disk too, would make an "empty" majority while the third, down,
holds every committed entry, and elect a leader without them; any majority of the
others meets every majority that committed an entry. The cost: the first election of
a new quorum of three needs all three voters up, of five four.

The voter then takes the highest epoch among the answers as one it may have voted
in (`allow_voting` persists it with a forgotten vote; a voter that kept its quorum
state needs none and only skips a vote in that epoch): any majority of the others
meets the majority that elected a leader in an epoch, so it never votes again in an
epoch that has a leader. (An epoch whose election was still open when the disk went
can get a second vote: Raft without KIP-853's directory ids cannot tell.) Other
voters' epochs say nothing else: a candidate's epoch with every log empty is an
election under way, and waiting for it to end would wait for ever when it needs this
voter's vote. Until it may vote again, `catching_up` in its quorum state keeps a
restart from giving the vote back.

An empty log with no mark (a power cut before the first flush, a log cut back to
nothing because it diverged) acknowledged nothing that was committed: that voter
votes at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.quorum.replica import QuorumState

__all__ = ["CATCH_UP", "may_vote_at_start", "start_verdict"]

# The answers show a log: the voter catches up with a leader before it votes.
CATCH_UP = "catch up"


def may_vote_at_start(*, single_voter: bool, state: QuorumState | None, log_empty: bool) -> bool:
    """Whether a voter may vote as soon as it starts (see the module docstring);
    `state` None: no quorum-state file. A voter that starts without the right keeps
    `catching_up` in its state until it has it back, so a restart does not return it.
    A quorum of one has no one to catch up from: a leader's empty log is refused at
    start instead (controller/app.py)."""
    if single_voter:
        return True
    if state is None or state.catching_up:
        return False
    return not (state.held_entries and log_empty)


def start_verdict(answers: Sequence[tuple[int, int]], majority: int) -> int | str | None:
    """From the (epoch, log end offset) the other voters answered: CATCH_UP when a
    log holds entries; else, once as many as make a majority (this voter not counted)
    have answered, the highest epoch among them, the one it may vote above; None
    while too few have answered."""
    if any(end > 0 for _, end in answers):
        return CATCH_UP
    if len(answers) >= majority:
        return max((epoch for epoch, _ in answers), default=0)
    return None
