"""A follower's reconciliation with its leader before it fetches (KIP-101): ask
OffsetsForLeaderEpoch for the end of its latest epoch, truncate to the largest common
epoch, iterate down; and the out-of-range cases (a log start past our end: start over
at the leader's log start; an end below our log start) by ListOffsets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from collections.abc import Iterable
from typing import TypeVar

from broker.answers import MatchedAnswers
from broker.fetch_state import MAX_TRUNCATION_ROUNDS
from broker.fetch_state import PartitionFetchState
from broker.fetch_state import Phase
from broker.storage.epoch_cache import UNDEFINED_EPOCH
from protocol.api import LATEST_TIMESTAMP
from protocol.errors import ErrorCode
from protocol.messages import FetchPartitionResponse
from protocol.messages import ListOffsetsPartition
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsResponse
from protocol.messages import ListOffsetsTopic
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import OffsetForLeaderEpochResponse
from protocol.messages import OffsetForLeaderPartition
from protocol.messages import OffsetForLeaderTopic
from runtime.epoch_lineage import impossible_epoch_answer
from runtime.epoch_lineage import offset_truncation_state
from runtime.peer_rpc import RpcError

# The fetcher's logger: these lines are the fetcher's story.
log = logging.getLogger("broker.fetcher")


Entry = TypeVar("Entry")


def _by_topic(
    states: Iterable[PartitionFetchState], entry: Callable[[PartitionFetchState], Entry]
) -> dict[str, list[Entry]]:
    """One request entry per partition, grouped by topic as the requests list them."""
    topics: dict[str, list[Entry]] = {}
    for s in states:
        topics.setdefault(s.partition.topic, []).append(entry(s))
    return topics


class FollowerTruncation:
    """A follower's reconciliation with its leader before it fetches (KIP-101): ask"""

    async def _truncate(self, states: list[PartitionFetchState]) -> None:
        ask: list[PartitionFetchState] = []
        for s in states:
            if not self._current(s):
                self._prune(s)
                continue
            p = s.partition
            if self.unsafe_hw:
                hw = p.high_watermark
                log.warning(
                    "%s: UNSAFE: truncating to the high watermark %d (LEO %d) instead of "
                    "asking leader %d for the end of epoch %d (pre-KIP-101)",
                    p.name,
                    hw,
                    p.log_end_offset,
                    self.leader_id,
                    p.log.latest_epoch,
                )
                p.truncate_to(hw, reason="UNSAFE truncate to high watermark")
                self._start_fetching(s)
            elif p.log.latest_epoch == UNDEFINED_EPOCH:
                # No epochs: the log holds no batches (every batch carries one), so
                # there is nothing to reconcile.
                self._start_fetching(s)
            else:
                ask.append(s)
        if not ask:
            return
        topics = _by_topic(
            ask,
            lambda s: OffsetForLeaderPartition(
                partition=s.partition.index,
                current_leader_epoch=s.leader_epoch,
                leader_epoch=s.partition.log.latest_epoch,
            ),
        )
        request = OffsetForLeaderEpochRequest(
            replica_id=self.manager.node_id,
            topics=[OffsetForLeaderTopic(topic=t, partitions=ps) for t, ps in topics.items()],
        )
        by_tp = {s.tp: (s, s.partition.log.latest_epoch) for s in ask}
        try:
            resp = await self.client.request(request, timeout_s=self.rpc_timeout_s)
        except RpcError:
            for s in ask:
                s.ready_at = asyncio.get_running_loop().time() + self._backoff(s.failures + 1)
            raise
        assert isinstance(resp, OffsetForLeaderEpochResponse)
        matched = MatchedAnswers(
            by_tp, (((t.topic, r.partition), r) for t in resp.topics for r in t.partitions)
        )
        for (s, asked_epoch), r in matched:
            if not self._current(s) or s.phase is not Phase.TRUNCATING:
                continue
            if s.partition.log.latest_epoch != asked_epoch:
                continue  # the log changed meanwhile: ask again
            code = ErrorCode.of(r.error_code)
            if code != ErrorCode.NONE:
                self._back_off(s, f"OffsetsForLeaderEpoch answered {code.name}")
                continue
            impossible = impossible_epoch_answer(r.leader_epoch, r.end_offset)
            if impossible is not None:
                self._back_off(s, f"OffsetsForLeaderEpoch: {impossible}")
                continue
            self._apply_truncation(s, r.leader_epoch, r.end_offset, asked_epoch)
        for _, (s, _) in matched.unanswered:
            if self._current(s):
                self._back_off(s, "no OffsetsForLeaderEpoch answer for the partition")

    def _apply_truncation(
        self, s: PartitionFetchState, leader_epoch: int, end_offset: int, asked_epoch: int
    ) -> None:
        p = s.partition
        leo = p.log_end_offset
        decision = offset_truncation_state(
            leader_epoch,
            end_offset,
            follower_end_offset_for=lambda e: p.log.epoch_cache.end_offset_for(e, leo),
            follower_leo=leo,
            fetch_offset=leo,
        )
        log.info(
            "%s: leader %d at epoch %d has epoch %d ending at %d for our epoch %d; "
            "truncating to %d (LEO %d)%s",
            p.name,
            self.leader_id,
            s.leader_epoch,
            leader_epoch,
            end_offset,
            asked_epoch,
            decision.offset,
            leo,
            "" if decision.completed else ", then asking again with our next lower epoch",
        )
        p.truncate_to(decision.offset, reason=f"reconciled by epoch with leader {self.leader_id}")
        self.manager.notify(p.tp)
        if decision.completed:
            self._start_fetching(s)
            return
        s.truncation_rounds += 1
        if s.truncation_rounds >= MAX_TRUNCATION_ROUNDS:
            s.truncation_rounds = 0
            self._back_off(s, "truncation does not converge")

    def _start_fetching(self, s: PartitionFetchState) -> None:
        s.phase = Phase.FETCHING
        s.failures = 0
        s.truncation_rounds = 0
        log.info(
            "%s: fetching from broker %d at leader epoch %d from offset %d (latest epoch %d, "
            "HW %d)",
            s.partition.name,
            self.leader_id,
            s.leader_epoch,
            s.partition.log_end_offset,
            s.partition.log.latest_epoch,
            s.partition.high_watermark,
        )

    def _out_of_range(
        self, s: PartitionFetchState, fetch_offset: int, r: FetchPartitionResponse
    ) -> bool:
        p = s.partition
        if r.log_start_offset >= 0 and fetch_offset < r.log_start_offset:
            # Kafka's rule: the leader deleted what we would need; start over at its
            # log start offset.
            log.warning(
                "%s: fetch offset %d is below leader %d's log start %d",
                p.name,
                fetch_offset,
                self.leader_id,
                r.log_start_offset,
            )
            p.truncate_fully_and_start_at(
                r.log_start_offset, reason=f"below leader {self.leader_id}'s log start"
            )
            self.manager.notify(p.tp)
            return False
        s.out_of_range += 1
        if p.log_end_offset == p.log_start_offset and r.log_start_offset >= 0:
            # An empty log past the leader's end: nothing to lose, start at its start.
            p.truncate_fully_and_start_at(
                r.log_start_offset, reason=f"empty log ahead of leader {self.leader_id}"
            )
            self.manager.notify(p.tp)
            return False
        if not self.unsafe_hw and s.out_of_range == 1 and p.log.latest_epoch >= 0:
            log.error(
                "%s: fetch offset %d is past leader %d's log end (epoch %d) after epoch "
                "truncation; reconciling again",
                p.name,
                fetch_offset,
                self.leader_id,
                s.leader_epoch,
            )
            s.phase = Phase.TRUNCATING
            return False
        return True

    async def _reset_to_leader_end(self, states: list[PartitionFetchState]) -> None:
        """Kafka's fetchOffsetAndTruncate: ask the leader for its LEO (ListOffsets as a
        replica) and truncate to it when we are past it."""
        topics = _by_topic(
            states,
            lambda s: ListOffsetsPartition(
                partition_index=s.partition.index,
                current_leader_epoch=s.leader_epoch,
                timestamp=LATEST_TIMESTAMP,
            ),
        )
        request = ListOffsetsRequest(
            replica_id=self.manager.node_id,
            topics=[ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()],
        )
        by_tp = {s.tp: s for s in states}
        resp = await self.client.request(request, timeout_s=self.rpc_timeout_s)
        assert isinstance(resp, ListOffsetsResponse)
        for topic in resp.topics:
            for r in topic.partitions:
                s = by_tp.pop((topic.name, r.partition_index), None)
                if s is None or not self._current(s) or s.phase is not Phase.FETCHING:
                    continue
                code = ErrorCode.of(r.error_code)
                p = s.partition
                if code != ErrorCode.NONE or r.offset < 0:
                    self._back_off(s, f"ListOffsets answered {code.name}")
                    continue
                if r.offset < p.log_end_offset:
                    log.error(
                        "%s: our LEO %d is past leader %d's log end %d; truncating to it "
                        "(the logs may have diverged: an unclean election or an unsafe switch)",
                        p.name,
                        p.log_end_offset,
                        self.leader_id,
                        r.offset,
                    )
                    p.truncate_to(r.offset, reason=f"leader {self.leader_id}'s log end")
                    self.manager.notify(p.tp)
                else:
                    self._back_off(s, "out of range, but the leader has grown since")
        for s in by_tp.values():
            if self._current(s):
                self._back_off(s, "no ListOffsets answer for the partition")
