"""Reads the per-hop trace files (runtime/hop_trace.py) of one `bench latency --trace`
run and breaks the end-to-end latency of the sampled records down by hop, for the
records around the median and for those at or above the 99th percentile.

The hops of an acks=all record, in order (the follower hops are those of the follower
whose append came last: the high watermark waited for it):

    send -> leader.recv -> leader.append -> leader answers the follower's fetch ->
    follower.fetched -> follower.append -> leader.hw (the follower's next fetch) ->
    leader answers the consumer's fetch -> consumer.fetched -> consumer.sees

and beside them the producer's ack: leader.hw -> leader.ack -> producer.ack.
GC pauses and late event-loop wake-ups logged by any process are matched against each
record's [send, seen] interval.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

Key = tuple[str, int, int]  # topic, partition, offset
# A GC pause or late wake-up counts against a record when it is at least this long
# (shorter ones are everywhere on a busy machine and explain no tail).
SIGNIFICANT_PAUSE_NS = 1_000_000

# (label, from hop, to hop); "follower.*" and "leader.fetch.follower" are resolved to
# the gating follower.
SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("send() -> producer writes the Produce", "send", "producer.write"),
    ("written -> leader reads the Produce", "producer.write", "leader.recv"),
    ("leader append", "leader.recv", "leader.append"),
    ("append -> follower's fetch answered", "leader.append", "leader.fetch.follower"),
    ("answer -> follower has it", "leader.fetch.follower", "follower.fetched"),
    ("follower append", "follower.fetched", "follower.append"),
    ("follower's next fetch -> HW moves", "follower.append", "leader.hw"),
    ("HW -> consumer's fetch answered", "leader.hw", "leader.fetch.consumer"),
    ("answer -> consumer has it", "leader.fetch.consumer", "consumer.fetched"),
    ("consumer decode -> poll returns", "consumer.fetched", "consumer.sees"),
)
ACK_SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("HW -> leader answers the Produce", "leader.hw", "leader.ack"),
    ("answer -> producer reads it", "leader.ack", "producer.answer"),
    ("-> the record's future is done", "producer.answer", "producer.ack"),
)


@dataclass
class Trace:
    hops: dict[Key, dict[str, list[tuple[int, str]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    gc: list[tuple[str, int, int, int]] = field(default_factory=list)  # role, gen, start, ns
    lag: list[tuple[str, int, int]] = field(default_factory=list)  # role, start, late ns


def read_traces(directory: Path) -> Trace:
    trace = Trace()
    for path in sorted(directory.glob("*.trace")):
        role = path.stem.rsplit("-", 1)[0]  # broker-2-1234 -> broker-2
        for line in path.read_text().splitlines():
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "hop" and len(parts) == 6:
                key = (parts[2], int(parts[3]), int(parts[4]))
                trace.hops[key][parts[1]].append((int(parts[5]), role))
            elif parts[0] == "gc" and len(parts) == 4:
                trace.gc.append((role, int(parts[1]), int(parts[2]), int(parts[3])))
            elif parts[0] == "lag" and len(parts) == 3:
                trace.lag.append((role, int(parts[1]), int(parts[2])))
    return trace


def resolve_hops(hops: dict[str, list[tuple[int, str]]]) -> dict[str, int] | None:
    """One time per hop of the chain, or None when a hop is missing."""
    out: dict[str, int] = {}
    for hop in ("send", "leader.recv", "leader.append", "leader.hw", "leader.ack"):
        if hop not in hops:
            return None
        out[hop] = min(t for t, _ in hops[hop])
    for hop in (
        "producer.write",
        "producer.answer",
        "producer.ack",
        "leader.fetch.consumer",
        "consumer.fetched",
        "consumer.sees",
    ):
        if hop not in hops:
            return None
        out[hop] = min(t for t, _ in hops[hop])
    appends = hops.get("follower.append")
    if not appends:
        return None
    gate_time, gate_role = max(appends)  # the follower the high watermark waited for
    fetched = [t for t, role in hops.get("follower.fetched", []) if role == gate_role]
    gate_id = gate_role.rsplit("-", 1)[-1]
    answered = [t for t, _ in hops.get(f"leader.fetch.follower-{gate_id}", [])]
    if not fetched or not answered:
        return None
    out["follower.append"] = gate_time
    out["follower.fetched"] = min(fetched)
    out["leader.fetch.follower"] = min(answered)
    return out


def breakdown(trace: Trace, warmup_until_ns: int = 0) -> dict[str, Any]:
    """Per-segment medians for the records around p50 (p45-p55) and at/above p99."""
    records = []
    for hops in trace.hops.values():
        times = resolve_hops(hops)
        if times is not None and times["send"] >= warmup_until_ns:
            records.append(times)
    if len(records) < 20:
        return {"records": len(records), "error": "too few traced records with every hop"}
    records.sort(key=lambda t: t["consumer.sees"] - t["send"])
    n = len(records)
    groups = {
        "p45-p55": records[int(n * 0.45) : max(int(n * 0.55), int(n * 0.45) + 1)],
        ">= p99": records[min(n - 1, int(n * 0.99)) :],
    }
    out: dict[str, Any] = {"records": n, "groups": {}}
    for name, group in groups.items():
        segments = {label: _median_ms(group, a, b) for label, a, b in (*SEGMENTS, *ACK_SEGMENTS)}
        e2e = [(t["consumer.sees"] - t["send"]) / 1e6 for t in group]
        out["groups"][name] = {
            "records": len(group),
            "end_to_end_median_ms": round(statistics.median(e2e), 3),
            "segments_ms": segments,
            "overlapping_gc": _share_overlapping(
                group, [(s, s + d) for _, _, s, d in trace.gc if d >= SIGNIFICANT_PAUSE_NS]
            ),
            "overlapping_loop_lag": _share_overlapping(
                group,
                [(s, s + late) for _, s, late in trace.lag if late >= SIGNIFICANT_PAUSE_NS],
            ),
        }
    out["gc_by_process"] = _pauses_by_role([(r, d) for r, _, _, d in trace.gc])
    out["loop_lag_by_process"] = _pauses_by_role([(r, late) for r, _, late in trace.lag])
    return out


def _median_ms(group: list[dict[str, int]], a: str, b: str) -> float:
    return round(statistics.median((t[b] - t[a]) / 1e6 for t in group), 3)


def _share_overlapping(group: list[dict[str, int]], spans: list[tuple[int, int]]) -> float:
    """Share of the records whose [send, seen] interval overlaps one of `spans`."""
    spans.sort()
    starts = [s for s, _ in spans]
    hit = 0
    for t in group:
        lo, hi = t["send"], t["consumer.sees"]
        # spans starting before `hi`; a pause is at most ~1 s, so look back that far
        i = bisect.bisect_left(starts, hi)
        j = bisect.bisect_left(starts, lo - 1_000_000_000)
        if any(spans[k][1] > lo for k in range(j, i)):
            hit += 1
    return round(hit / len(group), 3) if group else 0.0


def _pauses_by_role(items: list[tuple[str, int]]) -> dict[str, dict[str, float]]:
    by_role: dict[str, list[int]] = defaultdict(list)
    for role, ns in items:
        by_role[role].append(ns)
    return {
        role: {
            "count": len(v),
            "total_ms": round(sum(v) / 1e6, 2),
            "max_ms": round(max(v) / 1e6, 3),
        }
        for role, v in sorted(by_role.items())
    }


def format_breakdown(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"trace: {result['error']} ({result['records']})"
    groups = result["groups"]
    names = list(groups)
    lines = [f"per-hop medians, ms ({result['records']:,} traced records)"]
    width = max(len(label) for label, _, _ in (*SEGMENTS, *ACK_SEGMENTS)) + 2
    lines.append(" " * width + "".join(f"{n:>10}" for n in names))
    for label, _, _ in SEGMENTS:
        cells = "".join(f"{groups[n]['segments_ms'][label]:>10.3f}" for n in names)
        lines.append(f"{label:<{width}}{cells}")
    total = "".join(f"{groups[n]['end_to_end_median_ms']:>10.3f}" for n in names)
    lines.append(f"{'end to end (median of the group)':<{width}}{total}")
    for label, _, _ in ACK_SEGMENTS:
        cells = "".join(f"{groups[n]['segments_ms'][label]:>10.3f}" for n in names)
        lines.append(f"{label:<{width}}{cells}")
    for what, label in (
        ("overlapping_gc", "share during a GC pause >= 1 ms"),
        ("overlapping_loop_lag", "share during a wake-up >= 1 ms late"),
    ):
        cells = "".join(f"{groups[n][what]:>10.0%}" for n in names)
        lines.append(f"{label:<{width}}{cells}")
    for what, rows in (
        ("GC pauses", result["gc_by_process"]),
        ("late loop wake-ups", result["loop_lag_by_process"]),
    ):
        text = "; ".join(
            f"{role} {r['count']} ({r['total_ms']} ms, max {r['max_ms']})"
            for role, r in rows.items()
        )
        lines.append(f"{what}: {text or 'none'}")
    return "\n".join(lines)
