"""Answers matched to what was asked (broker/answers.py): a peer that answers a
partition twice, or one it was not asked about, must not get an answer applied twice or
a change made that nobody asked for; what it left out is handed back for a retry."""

from __future__ import annotations

from broker.answers import MatchedAnswers


def test_each_asked_partition_takes_its_first_answer_only() -> None:
    asked = {("t", 0): "change-0", ("t", 1): "change-1", ("t", 2): "change-2"}
    answers = [
        (("t", 0), "first"),
        (("t", 0), "repeated"),
        (("other", 0), "never asked"),
        (("t", 2), "for 2"),
    ]
    matched = MatchedAnswers(asked, answers)
    assert list(matched) == [("change-0", "first"), ("change-2", "for 2")]
    assert matched.unanswered == [(("t", 1), "change-1")]


def test_nothing_answered_leaves_everything_unanswered() -> None:
    asked = {("t", 0): 1, ("t", 1): 2}
    matched = MatchedAnswers(asked, [])
    assert list(matched) == []
    assert matched.unanswered == [(("t", 0), 1), (("t", 1), 2)]
