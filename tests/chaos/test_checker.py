"""The checker on crafted histories: each rule is proved on a history that must fail it
(its docstring names the rule), and a clean history passes.

No cluster, no Docker: part of the default suite.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .checker import ANOMALIES
from .checker import check
from .checker import summary
from .history import FAIL
from .history import FINAL
from .history import INFO
from .history import INVOKE
from .history import NEMESIS
from .history import OK
from .history import PRODUCER_START
from .history import SEEK_BEGINNING
from .history import History
from .history import Op
from .history import dump
from .history import load
from .quorum_watch import QUORUM

P0, P1 = 0, 1


class H:
    """Builds histories: producers are processes 0-9, consumers 10-19."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def add(self, process: int | str, type_: str, f: str, **fields: Any) -> Op:
        op = Op(process=process, type=type_, f=f, index=len(self.ops), **fields)
        op.time = float(op.index)
        self.ops.append(op)
        return op

    def producer_start(self, session: int, *, requested: bool, producer_id: int) -> H:
        """A producer session as the workload records it (producer id -1: not
        idempotent)."""
        self.add(
            f"producer-{session}",
            OK,
            PRODUCER_START,
            extra={
                "session": session,
                "enable_idempotence": requested,
                "producer_id": producer_id,
                "producer_epoch": 0 if producer_id >= 0 else -1,
                "acks": "all",
            },
        )
        return self

    def send(
        self,
        process: int,
        value: str,
        partition: int,
        offset: int | None,
        status: str = OK,
        *,
        session: int | None = None,
    ) -> H:
        extra = None if session is None else {"session": session}
        self.add(process, INVOKE, "send", value=value, partition=partition, extra=extra)
        if status == OK:
            self.add(process, OK, "send", value=value, partition=partition, offset=offset)
        elif status != "pending":
            self.add(process, status, "send", value=value, error="boom")
        return self

    def poll(self, process: int, *records: tuple[int, int, str]) -> H:
        self.add(process, INVOKE, "poll")
        self.add(process, OK, "poll", values=[(p, o, v, 0) for p, o, v in records])
        return self

    def seek(self, process: int, partition: int, offset: int = SEEK_BEGINNING) -> H:
        self.add(process, OK, "seek", partition=partition, offset=offset)
        return self

    def member_poll(
        self, process: int, generation: int, member: str, *records: tuple[int, int, str]
    ) -> H:
        """A consumer-group member's poll, as group mode records it."""
        self.add(process, INVOKE, "poll")
        extra = {"generation": generation, "member": member}
        self.add(process, OK, "poll", values=[(p, o, v, 0) for p, o, v in records], extra=extra)
        return self

    def assigned(self, process: int, generation: int, partition: int, offset: int) -> H:
        extra = {"why": "assigned", "generation": generation}
        self.add(process, OK, "seek", partition=partition, offset=offset, extra=extra)
        return self

    def revoke(self, process: int, partition: int) -> H:
        self.add(process, OK, "revoke", partition=partition)
        return self

    def truncation(self, process: int, partition: int, offset: int) -> H:
        # As the workload records it: the poll fails with LogTruncationError.
        self.add(process, INVOKE, "poll")
        self.add(process, FAIL, "poll", error="LogTruncationError")
        self.add(process, INFO, "truncation", partition=partition, offset=offset)
        return self

    def caught_up(self, process: int, ends: dict[int, int]) -> H:
        self.add(process, OK, "caught-up", ends=ends)
        return self

    def final(
        self,
        logs: dict[int, list[str]],
        *,
        ends: dict[int, int] | None = None,
        complete: bool = True,
    ) -> H:
        """The final read: `logs[p]` is partition p from offset 0."""
        values = [(p, o, v, 0) for p, vs in sorted(logs.items()) for o, v in enumerate(vs)]
        if values:
            self.add(FINAL, OK, "final-read", values=values)
        ends = ends if ends is not None else {p: len(vs) for p, vs in logs.items()}
        self.add(
            FINAL,
            OK if complete else INFO,
            "final-read-end",
            ends=ends,
            extra={"complete": {p: complete for p in ends}},
        )
        return self


def replicas_of(logs: dict[int, dict[int, list[list[int]]]], hw: dict[int, int]) -> dict:
    """DescribeReplicaLog results: logs[p][broker] = [[base, last, epoch, crc], ...]."""
    return {
        "available": True,
        "reason": None,
        "errors": [],
        "partitions": {
            str(p): {
                str(b): {
                    "log_start_offset": 0,
                    "log_end_offset": batches[-1][1] + 1 if batches else 0,
                    "high_watermark": hw[p],
                    "batches": batches,
                }
                for b, batches in by_broker.items()
            }
            for p, by_broker in logs.items()
        },
    }


SAME = [[0, 1, 0, 111], [2, 2, 0, 222], [3, 3, 1, 333]]
CLEAN_REPLICAS = replicas_of({P0: {1: SAME, 2: SAME, 3: SAME}}, {P0: 4})


def clean() -> H:
    """Two producers, two consumers, 2 partitions; everything acknowledged and read."""
    h = H()
    h.send(0, "p0-0", P0, 0).send(1, "p1-0", P1, 0).send(0, "p0-1", P0, 1)
    h.seek(10, P0).seek(10, P1).seek(11, P0).seek(11, P1)
    h.poll(10, (P0, 0, "p0-0"), (P1, 0, "p1-0"))
    h.send(1, "p1-1", P1, 1).send(0, "p0-2", P0, 2)
    h.poll(11, (P0, 0, "p0-0"), (P0, 1, "p0-1"))
    h.poll(10, (P0, 1, "p0-1"), (P0, 2, "p0-2"), (P1, 1, "p1-1"))
    h.poll(11, (P0, 2, "p0-2"), (P1, 0, "p1-0"), (P1, 1, "p1-1"))
    h.caught_up(10, {P0: 3, P1: 2}).caught_up(11, {P0: 3, P1: 2})
    h.final({P0: ["p0-0", "p0-1", "p0-2"], P1: ["p1-0", "p1-1"]})
    return h


def flagged(result: dict[str, Any]) -> dict[str, int]:
    return {k: v["count"] for k, v in result["anomalies"].items() if v["count"]}


def first(result: dict[str, Any], kind: str) -> dict[str, Any]:
    return result["anomalies"][kind]["examples"][0]


# ------------------------------------------------------------------ the clean history


def test_clean_history_is_valid() -> None:
    result = check(clean().ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {}
    assert result["valid"] is True
    assert result["unchecked"] == []
    assert result["stats"]["acknowledged"] == 5
    assert result["stats"]["replicas"]["pairs"] == 3
    assert set(result["anomalies"]) == set(ANOMALIES)
    json.dumps(result)  # JSON-able


def test_without_replica_logs_the_verdict_is_unknown_not_true() -> None:
    result = check(clean().ops)
    assert flagged(result) == {}
    assert result["valid"] == "unknown"
    assert any("replica comparison not run" in u for u in result["unchecked"])


def test_brokers_without_describe_replica_log_are_reported_not_passed() -> None:
    unavailable = {
        "available": False,
        "reason": "broker 1: 127.0.0.1:9092 answered DescribeReplicaLog with INVALID_REQUEST",
        "errors": [],
        "partitions": {},
    }
    result = check(clean().ops, replicas=unavailable)
    assert result["valid"] == "unknown"
    assert any(
        u.startswith("replica comparison unavailable") and "INVALID_REQUEST" in u
        for u in result["unchecked"]
    )
    assert "replica comparison unavailable" in summary(result)


def test_indeterminate_and_failed_sends_that_never_appear_are_fine() -> None:
    h = clean()
    h.send(2, "p2-0", P0, None, status=INFO)  # timed out: may or may not be there
    h.send(3, "p3-0", P0, None, status=FAIL)  # refused before sending
    h.send(4, "p4-0", P1, None, status="pending")  # never completed
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {}
    assert result["valid"] is True
    assert result["stats"]["send-info"] == 1
    assert result["stats"]["send-fail"] == 1
    assert result["stats"]["send-pending"] == 1


def test_an_indeterminate_send_that_appears_is_fine_and_counted() -> None:
    h = H()
    h.send(0, "p0-0", P0, None, status=INFO)
    h.send(5, "p5-0", P0, 1)
    h.final({P0: ["p0-0", "p5-0"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {}
    assert result["stats"]["indeterminate-sends-read"] == 1


def test_nemesis_operations_are_counted_not_checked() -> None:
    h = clean()
    h.add(NEMESIS, INVOKE, "kill", value="broker-2")
    h.add(NEMESIS, INFO, "kill", value="broker-2")
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert result["valid"] is True
    assert result["stats"]["nemesis"] == {"kill:info": 1}


# ------------------------------------------------------------------ lost writes


def test_lost_write_missing_from_the_final_log() -> None:
    """Rule lost-write: an acknowledged value is in the final log at its acknowledged
    offset. Acknowledged at offset 1, the final log has p0-0 then p0-2 at 1: the write is
    gone and its offset holds another value."""
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1).send(1, "p1-0", P0, None, status=INFO)
    h.final({P0: ["p0-0", "p1-0"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert result["valid"] is False
    assert flagged(result)["lost-write"] == 1
    lost = first(result, "lost-write")
    assert lost == {
        "value": "p0-1",
        "partition": P0,
        "offset": 1,
        "kind": "overwritten",
        "final-value": "p1-0",
        "final-end": 2,
        "found-at": [],
    }
    assert "lost-write" in result["anomaly-types"]
    assert "lost-write" in summary(result)


def test_lost_write_beyond_the_end_of_the_final_log() -> None:
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1).send(0, "p0-2", P0, 2)
    h.final({P0: ["p0-0"]})  # truncated to 1 although 1 and 2 were acknowledged
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"lost-write": 2, "unseen": 2}
    assert {e["kind"] for e in result["anomalies"]["lost-write"]["examples"]} == {"beyond-end"}
    assert [e["value"] for e in result["anomalies"]["unseen"]["examples"]] == ["p0-1", "p0-2"]


def test_lost_write_swapped_offsets() -> None:
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1)
    h.final({P0: ["p0-1", "p0-0"]})  # acknowledged offsets do not hold their values
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    kinds = {e["value"]: e["kind"] for e in result["anomalies"]["lost-write"]["examples"]}
    assert kinds == {"p0-0": "overwritten", "p0-1": "overwritten"}
    assert flagged(result)["inconsistent-offsets"] == 2  # the acks disagree with the log
    assert "unseen" not in flagged(result)  # both were read, just not where acknowledged


def test_lost_write_moved_to_another_offset() -> None:
    """Offset 1 is empty in the final log (no record there) and the value sits at 2."""
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1)
    h.add(FINAL, OK, "final-read", values=[(P0, 0, "p0-0", 0), (P0, 2, "p0-1", 0)])
    h.add(FINAL, OK, "final-read-end", ends={P0: 3}, extra={"complete": {P0: True}})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"lost-write": 1}
    lost = first(result, "lost-write")
    assert (lost["value"], lost["kind"], lost["found-at"]) == ("p0-1", "moved", [[P0, 2]])


def assert_unchecked(h: H, because: str) -> None:
    """Nothing flagged, the verdict unknown, and an unchecked note saying `because`."""
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {}
    assert result["valid"] == "unknown"
    assert any(because in u for u in result["unchecked"])


def test_lost_write_not_judged_where_the_final_read_did_not_reach() -> None:
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1)
    h.final({P0: ["p0-0"]}, ends={P0: 2}, complete=False)
    assert_unchecked(h, "final read did not reach")


def test_a_final_read_without_end_offsets_leaves_lost_writes_unchecked() -> None:
    h = H()
    h.send(0, "p0-0", P0, 0)
    h.add(FINAL, INFO, "final-read-end", error="no end offsets")
    assert_unchecked(h, "did not reach the end of partition(s) [0]")


def test_without_a_final_read_lost_writes_are_unchecked() -> None:
    h = H()
    h.send(0, "p0-0", P0, 0)
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert result["valid"] == "unknown"
    assert any("no final read" in u for u in result["unchecked"])


# ------------------------------------------------------------------ unseen


def test_unseen_acknowledged_value_no_consumer_read_though_it_caught_up() -> None:
    """Rule unseen: every acknowledged value is read by someone who read past it. No
    final read: the consumer caught up with offset 3 and never saw p0-1."""
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1).send(0, "p0-2", P0, 2)
    h.seek(10, P0).poll(10, (P0, 0, "p0-0")).poll(10, (P0, 2, "p0-2"))
    h.caught_up(10, {P0: 3})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result)["unseen"] == 1
    assert first(result, "unseen") == {"value": "p0-1", "partition": P0, "offset": 1}
    assert result["valid"] is False


def test_unseen_not_flagged_when_no_read_went_past_it() -> None:
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1)
    h.seek(10, P0).poll(10, (P0, 0, "p0-0"))  # never caught up
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert "unseen" not in flagged(result)


# ------------------------------------------------------------------ duplicates, offsets


def test_duplicate_one_value_at_two_offsets() -> None:
    """Rule duplicate: with idempotence a value is written once; a retried batch
    written twice fails the run."""
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1)
    h.final({P0: ["p0-0", "p0-1", "p0-1"]})  # a retried batch written twice
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"duplicate": 1}
    example = first(result, "duplicate")
    assert (example["value"], example["at"]) == ("p0-1", [[P0, 1], [P0, 2]])
    assert example["send"] == {
        "value": "p0-1",
        "process": 0,
        "invoke": 2,
        "ok": 3,
        "status": OK,
        "idempotent": True,
    }
    assert result["valid"] is False


def test_without_idempotence_a_retried_batch_is_expected_not_failing() -> None:
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 2)  # the retry's ack: offset 2
    h.final({P0: ["p0-0", "p0-1", "p0-1"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS, idempotent=False)
    assert flagged(result) == {}
    assert result["valid"] is True
    assert result["expected"] == {"duplicate": 1}
    assert result["expected-examples"]["duplicate"][0]["at"] == [[P0, 1], [P0, 2]]
    assert check(h.ops, replicas=CLEAN_REPLICAS)["valid"] is False  # idempotent: a bug


def test_an_idempotent_producers_duplicate_fails_though_the_run_was_told_otherwise() -> None:
    """Rule duplicate: a value of an idempotent producer is never written twice, and the
    producer's own producer-start event (it got a producer id) says what it was. Issue
    13 item 9(b): a run told "no idempotence" used idempotent producers (the client's
    default at acks=all), filed this duplicate as an expected retry and passed."""
    h = H()
    h.producer_start(0, requested=True, producer_id=7)
    h.send(0, "p0-0", P0, 0, session=0).send(0, "p0-1", P0, 2, session=0)
    h.final({P0: ["p0-0", "p0-1", "p0-1"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS, idempotent=False)
    assert flagged(result) == {"duplicate": 1}, summary(result)
    assert result["valid"] is False
    assert first(result, "duplicate")["send"]["idempotent"] is True
    assert result["stats"]["idempotent-sessions"] == 1
    assert any("told idempotence is off" in u for u in result["unchecked"])


def test_without_idempotence_the_same_duplicate_is_an_expected_retry() -> None:
    """Without idempotence (producer id -1: it never sent InitProducerId) the same
    history is a retry after a lost answer: expected, not failing."""
    h = H()
    h.producer_start(0, requested=False, producer_id=-1)
    h.send(0, "p0-0", P0, 0, session=0).send(0, "p0-1", P0, 2, session=0)
    h.final({P0: ["p0-0", "p0-1", "p0-1"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS, idempotent=False)
    assert result["valid"] is True, summary(result)
    assert result["expected"] == {"duplicate": 1}
    assert result["stats"]["producer-sessions"] == 1
    assert result["stats"]["idempotent-sessions"] == 0


def test_without_idempotence_a_copy_in_another_partition_is_no_retry() -> None:
    """Rule duplicate (no idempotence): a retry writes to the partition the record was
    sent to; a copy elsewhere fails the run."""
    h = H()
    h.producer_start(0, requested=False, producer_id=-1)
    h.send(0, "p0-0", P0, 0, session=0)
    h.final({P0: ["p0-0"], P1: ["p0-0"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS, idempotent=False)
    assert flagged(result) == {"duplicate": 1}


def test_without_idempotence_copies_away_from_the_acknowledged_offset_are_no_retry() -> None:
    """Rule duplicate (no idempotence): the acknowledged attempt is one of the copies;
    two copies while a read shows another value at the acknowledged offset fail (the
    loss is reported too)."""
    h = H()
    h.producer_start(0, requested=False, producer_id=-1)
    h.send(0, "p0-0", P0, 2, session=0)
    h.send(1, "x", P0, None, status=INFO)
    h.final({P0: ["p0-0", "p0-0", "x"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS, idempotent=False)
    assert flagged(result) == {"duplicate": 1, "lost-write": 1, "inconsistent-offsets": 1}


def test_an_indeterminate_send_is_at_one_offset_at_most() -> None:
    """Rule duplicate (indeterminate sends): a timed-out send may or may not be in the
    log, never counted lost; if it is there, it is there once."""
    h = H()
    h.producer_start(0, requested=True, producer_id=3)
    h.send(0, "p0-0", P0, None, status=INFO, session=0)
    h.send(5, "p5-0", P0, 2, session=0)
    h.final({P0: ["p0-0", "p0-0", "p5-0"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"duplicate": 1}
    assert first(result, "duplicate")["send"]["status"] == INFO
    h = H()
    h.send(0, "p0-0", P0, None, status=INFO).send(5, "p5-0", P0, 0)
    h.final({P0: ["p5-0"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {} and result["valid"] is True  # absent: fine, not lost


def test_producers_not_what_the_run_was_told_make_the_verdict_unknown() -> None:
    """A run told "idempotent" whose producer fell back to no idempotence did not test
    idempotence: "unknown", and the summary's first line says why."""
    h = clean()
    h.producer_start(0, requested=True, producer_id=-1)
    result = check(h.ops, replicas=CLEAN_REPLICAS, idempotent=True)
    assert flagged(result) == {}
    assert result["valid"] == "unknown"
    first_line = summary(result).splitlines()[0]
    assert first_line.startswith('valid: "unknown" because the run was told idempotence is on')
    assert "session 0: enable_idempotence=True, producer id -1" in first_line


def test_a_run_without_acknowledged_writes_is_unknown_and_says_why() -> None:
    """Issue 13 item 9(c): runs that could not write ended "unknown" with no reason."""
    h = H()
    h.send(0, "p0-0", P0, None, status=FAIL).send(0, "p0-1", P0, None, status=INFO)
    h.final({P0: []}, ends={P0: 0})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert result["valid"] == "unknown"
    assert summary(result).splitlines()[0] == (
        'valid: "unknown" because no send was acknowledged (2 invoked): lost-write and '
        "unseen had nothing to check"
    )


def test_without_idempotence_a_duplicate_across_partitions_still_fails() -> None:
    h = H()
    h.send(0, "p0-0", P0, 0)
    h.final({P0: ["p0-0"], P1: ["p0-0"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS, idempotent=False)
    assert flagged(result) == {"duplicate": 1}


def test_duplicate_across_partitions_and_reads() -> None:
    h = H()
    h.send(0, "p0-0", P0, 0)
    h.seek(10, P1).poll(10, (P1, 0, "p0-0"))
    h.final({P0: ["p0-0"], P1: ["p0-0"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert first(result, "duplicate")["at"] == [[P0, 0], [P1, 0]]


def test_inconsistent_offsets_two_consumers_read_two_values_at_one_offset() -> None:
    h = H()
    h.send(0, "p0-0", P0, None, status=INFO).send(5, "p5-0", P0, None, status=INFO)
    h.seek(10, P0).seek(11, P0)
    h.poll(10, (P0, 0, "p0-0")).poll(11, (P0, 0, "p5-0"))
    h.final({P0: ["p5-0"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"inconsistent-offsets": 1}
    assert first(result, "inconsistent-offsets") == {
        "partition": P0,
        "offset": 0,
        "values": ["p0-0", "p5-0"],
        "acknowledged": [],
        "acks": [],
        "read-by": {"p0-0": 7, "p5-0": 9},
        "final": "p5-0",
    }


def test_two_acknowledgements_at_one_offset_are_inconsistent_though_nothing_read_it() -> None:
    """Rule inconsistent-offsets: one offset holds one value, so two sends acknowledged
    at one offset fail the run even when no read reached that offset (the final read
    stopped short, no consumer got there). Issue 13 item 9(a): the acknowledgements
    were kept in a map keyed by offset, the second overwrote the first, and this run
    passed as "unknown"."""
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1).send(1, "p1-0", P0, 1)
    h.final({P0: ["p0-0"]}, ends={P0: 2}, complete=False)
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"inconsistent-offsets": 1}, summary(result)
    assert result["valid"] is False
    example = first(result, "inconsistent-offsets")
    assert (example["partition"], example["offset"]) == (P0, 1)
    assert example["values"] == example["acknowledged"] == ["p0-1", "p1-0"]
    assert example["acks"] == [
        {"value": "p0-1", "process": 0, "invoke": 2, "ok": 3},
        {"value": "p1-0", "process": 1, "invoke": 4, "ok": 5},
    ]


def test_two_acknowledgements_at_one_offset_the_final_log_agrees_with_the_last() -> None:
    """Rule inconsistent-offsets: the final log holding the second value does not hide
    the first acknowledgement (the old map kept only the last one)."""
    h = H()
    h.send(0, "p0-0", P0, 0).send(1, "p1-0", P0, 0)
    h.seek(10, P0).poll(10, (P0, 0, "p1-0")).caught_up(10, {P0: 1})
    h.final({P0: ["p1-0"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result)["inconsistent-offsets"] == 1
    example = first(result, "inconsistent-offsets")
    assert example["acknowledged"] == ["p0-0", "p1-0"]
    assert example["read-by"] == {"p1-0": 6}  # the poll's op index
    assert first(result, "lost-write")["value"] == "p0-0"


def test_inconsistent_offsets_an_acknowledgement_and_a_read_disagree() -> None:
    h = H()
    h.send(0, "p0-0", P0, 0).send(1, "p1-0", P0, 0)  # both acknowledged at offset 0
    h.final({P0: ["p0-0", "p1-0"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result)["inconsistent-offsets"] == 1
    assert first(result, "inconsistent-offsets")["values"] == ["p0-0", "p1-0"]
    assert first(result, "lost-write")["value"] == "p1-0"


# ------------------------------------------------------------------ consumers


def test_nonmonotonic_poll_going_backwards_without_a_seek() -> None:
    """Rule nonmonotonic-poll: without a seek a consumer's offsets of a partition only
    go up."""
    h = clean()
    h.poll(10, (P0, 1, "p0-1"))  # after reading up to 2
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"nonmonotonic-poll": 1}
    example = first(result, "nonmonotonic-poll")
    assert (example["process"], example["partition"], example["offsets"]) == (10, P0, [2, 1])


def test_nonmonotonic_poll_repeating_an_offset_within_one_poll() -> None:
    h = H()
    h.send(0, "p0-0", P0, 0)
    h.seek(10, P0).poll(10, (P0, 0, "p0-0"), (P0, 0, "p0-0"))
    h.final({P0: ["p0-0"]})
    assert flagged(check(h.ops, replicas=CLEAN_REPLICAS)) == {"nonmonotonic-poll": 1}


def test_going_back_after_a_seek_is_fine() -> None:
    h = clean()
    h.seek(10, P0, 1).poll(10, (P0, 1, "p0-1"), (P0, 2, "p0-2"))
    h.seek(10, P1).poll(10, (P1, 0, "p1-0"))
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {}


def test_nonmonotonic_poll_below_the_seek_position() -> None:
    h = clean()
    h.seek(10, P0, 2).poll(10, (P0, 1, "p0-1"))
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"nonmonotonic-poll": 1}
    assert first(result, "nonmonotonic-poll")["offsets"] == [2, 1]


def test_poll_skip_over_offsets_that_exist() -> None:
    """Rule poll-skip: without a seek a consumer never jumps over offsets that exist."""
    h = H()
    for n in range(5):
        h.send(0, f"p0-{n}", P0, n)
    h.seek(10, P0).poll(10, (P0, 0, "p0-0"), (P0, 1, "p0-1")).poll(10, (P0, 4, "p0-4"))
    h.final({P0: [f"p0-{n}" for n in range(5)]})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"poll-skip": 1}
    skip = first(result, "poll-skip")
    assert skip["offsets"] == [1, 4]
    assert skip["skipped"] == 2 and skip["first-skipped"] == [2, 3]


def test_poll_skip_at_the_first_read_after_a_seek_to_the_beginning() -> None:
    h = H()
    for n in range(3):
        h.send(0, f"p0-{n}", P0, n)
    h.seek(10, P0).poll(10, (P0, 2, "p0-2"))
    h.final({P0: ["p0-0", "p0-1", "p0-2"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"poll-skip": 1}
    assert first(result, "poll-skip")["first-skipped"] == [0, 1]


def test_a_gap_where_no_offset_exists_is_not_a_skip() -> None:
    """Offsets 2 and 3 were never written anywhere (say, control batches)."""
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1).send(0, "p0-4", P0, 4)
    h.seek(10, P0).poll(10, (P0, 0, "p0-0"), (P0, 1, "p0-1"), (P0, 4, "p0-4"))
    h.add(FINAL, OK, "final-read", values=[(P0, 0, "p0-0", 0), (P0, 1, "p0-1", 0)])
    h.add(FINAL, OK, "final-read", values=[(P0, 4, "p0-4", 0)])
    h.add(FINAL, OK, "final-read-end", ends={P0: 5}, extra={"complete": {P0: True}})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {}


def test_a_skip_found_through_another_consumers_reads() -> None:
    """The final read is unavailable, but consumer 11 read offset 1."""
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1).send(0, "p0-2", P0, 2)
    h.seek(10, P0).seek(11, P0)
    h.poll(11, (P0, 0, "p0-0"), (P0, 1, "p0-1"), (P0, 2, "p0-2"))
    h.poll(10, (P0, 0, "p0-0"), (P0, 2, "p0-2"))
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"poll-skip": 1}


def test_nonmonotonic_send() -> None:
    h = H()
    h.send(0, "p0-0", P0, 5).send(0, "p0-1", P0, 3)
    h.final({P0: ["x"] * 3 + ["p0-1", "y", "p0-0"]})
    for v in ("x", "y"):
        h.add(9, INVOKE, "send", value=v, partition=P0)
        h.add(9, INFO, "send", value=v)
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result)["nonmonotonic-send"] == 1
    assert first(result, "nonmonotonic-send")["offsets"] == [5, 3]


def test_unexpected_values() -> None:
    h = H()
    h.send(0, "p0-0", P0, None, status=FAIL)  # definitely not sent...
    h.seek(10, P0).poll(10, (P0, 0, "p0-0"), (P0, 1, "ghost"))  # ...yet read
    h.final({P0: ["p0-0", "ghost"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"unexpected-value": 2}
    sends = {e["value"]: e["send"] for e in result["anomalies"]["unexpected-value"]["examples"]}
    assert sends == {"p0-0": "fail", "ghost": None}


# ------------------------------------------------------------------ replicas


def test_replica_divergence_below_the_high_watermark() -> None:
    """Rule replica-divergence: below the lower high watermark of two replicas their
    batches are identical."""
    other = [[0, 1, 0, 111], [2, 2, 1, 999], [3, 3, 1, 333]]  # another batch at 2
    replicas = replicas_of({P0: {1: SAME, 2: SAME, 3: other}}, {P0: 4})
    result = check(clean().ops, replicas=replicas)
    assert flagged(result) == {"replica-divergence": 2}  # 1-3 and 2-3
    assert result["valid"] is False
    example = first(result, "replica-divergence")
    assert example["partition"] == P0 and example["brokers"] == [1, 3]
    assert example["first-difference"] == {"1": [2, 2, 0, 222], "3": [2, 2, 1, 999]}


def test_replica_divergence_in_batch_boundaries() -> None:
    split = [[0, 0, 0, 10], [1, 1, 0, 11], [2, 2, 0, 222], [3, 3, 1, 333]]
    result = check(clean().ops, replicas=replicas_of({P0: {1: SAME, 2: split}}, {P0: 4}))
    assert flagged(result) == {"replica-divergence": 1}


def test_replica_missing_a_committed_batch_diverges() -> None:
    short = SAME[:1] + SAME[2:]  # lost the batch at offset 2, has 3
    result = check(clean().ops, replicas=replicas_of({P0: {1: SAME, 2: short}}, {P0: 4}))
    assert flagged(result) == {"replica-divergence": 1}


def test_differences_above_the_high_watermark_are_not_divergence() -> None:
    """An uncommitted tail (above a replica's HW) may differ: it gets truncated."""
    tail_a = [*SAME, [4, 6, 1, 444]]
    tail_b = [*SAME, [4, 5, 2, 555]]
    logs = replicas_of({P0: {1: tail_a, 2: tail_b}}, {P0: 4})
    assert flagged(check(clean().ops, replicas=logs)) == {}
    # A lagging replica (lower HW, shorter log) is compared on what it has.
    logs = replicas_of({P0: {1: SAME, 2: SAME[:2]}}, {P0: 4})
    logs["partitions"]["0"]["2"]["high_watermark"] = 3
    assert flagged(check(clean().ops, replicas=logs)) == {}


def test_replica_errors_are_reported_as_unchecked() -> None:
    logs = dict(CLEAN_REPLICAS, errors=["broker 3 partition 0: ConnectionRefusedError()"])
    result = check(clean().ops, replicas=logs)
    assert result["valid"] == "unknown"
    assert any("broker 3 partition 0" in u for u in result["unchecked"])


# ------------------------------------------------------------------ truncation (unclean)


def unclean_history(report: int | None, *, caught_up: bool = True) -> H:
    """Consumer 10 read a0..a4; an unclean election kept a0..a2 and wrote b3..b5.
    `report`: the divergent offset the consumer was told (None: never told)."""
    h = H()
    for n in range(5):
        h.send(0, f"a{n}", P0, n)
    h.seek(10, P0).poll(10, *[(P0, n, f"a{n}") for n in range(5)])
    for n in range(3, 6):
        h.send(1, f"b{n}", P0, n)
    if report is not None:
        h.truncation(10, P0, report)
        h.poll(10, *[(P0, n, f"b{n}") for n in range(report, 6)] if report >= 3 else [])
    if caught_up:
        h.caught_up(10, {P0: 6})
    h.final({P0: ["a0", "a1", "a2", "b3", "b4", "b5"]})
    return h


def test_unclean_truncation_reported_at_the_divergence_is_valid() -> None:
    result = check(unclean_history(3).ops, replicas=CLEAN_REPLICAS, unclean=True)
    assert result["valid"] is True, summary(result)
    # The lost acknowledged writes are documented behaviour, reported as expected:
    assert result["expected"] == {"lost-write": 2, "inconsistent-offsets": 2}
    assert result["stats"]["truncations-reported"] == 1


def test_without_unclean_the_same_loss_is_invalid() -> None:
    result = check(unclean_history(3).ops, replicas=CLEAN_REPLICAS, unclean=False)
    assert result["valid"] is False
    assert set(result["anomaly-types"]) == {"lost-write", "inconsistent-offsets"}


def test_acks_1_with_followers_may_lose_what_the_failover_did_not_carry() -> None:
    """acks=1 on a replicated topic: the leader acknowledged p0-1 alone and a failover
    dropped it (no consumer read it, it was above the high watermark): expected with
    leader_only_acks, a failure otherwise."""
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1).send(1, "p1-0", P0, 1)
    h.final({P0: ["p0-0", "p1-0"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS, leader_only_acks=True)
    assert result["valid"] is True, summary(result)
    assert result["expected"] == {"lost-write": 1, "unseen": 1, "inconsistent-offsets": 1}
    assert check(h.ops, replicas=CLEAN_REPLICAS)["valid"] is False


def test_unclean_offsets_reused_by_the_same_producer_are_expected() -> None:
    h = H()
    h.send(0, "a0", P0, 0).send(0, "a1", P0, 1).send(0, "b1", P0, 1)  # a1 truncated away
    h.final({P0: ["a0", "b1"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS, unclean=True)
    assert result["valid"] is True, summary(result)
    assert result["expected"]["nonmonotonic-send"] == 1
    assert check(h.ops, replicas=CLEAN_REPLICAS)["anomalies"]["nonmonotonic-send"]["count"] == 1


def test_truncation_reported_at_the_wrong_offset() -> None:
    result = check(unclean_history(4).ops, replicas=CLEAN_REPLICAS, unclean=True)
    assert result["valid"] is False
    mismatch = first(result, "truncation-offset-mismatch")
    assert (mismatch["reported"], mismatch["expected"]) == (4, 3)
    assert "above" in mismatch["why"]
    result = check(unclean_history(2).ops, replicas=CLEAN_REPLICAS, unclean=True)
    mismatch = first(result, "truncation-offset-mismatch")
    assert (mismatch["reported"], mismatch["expected"]) == (2, 3)
    assert "below" in mismatch["why"]


def test_truncation_reported_where_nothing_was_lost() -> None:
    h = clean()
    h.truncation(10, P0, 1)
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"truncation-offset-mismatch": 1}
    assert first(result, "truncation-offset-mismatch")["expected"] is None


def test_unclean_a_read_of_the_truncated_lineage_is_no_duplicate() -> None:
    """An unclean election truncated a3 (read at 3); the producer's retry wrote it again
    at 4 of the new lineage. The consumer was told at 3: valid with unclean election
    (the truncation checks judge the old read), a duplicate without."""
    h = H()
    for n in range(4):
        h.send(0, f"a{n}", P0, n)
    h.seek(10, P0).poll(10, *[(P0, n, f"a{n}") for n in range(4)])
    h.send(1, "b3", P0, 3)
    h.truncation(10, P0, 3)
    h.poll(10, (P0, 3, "b3"), (P0, 4, "a3")).caught_up(10, {P0: 5})
    h.final({P0: ["a0", "a1", "a2", "b3", "a3"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS, unclean=True)
    assert result["valid"] is True, summary(result)
    assert "duplicate" not in result["expected"]
    result = check(h.ops, replicas=CLEAN_REPLICAS, unclean=False)
    assert flagged(result)["duplicate"] == 1


def test_unclean_a_duplicate_in_the_final_log_still_fails() -> None:
    h = H()
    h.send(0, "a0", P0, 0).send(0, "a1", P0, 1)
    h.final({P0: ["a0", "a1", "a1"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS, unclean=True)
    assert flagged(result) == {"duplicate": 1}


def test_a_too_high_report_followed_by_a_deeper_one_is_fine() -> None:
    """Two unclean elections: the consumer is told 4 (right for the lineage of the
    moment), then 3 when the log is cut deeper; only the final lineage is known."""
    h = H()
    for n in range(5):
        h.send(0, f"a{n}", P0, n)
    h.seek(10, P0).poll(10, *[(P0, n, f"a{n}") for n in range(5)])
    h.truncation(10, P0, 4)
    h.truncation(10, P0, 3)
    for n in range(3, 5):
        h.send(1, f"b{n}", P0, n)
    h.poll(10, (P0, 3, "b3"), (P0, 4, "b4")).caught_up(10, {P0: 5})
    h.final({P0: ["a0", "a1", "a2", "b3", "b4"]})
    result = check(h.ops, replicas=CLEAN_REPLICAS, unclean=True)
    assert flagged(result).get("truncation-offset-mismatch", 0) == 0
    assert result["valid"] is True, summary(result)


def test_unreported_truncation() -> None:
    """Rule unreported-truncation: a consumer that caught up and still holds records the
    final log replaced must have been told (LogTruncationError)."""
    result = check(unclean_history(None).ops, replicas=CLEAN_REPLICAS, unclean=True)
    assert result["valid"] is False
    assert first(result, "unreported-truncation") == {
        "process": 10,
        "partition": P0,
        "offset": 3,
        "read": "a3",
        "final": "b3",
    }


def test_unreported_truncation_needs_a_consumer_that_caught_up() -> None:
    result = check(
        unclean_history(None, caught_up=False).ops, replicas=CLEAN_REPLICAS, unclean=True
    )
    assert "unreported-truncation" not in flagged(result)
    assert result["valid"] == "unknown"
    assert any("did not catch up" in u for u in result["unchecked"])


# ------------------------------------------------------------------ consumer groups


def test_one_partition_delivered_to_two_members_of_a_generation_is_an_overlap() -> None:
    h = H().send(0, "a", P0, 0).send(0, "b", P0, 1).send(0, "c", P0, 2)
    h.assigned(10, 4, P0, 0).member_poll(10, 4, "m-1", (P0, 0, "a"))
    h.assigned(11, 4, P0, 1).member_poll(11, 4, "m-2", (P0, 1, "b"), (P0, 2, "c"))
    h.final({P0: ["a", "b", "c"]})
    result = check(h.ops)
    assert flagged(result) == {"group-overlap": 1}
    (example,) = result["anomalies"]["group-overlap"]["examples"]
    assert (example["generation"], example["partition"]) == (4, P0)
    assert example["members"] == ["m-1", "m-2"]


def test_a_partition_moving_between_generations_is_no_overlap() -> None:
    """Generation 4's owner hands partition 0 over (commit on revoke); generation 5's
    owner starts at the commit, past what the first read: no overlap, no skip."""
    h = H().send(0, "a", P0, 0).send(0, "b", P0, 1).send(0, "c", P0, 2)
    h.assigned(10, 4, P0, 0).member_poll(10, 4, "m-1", (P0, 0, "a"), (P0, 1, "b"))
    h.revoke(10, P0)
    h.assigned(11, 5, P0, 2).member_poll(11, 5, "m-2", (P0, 2, "c"))
    # Given back to the first member later, at the second's commit: a seek, not a skip.
    h.revoke(11, P0).assigned(10, 6, P0, 3)
    h.final({P0: ["a", "b", "c"]})
    assert flagged(check(h.ops)) == {}


def test_a_revoked_partition_is_no_longer_the_members_to_be_told_of() -> None:
    """A member that lost a partition before it was truncated is not expected to
    report that truncation, even though it caught up on what it owns now."""
    h = H().send(0, "a", P0, 0).send(0, "b", P1, 0)
    h.assigned(10, 1, P0, 0).member_poll(10, 1, "m-1", (P0, 0, "lost"))
    h.revoke(10, P0).assigned(10, 2, P1, 0).member_poll(10, 2, "m-1", (P1, 0, "b"))
    h.caught_up(10, {P1: 1})
    h.final({P0: ["a"], P1: ["b"]})
    counts = flagged(check(h.ops))
    assert "unreported-truncation" not in counts, counts


# ------------------------------------------------------------------ every anomaly at once


def test_every_anomaly_kind_is_reachable_and_independent() -> None:
    """One messy history: each kind is counted; the result names them all."""
    h = H()
    h.send(0, "p0-0", P0, 0).send(0, "p0-1", P0, 1).send(0, "lost", P0, 2)
    h.send(0, "back", P1, 3).send(0, "fwd", P1, 1)  # nonmonotonic-send
    h.send(1, "dup", P1, 0)
    h.seek(10, P0).seek(10, P1)
    h.poll(10, (P0, 0, "p0-0"), (P0, 1, "p0-1"), (P0, 0, "p0-0"))  # nonmonotonic-poll
    h.poll(10, (P1, 0, "dup"), (P1, 3, "back"))  # poll-skip over 1, 2
    h.poll(10, (P1, 4, "ghost"))  # unexpected-value
    h.seek(11, P0).poll(11, (P0, 1, "other"))  # inconsistent-offsets (and unexpected)
    h.truncation(10, P0, 0)  # nothing lost at 0: mismatch
    h.member_poll(12, 3, "m-a", (P0, 0, "p0-0")).member_poll(13, 3, "m-b", (P0, 1, "p0-1"))
    h.final({P0: ["p0-0", "p0-1"], P1: ["dup", "fwd", "dup", "back", "ghost"]})
    replicas = replicas_of({P0: {1: SAME, 2: [[0, 3, 0, 1]]}}, {P0: 4})
    quorum_sample(h, {0: ("leader", 2, 4, 4), 1: ("leader", 2, 4, 4)})  # split brain
    quorum_sample(h, {1: ("leader", 2, 3, 4)})  # the high watermark going back
    logs = metadata(
        v0=voter_log(*AGREED[:3]),  # offset 3 only on voter 1: lost
        v1=voter_log((0, 1, 10), (1, 1, 66), *AGREED[2:]),  # offset 1 differs
        v2=voter_log(*AGREED[:3]),
    )
    result = check(h.ops, replicas=replicas, metadata=logs)
    counts = flagged(result)
    # Every kind the checker knows, so a new kind must be made reachable here too;
    # an unreported truncation needs a consumer that saw none (its own tests above).
    for kind in ANOMALIES:
        if kind != "unreported-truncation":
            assert counts.get(kind, 0) >= 1, (kind, counts)
    assert result["valid"] is False
    text = summary(result)
    assert "valid: false" in text
    for kind in result["anomaly-types"]:
        assert f"  {kind}: e.g." in text


# ------------------------------------------------------------------ history files


def test_history_round_trip_through_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history = History(path)
    for op in clean().ops:
        history.append(
            Op(
                op.process,
                op.type,
                op.f,
                value=op.value,
                values=op.values,
                partition=op.partition,
                offset=op.offset,
                ends=op.ends,
                extra=op.extra,
            )
        )
    history.close()
    loaded = load(path)
    assert [(o.process, o.type, o.f, o.value) for o in loaded] == [
        (o.process, o.type, o.f, o.value) for o in clean().ops
    ]
    assert all(isinstance(p, int) for o in loaded if o.ends for p in o.ends)
    assert check(loaded, replicas=CLEAN_REPLICAS)["valid"] is True
    line = json.loads(path.read_text().splitlines()[0])
    assert set(line) >= {"index", "time", "process", "type", "f"}


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    dump(clean().ops, path)
    with open(path, "a") as fh:
        fh.write('{"index": 99, "process": 0, "ty')
    assert len(load(path)) == len(clean().ops)


def test_malformed_histories_are_refused() -> None:
    h = H()
    h.add(0, INVOKE, "send", value="a", partition=0)
    h.add(0, INVOKE, "send", value="b", partition=0)
    with pytest.raises(ValueError, match="still open"):
        check(h.ops)
    h = H()
    h.send(0, "a", P0, 0).send(1, "a", P0, 1)
    with pytest.raises(ValueError, match="sent twice"):
        check(h.ops)
    h = H()
    h.add(0, OK, "send", value="a", partition=0, offset=0)
    with pytest.raises(ValueError, match="no open invoke"):
        check(h.ops)
    with pytest.raises(ValueError, match="op type"):
        Op(process=0, type="done", f="send")
    h = H()
    h.add(10, INFO, "truncation", partition=0, offset=[3, "", 1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no integer offset"):
        check(h.ops)


# ------------------------------------------------------------------ the controller quorum


def quorum_sample(h: H, voters: dict[int, tuple[str, int, int, int]]) -> None:
    """One DescribeQuorum round: voter -> (role, leader epoch, high watermark, log end)."""
    h.add(
        QUORUM,
        INFO,
        "quorum-sample",
        extra={
            "voters": {
                str(v): {
                    "role": role,
                    "leader_id": v if role == "leader" else -1,
                    "leader_epoch": epoch,
                    "high_watermark": hw,
                    "log_end_offset": end,
                }
                for v, (role, epoch, hw, end) in voters.items()
            }
        },
    )


def voter_log(*entries: tuple[int, int, int], snapshot: list[int] | None = None) -> dict:
    return {"snapshot": snapshot, "entries": [list(e) for e in entries]}


# Three voters that agree on offsets 0-3 (epochs 1, 1, 2, 2).
AGREED = [(0, 1, 10), (1, 1, 11), (2, 2, 12), (3, 2, 13)]


def quorum_history() -> H:
    h = clean()
    quorum_sample(h, {0: ("leader", 1, 2, 2), 1: ("follower", 1, 2, 2), 2: ("follower", 1, 1, 2)})
    quorum_sample(h, {1: ("leader", 2, 4, 4), 2: ("follower", 2, 3, 4)})
    return h


def metadata(**voters: dict) -> dict:
    return {
        "available": True,
        "reason": None,
        "errors": [],
        "voter-count": 3,
        "voters": {k.removeprefix("v"): v for k, v in voters.items()},
        "final": {},
    }


def test_a_quorum_that_agrees_and_keeps_what_it_committed_is_valid() -> None:
    result = check(
        quorum_history().ops,
        replicas=CLEAN_REPLICAS,
        metadata=metadata(
            v0=voter_log(*AGREED),
            v1=voter_log(*AGREED[2:], snapshot=[1, 1]),  # compacted below offset 2
            v2=voter_log(*AGREED, (4, 2, 99)),  # an uncommitted tail: anything goes
        ),
    )
    assert flagged(result) == {}, summary(result)
    assert result["valid"] is True, summary(result)
    quorum = result["stats"]["quorum"]
    assert quorum == {
        "samples": 2,
        "leader-epochs": 2,
        "committed": 4,
        "compared": True,
        "voters": 3,
        "majority": 2,
    }
    assert "controller quorum: 2 samples, 2 leader epoch(s), committed up to offset 4" in (
        summary(result)
    )


def test_two_leaders_of_one_epoch_are_a_split_brain() -> None:
    """Rule quorum-split-brain (election safety: at most one leader per epoch)."""
    h = quorum_history()
    quorum_sample(h, {0: ("leader", 2, 4, 4), 1: ("leader", 2, 4, 4)})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"quorum-split-brain": 1}
    assert first(result, "quorum-split-brain") == {"epoch": 2, "leaders": [0, 1]}


def test_a_leader_high_watermark_going_back_is_flagged() -> None:
    """Rule quorum-hw-regress (the high watermark is monotonic)."""
    h = quorum_history()
    quorum_sample(h, {1: ("leader", 2, 3, 4)})
    result = check(h.ops, replicas=CLEAN_REPLICAS)
    assert flagged(result) == {"quorum-hw-regress": 1}
    assert first(result, "quorum-hw-regress")["high-watermarks"] == [4, 3]


def test_voters_that_differ_below_the_committed_offset_diverge() -> None:
    """Rule metadata-divergence (log matching below the high watermark)."""
    other = [(0, 1, 10), (1, 1, 66), (2, 2, 12), (3, 2, 13)]  # offset 1: other bytes
    result = check(
        quorum_history().ops,
        replicas=CLEAN_REPLICAS,
        metadata=metadata(v0=voter_log(*AGREED), v1=voter_log(*other), v2=voter_log(*AGREED)),
    )
    assert flagged(result) == {"metadata-divergence": 1}
    assert first(result, "metadata-divergence")["offset"] == 1


def test_a_snapshot_of_another_epoch_diverges() -> None:
    """Rule metadata-divergence (a snapshot ends at an entry of its own epoch)."""
    result = check(
        quorum_history().ops,
        replicas=CLEAN_REPLICAS,
        metadata=metadata(
            v0=voter_log(*AGREED),
            v1=voter_log(*AGREED[3:], snapshot=[2, 1]),  # offset 2 is of epoch 2
            v2=voter_log(*AGREED),
        ),
    )
    assert flagged(result) == {"metadata-divergence": 1}
    assert first(result, "metadata-divergence")["snapshot-of"] == 1


def test_committed_metadata_on_a_minority_is_lost() -> None:
    """Rule metadata-lost (a committed entry stays on a majority)."""
    result = check(
        quorum_history().ops,
        replicas=CLEAN_REPLICAS,
        metadata=metadata(
            v0=voter_log(*AGREED[:3]), v1=voter_log(*AGREED), v2=voter_log(*AGREED[:3])
        ),
    )
    assert flagged(result) == {"metadata-lost": 1}
    lost = first(result, "metadata-lost")
    assert (lost["offset"], lost["held-by"], lost["majority"]) == (3, [1], 2)


def test_committed_metadata_replaced_by_a_later_epoch_is_lost() -> None:
    """Rule metadata-lost (leader completeness): offsets 0-1 were reported committed
    in epoch 1 and 2-3 in epoch 2; every voter now holds entries of epoch 3 from
    offset 1 on (they agree, so only the epochs show it)."""
    replaced = [(0, 1, 10), (1, 3, 77), (2, 3, 12), (3, 3, 13)]
    result = check(
        quorum_history().ops,
        replicas=CLEAN_REPLICAS,
        metadata=metadata(
            v0=voter_log(*replaced), v1=voter_log(*replaced), v2=voter_log(*replaced)
        ),
    )
    assert flagged(result) == {"metadata-lost": 3}  # offsets 1, 2 and 3
    lost = first(result, "metadata-lost")
    assert (lost["offset"], lost["committed-in-epoch"]) == (1, 1)
    assert lost["later-epoch-entries"] == {"0": 3, "1": 3, "2": 3}


def test_unreadable_metadata_logs_make_the_verdict_unknown() -> None:
    unavailable = {"available": False, "reason": "no controller's metadata log could be read"}
    result = check(quorum_history().ops, replicas=CLEAN_REPLICAS, metadata=unavailable)
    assert result["valid"] == "unknown"
    assert result["unchecked"] == [
        "metadata check unavailable: no controller's metadata log could be read"
    ]
