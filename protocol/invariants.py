"""Invariant checks that `python -O` keeps.

An `assert` vanishes under -O, so a protection that matters for data (the high
watermark never moves back, epochs never decrease, offsets strictly increase, the
ISR contains the leader) is checked with `invariant(...)` or an explicit
`raise InvariantError(...)` instead. A violation is a bug or a corrupt input: the
caller's process reports it loudly (tests fail on it) rather than go on with a state
that can lose acknowledged data.

Hot paths: `invariant(cond, "text")` costs one call; when the message needs
formatting, write `if not cond: raise InvariantError(f"...")` so nothing is formatted
while the invariant holds.
"""

from __future__ import annotations

from collections.abc import Callable


class InvariantError(AssertionError):
    """A broken invariant. An AssertionError, so existing handlers and tests see it
    as they saw the asserts it replaces."""


def invariant(condition: object, message: str | Callable[[], str]) -> None:
    """Raise InvariantError(message) unless `condition` holds. `message` may be a
    callable, called only on failure (for messages that cost something to build)."""
    if not condition:
        raise InvariantError(message() if callable(message) else message)
