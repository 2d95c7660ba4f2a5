"""The checker: what the history (plus a final full read and the replicas' logs) proves.

In the manner of Jepsen's Kafka workload (jepsen.tests.kafka), adapted to one topic
with unique values. Inputs: the ops of a history (history.py), whose `final` process
holds the final read of every partition (`final-read` records and a `final-read-end`
with each partition's end offset and whether the read reached it), and optionally the
replica logs (replicas.py: per partition, per broker, the batch headers of
DescribeReplicaLog).

Anomalies (each a count and examples; any of them makes the run invalid). Each rule has
a crafted history in test_checker.py that must fail it:

- lost-write: an acknowledged send whose value is not in the final read at its
  acknowledged offset (missing, moved to another offset, overwritten, or the final log
  ends before that offset);
- unseen: an acknowledged value that no read (poll or final read) ever returned;
- duplicate: one value at two or more offsets (in the reads). A value of an idempotent
  producer must never be written twice; for a producer without idempotence see below;
- inconsistent-offsets: one (partition, offset) holding two values across the reads
  and every acknowledgement (two sends acknowledged at one offset count, whether or
  not anything read them), with the values and the operations;
- nonmonotonic-poll: a consumer's successive records of a partition going backwards
  (or repeating) without a seek in between;
- poll-skip: a consumer jumping over offsets that exist (in the final read or any other
  read) without a seek in between;
- nonmonotonic-send: a producer process's successive acknowledged sends to a partition
  getting offsets that do not increase;
- unexpected-value: a value read that was never sent, or whose send definitely failed;
- replica-divergence: two replicas of a partition whose batches (base offset, last
  offset, leader epoch, CRC) differ below the lower of their high watermarks;
- truncation-offset-mismatch: a consumer told of a log truncation (LogTruncationError)
  at an offset other than where what it had read stopped matching the final log;
- unreported-truncation: a consumer that caught up with the end of the log still holds
  records the final log does not have at those offsets, and was never told;
- group-overlap (consumer groups): one partition delivered to two members of one
  generation (polls carry the member's generation and member id). A partition a
  member was assigned starts at a `seek` to where it starts; one revoked from it is a
  `revoke` event, after which what it held of that partition is no longer its.

The controller quorum (issue 17), from the DescribeQuorum samples taken during the
run (quorum_watch.py) and the voters' metadata logs read after it (`metadata`):

- quorum-split-brain: two controllers that each answered as the leader of one epoch;
- quorum-hw-regress: a leader whose high watermark went back within its epoch;
- metadata-divergence: two voters whose entries at one offset below the committed
  bound (the highest high watermark any leader reported) differ (epoch or bytes), or
  a snapshot whose epoch is not that of the entry it ends at;
- metadata-lost: a committed entry (below a high watermark a leader reported) that
  fewer than a majority of the voters hold at the end (in their log or a snapshot),
  or one replaced by an entry of a later epoch than the leader that reported it
  committed.

Indeterminate sends (`info`: timed out, or never completed) may or may not be in the
log: never counted lost or unseen; if present, at one offset only (else duplicate).

Idempotence is taken from what each producer really was, not only from what the run
was told: every `producer-start` event records the producer id the producer got
(-1: not idempotent). A value sent by an idempotent producer found twice is a
duplicate. A producer without idempotence writes a batch again when it retries after a
lost answer (Kafka's enable.idempotence=false), so its value at several offsets is
reported under `expected` only when that is what a retry can produce: every copy in the
partition it was sent to and, if it was acknowledged, one copy at the acknowledged
offset (the client does not tell which sends it retried). When the producers were not
what the run was told (`idempotent`), the verdict is "unknown" with the reason.

With `unclean=True` (unclean.leader.election.enable on the topic) losing acknowledged
writes is documented behaviour (KIP-101 appendix): lost-write, unseen,
inconsistent-offsets and nonmonotonic-send (new writes reuse the truncated offsets) are
reported under `expected` and do not fail the run; the truncation checks (every
consumer told at the right offset) are the point, and a read of a truncated lineage
(a value the final log holds elsewhere) is not a duplicate. Without unclean election
the same findings fail the run. With `leader_only_acks=True` (acks=1 on a replicated
topic: the leader acknowledges before any follower has the record) a failover may drop
acknowledged records the new leader never got, which no consumer has read (they were
above the high watermark): the same kinds are reported under `expected`.

`valid` is Jepsen's: true, false, or "unknown" when nothing failed but a check could
not run (the reasons are in `unchecked`, and the summary's first line says why: say,
no send was acknowledged, the brokers do not serve DescribeReplicaLog, the final read
did not reach the end, or the producers were not what the run was told).
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from .history import FAIL
from .history import FINAL
from .history import INFO
from .history import INVOKE
from .history import NEMESIS
from .history import OK
from .history import PRODUCER_START
from .history import SEEK_BEGINNING
from .history import Op
from .quorum_watch import QUORUM

ANOMALIES = (
    "lost-write",
    "unseen",
    "duplicate",
    "inconsistent-offsets",
    "nonmonotonic-poll",
    "poll-skip",
    "nonmonotonic-send",
    "unexpected-value",
    "replica-divergence",
    "truncation-offset-mismatch",
    "unreported-truncation",
    "group-overlap",
    "quorum-split-brain",
    "quorum-hw-regress",
    "metadata-divergence",
    "metadata-lost",
)
# Data loss that unclean leader election (or acks=1 with followers) is allowed to cause
# (KIP-101 appendix).
EXPECTED_WITH_UNCLEAN = ("lost-write", "unseen", "inconsistent-offsets", "nonmonotonic-send")
MAX_EXAMPLES = 10


@dataclass
class Anomalies:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ANOMALIES, 0))
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, kind: str, example: dict[str, Any]) -> None:
        assert kind in self.counts, kind
        self.counts[kind] += 1
        if len(self.examples[kind]) < MAX_EXAMPLES:
            self.examples[kind].append(example)


@dataclass
class _Send:
    value: str
    process: int | str
    partition: int | None
    status: str = "pending"  # pending (never completed: like info) | ok | fail | info
    offset: int | None = None
    invoke_index: int = -1
    ok_index: int = -1
    session: int | None = None  # the producer session (producer-start) that sent it

    @property
    def indeterminate(self) -> bool:
        return self.status in (INFO, "pending")

    def op(self) -> dict[str, Any]:
        """The send's operations, for examples."""
        return {
            "value": self.value,
            "process": self.process,
            "invoke": self.invoke_index,
            "ok": self.ok_index,
        }


@dataclass(frozen=True)
class _Session:
    """A producer as it really was (a producer-start event)."""

    number: int
    requested: bool  # the enable_idempotence the workload passed
    producer_id: int  # -1: not idempotent (it never got a producer id)

    @property
    def idempotent(self) -> bool:
        return self.producer_id >= 0


@dataclass
class _Final:
    """The final read of one partition."""

    records: dict[int, str] = field(default_factory=dict)
    end: int | None = None  # the end offset the read aimed for (the high watermark)
    complete: bool = False  # the read reached `end`

    @property
    def upto(self) -> int:
        """Offsets below this were read (contiguously from the first offset)."""
        if self.complete and self.end is not None:
            return self.end
        if not self.records:
            return 0
        offsets = sorted(self.records)
        n = offsets[0]
        for o in offsets:
            if o != n:
                break
            n = o + 1
        return n

    def knows(self, offset: int) -> bool:
        """Whether the final read says for sure what is at `offset`."""
        return offset < self.upto or (self.complete and self.end is not None)

    def value_at(self, offset: int) -> str | None:
        return self.records.get(offset)


def _partition_key(data: Mapping[Any, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in data.items()}


def check(
    ops: Iterable[Op],
    *,
    replicas: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    unclean: bool = False,
    idempotent: bool = True,
    leader_only_acks: bool = False,
) -> dict[str, Any]:
    """Check a history; returns the JSON-able result (see the module doc). `idempotent`
    is what the run was told; each producer's own producer-start event decides how
    its values are judged. `metadata` (quorum_watch.py): the voters' metadata logs;
    None leaves the metadata check out (the quorum samples are still checked)."""
    ops = sorted(ops, key=lambda o: o.index)
    an = Anomalies()
    unchecked: list[str] = []
    stats: dict[str, Any] = defaultdict(int)

    # ------------------------------------------------------------ sends and polls
    sends: dict[str, _Send] = {}
    sessions: dict[int, _Session] = {}
    open_ops: dict[int | str, Op] = {}
    polls_by_process: dict[int | str, list[Op]] = defaultdict(list)  # polls and events, in order
    final: dict[int, _Final] = defaultdict(_Final)
    final_index: dict[tuple[int, int], int] = {}  # (partition, offset) -> final-read op
    final_seen = False
    caught_up: set[int | str] = set()
    # (generation, partition) -> member -> the first poll of it (consumer groups)
    owners: dict[tuple[int, int], dict[str, Op]] = defaultdict(dict)
    nemesis: dict[str, int] = defaultdict(int)
    nemesis_concurrency = 0
    quorum_samples: list[Op] = []

    for op in ops:
        if op.process == QUORUM:
            quorum_samples.append(op)
            continue
        if op.process == NEMESIS:
            if op.type != INVOKE:
                nemesis[f"{op.f}:{'error' if op.error else op.type}"] += 1
                nemesis_concurrency = max(
                    nemesis_concurrency, int((op.extra or {}).get("concurrent", 0))
                )
            continue
        if op.process == FINAL:
            final_seen = True
            if op.f == "final-read" and op.type == OK:
                for p, o, v, *_ in op.values or ():
                    final[p].records[o] = v
                    final_index.setdefault((p, o), op.index)
            elif op.f == "final-read-end":
                complete = _partition_key((op.extra or {}).get("complete", {}))
                for p, end in (op.ends or {}).items():
                    final[p].end = end
                    final[p].complete = bool(complete.get(p, op.type == OK))
            continue
        if op.f == PRODUCER_START:
            facts = op.extra or {}
            session = _Session(
                int(facts["session"]),
                bool(facts.get("enable_idempotence")),
                int(facts.get("producer_id", -1)),
            )
            sessions[session.number] = session
            continue
        if op.f in ("seek", "truncation", "caught-up", "revoke"):
            if op.f in ("seek", "truncation") and not isinstance(op.offset, int):
                raise ValueError(f"{op.f} event {op.index} has no integer offset: {op.offset!r}")
            polls_by_process[op.process].append(op)
            if op.f == "truncation":
                stats["truncations-reported"] += 1
            if op.f == "caught-up":
                caught_up.add(op.process)
            continue
        if op.type == INVOKE:
            if op.process in open_ops:
                raise ValueError(
                    f"process {op.process} invoked op {op.index} with op "
                    f"{open_ops[op.process].index} still open (a malformed history)"
                )
            open_ops[op.process] = op
            if op.f == "send":
                stats["send-invoke"] += 1
                if op.value is None:
                    raise ValueError(f"send invoke {op.index} has no value")
                if op.value in sends:
                    raise ValueError(f"value {op.value!r} sent twice (values must be unique)")
                session_no = (op.extra or {}).get("session")
                sends[op.value] = _Send(
                    op.value,
                    op.process,
                    op.partition,
                    invoke_index=op.index,
                    session=None if session_no is None else int(session_no),
                )
            continue
        invoke = open_ops.pop(op.process, None)
        if invoke is None or invoke.f != op.f:
            raise ValueError(f"completion {op.index} ({op.f} {op.type}) has no open invoke")
        stats[f"{op.f}-{op.type}"] += 1
        if op.f == "send":
            s = sends[invoke.value]  # type: ignore[index]
            s.status = op.type
            if op.type == OK:
                s.partition = op.partition if op.partition is not None else s.partition
                s.offset = op.offset
                s.ok_index = op.index
        elif op.f == "poll" and op.type == OK:
            polls_by_process[op.process].append(op)
            _note_owner(op, owners)
    for op in open_ops.values():
        stats[f"{op.f}-pending"] += 1

    def is_idempotent(s: _Send) -> bool:
        session = sessions.get(s.session) if s.session is not None else None
        return idempotent if session is None else session.idempotent

    _check_sessions(sessions, idempotent, unchecked)

    # Every observation of the log: (partition, offset) -> {value: the first op that
    # read it there}, value -> places.
    read_at: dict[tuple[int, int], dict[str, int]] = defaultdict(dict)
    read_where: dict[str, set[tuple[int, int]]] = defaultdict(set)
    offsets_of: dict[int, set[int]] = defaultdict(set)
    for process_ops in polls_by_process.values():
        for op in process_ops:
            if op.f != "poll":
                continue
            for p, o, v, *_ in op.values or ():
                stats["records-polled"] += 1
                read_at[(p, o)].setdefault(v, op.index)
                read_where[v].add((p, o))
                offsets_of[p].add(o)
    for p, fin in final.items():
        for o, v in fin.records.items():
            stats["records-final"] += 1
            read_at[(p, o)].setdefault(v, final_index.get((p, o), -1))
            read_where[v].add((p, o))
            offsets_of[p].add(o)

    if not final_seen:
        unchecked.append(
            "no final read in the history: lost-write not checked, unseen only as far "
            "as consumers caught up"
        )
    else:
        written = {s.partition for s in sends.values() if s.status == OK}
        short = sorted(p for p in written | set(final) if p is not None and not final[p].complete)
        if short:
            unchecked.append(
                f"final read did not reach the end of partition(s) {short}: lost-write and "
                "unseen checked only below where it got"
            )

    # ------------------------------------------------------------ sends vs the log
    # How far the consumers that caught up read each partition (for unseen).
    caught_up_to: dict[int, int] = defaultdict(lambda: -1)
    for proc in caught_up:
        for op in polls_by_process[proc]:
            if op.f == "caught-up":
                for p, end in (op.ends or {}).items():
                    caught_up_to[p] = max(caught_up_to[p], end)

    # Every acknowledgement of every (partition, offset): two sends acknowledged at
    # one offset are both kept (an anomaly even if nothing read that offset).
    acked_at: dict[tuple[int, int], list[_Send]] = defaultdict(list)
    for s in sends.values():
        if s.status != OK or s.offset is None or s.offset < 0 or s.partition is None:
            continue  # (acks=0 "acknowledges" at offset -1: nothing to check)
        stats["acknowledged"] += 1
        acked_at[(s.partition, s.offset)].append(s)
        fin = final.get(s.partition) if final_seen else None
        if fin is not None and fin.knows(s.offset) and fin.value_at(s.offset) != s.value:
            actual = fin.value_at(s.offset)
            elsewhere = sorted(
                [p, o]
                for p, o in read_where.get(s.value, ())
                if p in final and final[p].records.get(o) == s.value
            )
            if fin.complete and fin.end is not None and s.offset >= fin.end:
                kind = "beyond-end"
            elif actual is not None:
                kind = "overwritten"
            elif elsewhere:
                kind = "moved"
            else:
                kind = "missing"
            an.add(
                "lost-write",
                {
                    "value": s.value,
                    "partition": s.partition,
                    "offset": s.offset,
                    "kind": kind,
                    "final-value": actual,
                    "final-end": fin.end,
                    "found-at": elsewhere,
                },
            )
        # Unseen: nobody read it, though a read went past its offset (the final read,
        # or a consumer that caught up with the end of the log).
        if s.value not in read_where and (
            (fin is not None and (fin.complete or s.offset < fin.upto))
            or s.offset < caught_up_to[s.partition]
        ):
            an.add("unseen", {"value": s.value, "partition": s.partition, "offset": s.offset})
    if not stats["acknowledged"]:
        unchecked.append(
            f"no send was acknowledged ({stats['send-invoke']} invoked): lost-write and "
            "unseen had nothing to check"
        )

    def truncated_lineage(place: tuple[int, int], value: str) -> bool:
        """A read the final log contradicts: under unclean election, of a lineage
        that was truncated (the truncation checks judge it)."""
        p, o = place
        fin = final.get(p)
        return fin is not None and fin.knows(o) and fin.value_at(o) != value

    indeterminate_present = 0
    retry_duplicates = Anomalies()
    for v, places in read_where.items():
        s = sends.get(v)
        if s is None or s.status == FAIL:
            an.add(
                "unexpected-value",
                {
                    "value": v,
                    "at": sorted([p, o] for p, o in places),
                    "send": None if s is None else "fail",
                },
            )
        elif s.indeterminate:
            indeterminate_present += 1
        judged = places
        if unclean and final_seen:
            judged = {pl for pl in places if not truncated_lineage(pl, v)}
        if len(judged) < 2:
            continue
        example: dict[str, Any] = {"value": v, "at": sorted([p, o] for p, o in judged)}
        if s is not None:
            example["send"] = {**s.op(), "status": s.status, "idempotent": is_idempotent(s)}
        if s is not None and not is_idempotent(s) and _retry_can_explain(s, judged, read_at):
            retry_duplicates.add("duplicate", example)
        else:
            an.add("duplicate", example)
    stats["indeterminate-sends-read"] = indeterminate_present

    for p, o in sorted(read_at.keys() | acked_at.keys()):
        reads = read_at.get((p, o), {})
        acks = acked_at.get((p, o), [])
        every = set(reads) | {s.value for s in acks}
        if len(every) > 1:
            an.add(
                "inconsistent-offsets",
                {
                    "partition": p,
                    "offset": o,
                    "values": sorted(every),
                    "acknowledged": sorted(s.value for s in acks),
                    "acks": [s.op() for s in sorted(acks, key=lambda s: s.ok_index)],
                    "read-by": {v: reads[v] for v in sorted(reads)},
                    "final": final[p].records.get(o) if p in final else None,
                },
            )
    # nonmonotonic-send: per process and partition, acknowledged offsets increase.
    by_proc: dict[tuple[int | str, int], list[_Send]] = defaultdict(list)
    for s in sorted(sends.values(), key=lambda s: s.invoke_index):
        if s.status == OK and s.offset is not None and s.offset >= 0 and s.partition is not None:
            by_proc[(s.process, s.partition)].append(s)
    for (proc, p), seq in by_proc.items():
        for a, b in itertools.pairwise(seq):
            assert a.offset is not None and b.offset is not None
            if b.offset <= a.offset:
                an.add(
                    "nonmonotonic-send",
                    {
                        "process": proc,
                        "partition": p,
                        "values": [a.value, b.value],
                        "offsets": [a.offset, b.offset],
                    },
                )

    # ------------------------------------------------------------ consumers
    log_start = {p: min(offs) for p, offs in offsets_of.items() if offs}
    sorted_offsets = {p: sorted(offs) for p, offs in offsets_of.items()}
    for (generation, partition), members in sorted(owners.items()):
        if len(members) > 1:
            an.add(
                "group-overlap",
                {
                    "generation": generation,
                    "partition": partition,
                    "members": sorted(members),
                    "processes": sorted(str(op.process) for op in members.values()),
                    "ops": sorted(op.index for op in members.values()),
                },
            )
    for proc, process_ops in polls_by_process.items():
        _check_consumer(
            proc,
            process_ops,
            an,
            final,
            final_seen,
            log_start,
            sorted_offsets,
            truncation_pending=_later_truncations(process_ops),
            caught_up=proc in caught_up,
            unchecked=unchecked,
        )

    # ------------------------------------------------------------ replicas
    replica_stats = _check_replicas(replicas, an, unchecked)
    quorum_stats = _check_quorum(quorum_samples, metadata, an, unchecked)

    # ------------------------------------------------------------ verdict
    failing = {k: n for k, n in an.counts.items() if n > 0}
    expected: dict[str, Any] = {}
    expected_examples: dict[str, list[dict[str, Any]]] = {}
    if retry_duplicates.counts["duplicate"]:
        expected["duplicate"] = retry_duplicates.counts["duplicate"]
        expected_examples["duplicate"] = retry_duplicates.examples["duplicate"]
    if unclean or leader_only_acks:
        for kind in EXPECTED_WITH_UNCLEAN:
            if kind in failing:
                expected[kind] = failing.pop(kind)
                expected_examples[kind] = an.examples.get(kind, [])
    if failing:
        valid: bool | str = False
    elif unchecked:
        valid = "unknown"
    else:
        valid = True
    stats = dict(stats)
    stats["nemesis"] = dict(nemesis)
    stats["nemesis-max-concurrent"] = nemesis_concurrency
    stats["producer-sessions"] = len(sessions)
    stats["idempotent-sessions"] = sum(1 for s in sessions.values() if s.idempotent)
    stats["replicas"] = replica_stats
    stats["quorum"] = quorum_stats
    return {
        "valid": valid,
        "anomaly-types": sorted(failing),
        "anomalies": {
            kind: {"count": an.counts[kind], "examples": an.examples.get(kind, [])}
            for kind in ANOMALIES
        },
        "expected": expected,
        "expected-examples": expected_examples,
        "unchecked": unchecked,
        "stats": stats,
        "options": {
            "unclean": unclean,
            "idempotent": idempotent,
            "leader-only-acks": leader_only_acks,
        },
    }


def _note_owner(op: Op, owners: dict[tuple[int, int], dict[str, Op]]) -> None:
    """A group member's poll: the partitions it was delivered in its generation."""
    extra = op.extra or {}
    generation, member = extra.get("generation"), extra.get("member")
    if generation is None or member is None or int(generation) < 0:
        return
    for p, *_ in op.values or ():
        owners[(int(generation), p)].setdefault(str(member), op)


def _retry_can_explain(
    s: _Send, places: set[tuple[int, int]], read_at: Mapping[tuple[int, int], Any]
) -> bool:
    """Whether a producer without idempotence, retrying `s` after lost answers, can
    have written these copies: all in the partition it was sent to and, when it was
    acknowledged, one of them at the acknowledged offset unless no read reached that
    offset (the other attempts' copies may land before or after it)."""
    if s.status == FAIL or s.partition is None:
        return False
    if any(p != s.partition for p, _ in places):
        return False
    acked = (s.partition, s.offset)
    return s.status != OK or acked in places or acked not in read_at


def _check_sessions(sessions: Mapping[int, _Session], told: bool, unchecked: list[str]) -> None:
    """The run must have tested what it says: each producer idempotent exactly when
    the run was told so (else the verdict is "unknown", with the producers named)."""
    wrong = sorted(s.number for s in sessions.values() if s.idempotent != told)
    if not wrong:
        return
    facts = ", ".join(
        f"session {n}: enable_idempotence={sessions[n].requested}, producer id "
        f"{sessions[n].producer_id}"
        for n in wrong[:5]
    )
    unchecked.append(
        f"the run was told idempotence is {'on' if told else 'off'} but {len(wrong)} "
        f"producer session(s) were {'not ' if told else ''}idempotent ({facts}): their "
        "duplicates were judged by what each producer really was"
    )


def _later_truncations(process_ops: list[Op]) -> dict[int, list[int]]:
    """Per partition, the indexes (in process_ops) of its truncation events."""
    out: dict[int, list[int]] = defaultdict(list)
    for i, op in enumerate(process_ops):
        if op.f == "truncation" and op.partition is not None:
            out[op.partition].append(i)
    return out


def _check_consumer(
    proc: int | str,
    process_ops: list[Op],
    an: Anomalies,
    final: Mapping[int, _Final],
    final_seen: bool,
    log_start: Mapping[int, int],
    offsets: Mapping[int, list[int]],
    *,
    truncation_pending: Mapping[int, list[int]],
    caught_up: bool,
    unchecked: list[str],
) -> None:
    import bisect

    last: dict[int, int] = {}  # partition -> last offset read since the last seek
    expect: dict[int, int] = {}  # partition -> where the last seek put the position
    lineage: dict[int, dict[int, str]] = defaultdict(dict)  # what this consumer holds

    def existing_between(p: int, lo: int, hi: int) -> list[int]:
        """Offsets known to exist in [lo, hi)."""
        offs = offsets.get(p, [])
        return offs[bisect.bisect_left(offs, lo) : bisect.bisect_left(offs, hi)]

    def check_next(
        proc: Any, op_index: int, p: int, o: int, *, since: int, want: int, **why: str
    ) -> None:
        """A polled offset `o` where `want` was due (reported against `since`): below
        it the consumer went back; above it, records that exist in between were skipped.
        `why` (below=, skipped=): the words each anomaly carries."""
        report: dict[str, Any] = {"process": proc, "partition": p, "offsets": [since, o]}
        if o < want:
            words = {"why": why["below"]} if "below" in why else {}
            an.add("nonmonotonic-poll", {**report, **words, "op": op_index})
        elif o > want and (gap := existing_between(p, want, o)):
            words = {"why": why["skipped"]} if "skipped" in why else {}
            an.add(
                "poll-skip",
                {**report, **words, "skipped": len(gap), "first-skipped": gap[:5], "op": op_index},
            )

    def first_divergence(p: int) -> int | None:
        fin = final.get(p)
        if not final_seen or fin is None:
            return None
        for o in sorted(lineage[p]):
            if fin.knows(o) and fin.value_at(o) != lineage[p][o]:
                return o
        return None

    for i, op in enumerate(process_ops):
        if op.f == "revoke":
            # No longer this member's partition: what it read of it is not its to hold.
            assert op.partition is not None
            lineage[op.partition].clear()
            last.pop(op.partition, None)
            expect.pop(op.partition, None)
            continue
        if op.f == "seek" or op.f == "truncation":
            p = op.partition
            assert p is not None and op.offset is not None
            target = op.offset
            if op.f == "truncation":
                expected = first_divergence(p)
                later = [j for j in truncation_pending.get(p, []) if j > i]
                if expected is None or target < expected or (target > expected and not later):
                    an.add(
                        "truncation-offset-mismatch",
                        {
                            "process": proc,
                            "partition": p,
                            "reported": target,
                            "expected": expected,
                            "why": "nothing this consumer read was lost"
                            if expected is None
                            else (
                                "reported below the divergence (re-delivery)"
                                if target < expected
                                else "reported above the divergence (lost records kept)"
                            ),
                        },
                    )
            if target == SEEK_BEGINNING:
                target = log_start.get(p, 0)
                lineage[p].clear()
            else:
                for o in [o for o in lineage[p] if o >= target]:
                    del lineage[p][o]
            last.pop(p, None)
            expect[p] = target
            continue
        if op.f == "caught-up":
            continue
        # a poll: records per partition in the order returned
        for p, o, v, *_ in op.values or ():
            prev = last.get(p)
            if prev is not None:
                check_next(proc, op.index, p, o, since=prev, want=prev + 1)
            elif p in expect:
                check_next(
                    proc,
                    op.index,
                    p,
                    o,
                    since=expect[p],
                    want=expect[p],
                    below="read below the position it seeked to",
                    skipped="first record after a seek",
                )
            last[p] = o
            expect.pop(p, None)
            lineage[p][o] = v

    # What the consumer still holds must be the final log, once it caught up.
    diverged = [p for p in sorted(lineage) if first_divergence(p) is not None]
    if not diverged:
        return
    if not caught_up:
        unchecked.append(
            f"consumer {proc} did not catch up with the end of the log: truncation "
            f"reporting not checked for partition(s) {diverged}"
        )
        return
    for p in diverged:
        o = first_divergence(p)
        assert o is not None
        an.add(
            "unreported-truncation",
            {
                "process": proc,
                "partition": p,
                "offset": o,
                "read": lineage[p][o],
                "final": final[p].value_at(o),
            },
        )


def _check_replicas(
    replicas: Mapping[str, Any] | None, an: Anomalies, unchecked: list[str]
) -> dict[str, Any]:
    """Below min(HW_a, HW_b) replicas a and b hold identical batches."""
    if replicas is None:
        unchecked.append("replica comparison not run (no replica logs collected)")
        return {"compared": False}
    if not replicas.get("available", False):
        reason = replicas.get("reason") or "unknown reason"
        unchecked.append(f"replica comparison unavailable: {reason}")
        return {"compared": False, "reason": reason}
    for err in replicas.get("errors", []):
        unchecked.append(f"replica log missing: {err}")
    pairs = batches_compared = 0
    for p, by_broker in sorted(_partition_key(replicas.get("partitions", {})).items()):
        brokers = sorted(_partition_key(by_broker).items())
        if len(brokers) < 2:
            continue
        for i, (a_id, a) in enumerate(brokers):
            for b_id, b in brokers[i + 1 :]:
                pairs += 1
                bound = min(a["high_watermark"], b["high_watermark"])
                lower = max(a.get("log_start_offset", 0), b.get("log_start_offset", 0))
                la = [tuple(x) for x in a["batches"] if x[0] >= lower and x[1] < bound]
                lb = [tuple(x) for x in b["batches"] if x[0] >= lower and x[1] < bound]
                batches_compared += max(len(la), len(lb))
                if la == lb:
                    continue
                k = next(
                    (j for j, (x, y) in enumerate(zip(la, lb, strict=False)) if x != y),
                    min(len(la), len(lb)),
                )
                an.add(
                    "replica-divergence",
                    {
                        "partition": p,
                        "brokers": [a_id, b_id],
                        "below": bound,
                        "first-difference": {
                            str(a_id): list(la[k]) if k < len(la) else None,
                            str(b_id): list(lb[k]) if k < len(lb) else None,
                        },
                        "batch-format": "[base offset, last offset, leader epoch, crc]",
                    },
                )
    return {"compared": True, "pairs": pairs, "batches": batches_compared}


def _check_quorum(
    samples: list[Op],
    metadata: Mapping[str, Any] | None,
    an: Anomalies,
    unchecked: list[str],
) -> dict[str, Any]:
    """The controller quorum's rules (see the module doc)."""
    leaders: dict[int, set[int]] = defaultdict(set)  # epoch -> who answered as its leader
    hw_of: dict[tuple[int, int], tuple[int, int]] = {}  # (node, epoch) -> (hw, op index)
    committed: list[tuple[int, int]] = []  # (leader epoch, high watermark) reported
    answers = [(op.index, (op.extra or {}).get("voters", {})) for op in samples]
    if metadata is not None:
        answers.append((-1, metadata.get("final") or {}))  # -1: after the run
    for index, voters in answers:
        for node, state in sorted(_partition_key(voters).items()):
            if state.get("role") != "leader":
                continue
            epoch, hw = int(state["leader_epoch"]), int(state["high_watermark"])
            leaders[epoch].add(node)
            committed.append((epoch, hw))
            before = hw_of.get((node, epoch))
            if before is not None and hw < before[0] and index >= 0:
                an.add(
                    "quorum-hw-regress",
                    {
                        "controller": node,
                        "epoch": epoch,
                        "ops": [before[1], index],
                        "high-watermarks": [before[0], hw],
                    },
                )
            hw_of[(node, epoch)] = (max(hw, before[0]) if before else hw, index)
    for epoch, nodes in sorted(leaders.items()):
        if len(nodes) > 1:
            an.add("quorum-split-brain", {"epoch": epoch, "leaders": sorted(nodes)})
    bound = max((hw for _, hw in committed), default=0)
    stats: dict[str, Any] = {
        "samples": len(samples),
        "leader-epochs": len(leaders),
        "committed": bound,
        "compared": False,
    }
    if metadata is None:
        return stats
    if not metadata.get("available", False):
        unchecked.append(f"metadata check unavailable: {metadata.get('reason') or '?'}")
        return stats
    for err in metadata.get("errors", []):
        unchecked.append(f"metadata log missing: {err}")
    if not committed:
        unchecked.append("metadata check: no controller ever answered as the quorum leader")
    logs = {
        node: ({o: (e, crc) for o, e, crc in v["entries"]}, v.get("snapshot"))
        for node, v in _partition_key(metadata.get("voters", {})).items()
    }
    # The lowest epoch whose leader reported each offset committed: an entry there of
    # a later epoch replaced a committed one.
    committed_in: list[int] = []
    for epoch, hw in sorted(committed):
        committed_in.extend([epoch] * max(0, hw - len(committed_in)))
    majority = int(metadata.get("voter-count", len(logs))) // 2 + 1
    for o in range(bound):
        held = {node: entries[o] for node, (entries, snap) in logs.items() if o in entries}
        covered = [node for node, (_, snap) in logs.items() if snap and o <= snap[0]]
        if len(set(held.values())) > 1:
            an.add(
                "metadata-divergence",
                {
                    "offset": o,
                    "entries": {str(n): list(v) for n, v in sorted(held.items())},
                    "entry-format": "[epoch, crc]",
                },
            )
        later = {str(n): v[0] for n, v in held.items() if v[0] > committed_in[o]}
        if len(held) + len(set(covered) - set(held)) < majority or later:
            an.add(
                "metadata-lost",
                {
                    "offset": o,
                    "committed-in-epoch": committed_in[o],
                    "held-by": sorted(held),
                    "in-snapshot-of": sorted(covered),
                    "later-epoch-entries": later,
                    "majority": majority,
                },
            )
    for node, (_, snap) in sorted(logs.items()):
        if not snap or snap[0] >= bound or snap[1] < 0:
            continue
        others = {n: entries[snap[0]][0] for n, (entries, _) in logs.items() if snap[0] in entries}
        if any(e != snap[1] for e in others.values()):
            an.add(
                "metadata-divergence",
                {"snapshot-of": node, "snapshot": list(snap), "entry-epochs": others},
            )
    stats.update(compared=True, voters=len(logs), majority=majority)
    return stats


# ------------------------------------------------------------------ presentation


def _counts(template: str, stats: dict[str, int], *keys: str) -> str:
    """`template` filled with the named counters (0 where absent)."""
    return template.format(*(stats.get(key, 0) for key in keys))


def summary(result: Mapping[str, Any]) -> str:
    """A few lines for humans; an "unknown" verdict says why on its first line."""
    stats = result.get("stats", {})
    verdict = f"valid: {json.dumps(result['valid'])}"
    unchecked = result.get("unchecked", [])
    if result["valid"] == "unknown":
        why = result.get("error") or (unchecked[0] if unchecked else "?")
        more = f" (+{len(unchecked) - 1} more below)" if len(unchecked) > 1 else ""
        verdict += f" because {why}{more}"
    lines = [
        verdict,
        _counts(
            "sends: {} invoked, {} ok, {} fail, {} info (indeterminate; {} of them read), "
            "{} pending",
            stats,
            "send-invoke",
            "send-ok",
            "send-fail",
            "send-info",
            "indeterminate-sends-read",
            "send-pending",
        ),
        _counts(
            "polls: {} ok, {} fail, {} info; {} records polled; final read: {} records; "
            "truncations reported: {}",
            stats,
            "poll-ok",
            "poll-fail",
            "poll-info",
            "records-polled",
            "records-final",
            "truncations-reported",
        ),
    ]
    if stats.get("producer-sessions"):
        lines.append(
            "producers: {} session(s), {} idempotent (the run was told idempotence is {})".format(
                stats["producer-sessions"],
                stats.get("idempotent-sessions", 0),
                "on" if result.get("options", {}).get("idempotent") else "off",
            )
        )
    nem = stats.get("nemesis") or {}
    if nem:
        lines.append(
            "nemesis: "
            + ", ".join(f"{k} x{v}" for k, v in sorted(nem.items()))
            + f"; at most {stats.get('nemesis-max-concurrent', 0)} fault(s) at once"
        )
    quorum = stats.get("quorum") or {}
    if quorum.get("samples") or quorum.get("compared"):
        lines.append(
            f"controller quorum: {quorum.get('samples', 0)} samples, "
            f"{quorum.get('leader-epochs', 0)} leader epoch(s), committed up to offset "
            f"{quorum.get('committed', 0)}"
            + (
                f"; {quorum['voters']} voters' metadata logs compared"
                if quorum.get("compared")
                else ""
            )
        )
    rep = stats.get("replicas") or {}
    if rep.get("compared"):
        lines.append(f"replicas: {rep['pairs']} replica pairs, {rep['batches']} batches compared")
    counts = {k: v["count"] for k, v in result["anomalies"].items()}
    lines.append("anomalies: " + ", ".join(f"{k} {n}" for k, n in counts.items()))
    for kind in result.get("anomaly-types", []):
        first = result["anomalies"][kind]["examples"][:1]
        lines.append(f"  {kind}: e.g. {json.dumps(first[0]) if first else '?'}")
    if result.get("expected"):
        lines.append(
            "expected (unclean election / acks=1 failover / retries without idempotence): "
            + ", ".join(f"{k} {n}" for k, n in result["expected"].items())
        )
    for reason in unchecked:
        lines.append(f"unchecked: {reason}")
    return "\n".join(lines)
