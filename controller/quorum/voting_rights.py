"""When a voter that starts without its quorum state may vote: the rule that tells a
new quorum from a lost disk.

A voter of a quorum of several with no `quorum-state` is either one of a new quorum's
voters at their first start, or a voter that lost its disk: it may have voted in
epochs it forgot (a second vote in one epoch can make two leaders) and acknowledged
entries it no longer holds. Nothing on its own disk tells the two apart, so it asks
the other voters (driver.py) and votes only once as many of them as make a majority
have answered with empty logs and epochs 0 (a new quorum: nothing was ever committed
or voted), or once it has caught up with a leader (replica.py).

Not counting itself: its own emptiness is what is in doubt. Counted, a voter of three
that lost its disk, and another that lost its disk too (or never started), would make
a "new" quorum of two while the third, down, holds every committed entry, and elect a
leader without them. Any majority of the others meets every majority that committed
an entry or elected a leader, so one of them answers with a log or an epoch. The cost:
the first election of a new quorum of three needs all three voters up, of five four.

Not covered (a known gap): a voter that kept its quorum state but lost its metadata log
votes at once, and its vote can elect a candidate without entries it had acknowledged.
Telling that apart from a power cut before the first flush (an empty log that
acknowledged nothing) needs a durable mark of a log that held entries, and a voter in
that state still needs to vote for the quorum to elect anyone; a vote floor learned
from a majority's last log epochs would give both, and is not built.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["quorum_is_new"]


def quorum_is_new(*, answers: Sequence[tuple[int, int]], majority: int) -> bool | None:
    """From the (epoch, log end offset) the other voters answered: True when the
    quorum is new and the voter may vote, False when the cluster exists (it catches up
    first), None while too few have answered to tell (a majority of voters, this one
    not counted)."""
    if any(epoch > 0 or end > 0 for epoch, end in answers):
        return False
    if len(answers) >= majority:
        return True
    return None
