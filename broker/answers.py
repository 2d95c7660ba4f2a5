"""Answers to a request for many partitions, matched to what was asked, by one rule: each
asked partition takes its first answer; a repeated answer or one for a partition not
asked is ignored (a peer's mistake must not be applied twice), and what was asked but
not answered is handed back so the caller can retry or fail it."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Generic
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")
A = TypeVar("A")


class MatchedAnswers(Generic[K, V, A]):
    """Iterate for `(asked, answer)` pairs; afterwards `unanswered` holds the rest."""

    def __init__(self, asked: Mapping[K, V], answers: Iterable[tuple[K, A]]) -> None:
        self._asked = asked
        self._answers = answers
        self._answered: set[K] = set()

    def __iter__(self) -> Iterator[tuple[V, A]]:
        for key, answer in self._answers:
            entry = self._asked.get(key)
            if entry is None or key in self._answered:
                continue
            self._answered.add(key)
            yield entry, answer

    @property
    def unanswered(self) -> list[tuple[K, V]]:
        return [(key, v) for key, v in self._asked.items() if key not in self._answered]
