"""The follower against a leader whose answers lie (the leader's Fetch and
OffsetsForLeaderEpoch handlers rewritten in the in-process cluster). The invariants:
a follower truncates only by an answer a leader could give (never below its high
watermark on nonsense); one partition's bad answer is that partition's error and
back-off, never a stall of the other partitions fetched with it (Kafka's fetcher marks
the one partition failed); and a follower appends no batch of an epoch above its
leader's. Each test failed before its fix (a hostile-leader session, 2026-11-30);
the last one is an honest leader whose log start lies inside a batch.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from replication_harness import LocalCluster
from replication_harness import batch

from protocol.messages import EpochEndOffset
from protocol.messages import FetchRequest
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.record_batch import iter_headers
from protocol.records.batch_headers import stamp


async def test_diverging_epoch_without_an_epoch_does_not_truncate_committed_records(
    tmp_path: Path,
) -> None:
    """A Fetch answer whose diverging epoch has no epoch (-1) but an end offset (0):
    no leader sends it (a divergence names an epoch; Kafka's isDivergingEpoch tests
    the epoch alone). It made the follower truncate its whole log, high watermark 5
    -> 0; now it is not a divergence and the records are appended."""
    c = LocalCluster(tmp_path, ids=(1, 2))
    try:
        await c.create_topic("t", replicas=[1, 2])
        c.start()
        for i in range(5):
            assert (await c.produce(1, f"m{i}".encode())).error_code == 0  # acks=all
        p2 = c.partition(2)
        await c.wait_until(lambda: p2.high_watermark == 5)
        lowest: list[int] = []
        real_truncate = p2.truncate_to

        def noted_truncate(offset: int, *, reason: str) -> None:
            lowest.append(offset)
            real_truncate(offset, reason=reason)

        p2.truncate_to = noted_truncate  # type: ignore[method-assign]
        rm = c.brokers[1].rm
        real_fetch = rm.fetch
        lied: list[bool] = []

        async def lying_fetch(req):  # type: ignore[no-untyped-def]
            resp = await real_fetch(req)
            if req.replica_id == 2 and not lied:
                lied.append(True)
                for topic in resp.responses:
                    for r in topic.partitions:
                        r.diverging_epoch = EpochEndOffset(epoch=-1, end_offset=0)
            return resp

        rm.fetch = lying_fetch  # type: ignore[method-assign]
        assert (await c.produce(1, b"m5", acks=1)).error_code == 0  # wake the long poll
        await c.wait_until(lambda: bool(lied))
        await c.wait_until(lambda: p2.log_end_offset == 6)
        assert not [o for o in lowest if o < 5], (
            f"follower truncated below its high watermark 5: truncate_to{lowest}"
        )
    finally:
        await c.close()


async def test_bad_answer_for_one_partition_does_not_stop_the_others(tmp_path: Path) -> None:
    """A Fetch answer whose diverging epoch for "t" ends at -5 (it raised ValueError
    out of the answer's processing, dropping "u" after it, on every fetch): "u"
    replicates, "t" backs off."""
    c = LocalCluster(tmp_path, ids=(1, 2))
    try:
        await c.create_topic("t", replicas=[1, 2], isr=[1])
        await c.create_topic("u", replicas=[1, 2], isr=[1])
        assert (await c.produce(1, b"t0", acks=1, topic="t")).error_code == 0
        assert (await c.produce(1, b"u0", acks=1, topic="u")).error_code == 0
        rm = c.brokers[1].rm
        real_fetch = rm.fetch

        async def lying_fetch(req: FetchRequest):  # type: ignore[no-untyped-def]
            resp = await real_fetch(req)
            if req.replica_id == 2:
                # "t" first, with a nonsense divergence; "u" answered truthfully.
                resp.responses.sort(key=lambda topic: topic.topic)
                for topic in resp.responses:
                    if topic.topic == "t":
                        for r in topic.partitions:
                            r.diverging_epoch = EpochEndOffset(epoch=0, end_offset=-5)
            return resp

        rm.fetch = lying_fetch  # type: ignore[method-assign]
        c.start()
        await c.wait_until(
            lambda: c.partition(2, "u").log_end_offset == 1,
            timeout=3.0,
            what="u replicated while t's answers are bad",
        )
    finally:
        await c.close()


async def test_bad_offsets_for_leader_epoch_answer_for_one_partition_does_not_stop_the_others(
    tmp_path: Path,
) -> None:
    """The same in reconciliation: an OffsetsForLeaderEpoch end offset of -5 for "t"
    (it raised ValueError out of the truncation round) must leave "u", answered
    correctly in the same response, free to replicate."""
    c = LocalCluster(tmp_path, ids=(1, 2))
    try:
        for node in (1, 2):
            for topic in ("t", "u"):
                lg = c.brokers[node].log_manager.get_or_create_log((topic, 0))
                lg.append_as_leader(batch(b"x"), 0)
        await c.create_topic("t", replicas=[1, 2], isr=[1], leader_epoch=1)
        await c.create_topic("u", replicas=[1, 2], isr=[1], leader_epoch=1)
        rm = c.brokers[1].rm
        real = rm.offsets_for_leader_epoch

        def lying_ofle(req: OffsetForLeaderEpochRequest):  # type: ignore[no-untyped-def]
            resp = real(req)
            resp.topics.sort(key=lambda topic: topic.topic)
            for topic in resp.topics:
                if topic.topic == "t":
                    for r in topic.partitions:
                        r.end_offset = -5
            return resp

        rm.offsets_for_leader_epoch = lying_ofle  # type: ignore[method-assign]
        c.start()
        assert (await c.produce(1, b"u1", acks=1, topic="u")).error_code == 0
        await c.wait_until(
            lambda: c.partition(2, "u").log_end_offset == 2,
            timeout=3.0,
            what="u replicated while t's reconciliation answers are bad",
        )
    finally:
        await c.close()


async def test_batch_from_a_future_epoch_does_not_wedge_the_follower(tmp_path: Path) -> None:
    """A batch stamped with leader epoch 99 by a leader at epoch 1 (the epoch is outside
    the CRC): no honest leader holds one. Appended, it wedged the partition for good
    (every fetch then asked about epoch 99: out of range, "keep your log", back off).
    The follower now refuses it (above its leader's epoch), backs off, and catches up
    with the next answers."""
    c = LocalCluster(tmp_path, ids=(1, 2))
    try:
        await c.create_topic("t", replicas=[1, 2], isr=[1], leader_epoch=1)
        rm = c.brokers[1].rm
        real_fetch = rm.fetch
        lied = []

        async def lying_fetch(req):  # type: ignore[no-untyped-def]
            resp = await real_fetch(req)
            for topic in resp.responses:
                for r in topic.partitions:
                    if len(r.records) and not lied:
                        lied.append(True)
                        buf = bytearray(r.records)
                        for pos, h in iter_headers(buf):
                            stamp(buf, pos, h.base_offset, 99)  # outside the CRC
                        r.records = memoryview(bytes(buf))
            return resp

        rm.fetch = lying_fetch  # type: ignore[method-assign]
        c.start()
        assert (await c.produce(1, b"m0", acks=1)).error_code == 0
        await c.wait_until(lambda: bool(lied))
        for i in range(1, 4):
            assert (await c.produce(1, f"m{i}".encode(), acks=1)).error_code == 0
        await asyncio.sleep(0.1)
        p2 = c.partition(2)
        # The follower must either refuse the batch of epoch 99 (its leader is at 1)
        # or recover from it; it must not stay stuck behind the leader forever.
        await c.wait_until(
            lambda: p2.log_end_offset == 4 and c.partition(1).isr == (1, 2),
            timeout=4.0,
            what=f"follower catch-up (LEO {p2.log_end_offset}, {p2.log.epoch_cache.entries})",
        )
    finally:
        await c.close()


async def test_follower_catches_up_when_the_leaders_log_start_is_inside_a_batch(
    tmp_path: Path,
) -> None:
    """The leader's log start lies inside its first batch (0-9, start 5): an empty
    follower restarts at 5 (out of range), then the leader answers the whole batch
    0-9, which it refused at every fetch (base offset below its log end). As Kafka
    (UnexpectedAppendOffsetException), the empty log restarts at the batch's base and
    appends it (a liveness hole found by a hostile-leader session)."""
    c = LocalCluster(tmp_path, ids=(1, 2))
    try:
        lg = c.brokers[1].log_manager.get_or_create_log(("t", 0))
        lg.append_as_leader(batch(*[f"v{i}".encode() for i in range(10)]), 0)  # 0-9
        lg.append_as_leader(batch(b"v10"), 0)  # 10
        assert lg.delete_records_before(5) == 5  # log start inside batch 0-9
        await c.create_topic("t", replicas=[1, 2], isr=[1], leader=1, leader_epoch=1)
        c.start()
        await c.wait_until(
            lambda: c.partition(2).log_end_offset == 11, timeout=3.0, what="follower caught up"
        )
    finally:
        await c.close()
