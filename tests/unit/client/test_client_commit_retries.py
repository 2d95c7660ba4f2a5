"""commit() / committed() against the in-test broker: partition-level retriable
coordinator errors are retried (with FindCoordinator again when the coordinator may have
moved), bounded by timeout_ms; non-retriable ones raise at once."""

from __future__ import annotations

import time

import pytest
from client_fakes import FakeBroker, StartBroker

from client.consumer import AsyncConsumer
from client.errors import InvalidCommitOffsetSizeError, KafkaTimeoutError
from client.types import OffsetAndMetadata, TopicPartition
from protocol.errors import ErrorCode
from protocol.messages import (
    FindCoordinatorRequest,
    Message,
    OffsetCommitPartitionResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

TP = TopicPartition("t", 0)


@pytest.fixture
async def broker(start_broker: StartBroker) -> FakeBroker:
    return await start_broker(1)


def commit_error(code: ErrorCode) -> OffsetCommitResponse:
    return OffsetCommitResponse(
        topics=[
            OffsetCommitTopicResponse(
                name="t",
                partitions=[OffsetCommitPartitionResponse(partition_index=0, error_code=code)],
            )
        ]
    )


async def test_partition_level_coordinator_errors_are_retried(broker: FakeBroker) -> None:
    errors = iter(
        [
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
            ErrorCode.NOT_COORDINATOR,
            ErrorCode.REQUEST_TIMED_OUT,
        ]
    )

    def flaky(body: Message) -> Message | None:
        code = next(errors, None)
        return None if code is None else commit_error(code)

    broker.overrides[OffsetCommitRequest] = flaky
    async with AsyncConsumer(broker.address, group_id="g", retry_backoff_ms=5) as consumer:
        await consumer.commit({TP: OffsetAndMetadata(7, "m", 3)})
        assert await consumer.committed(TP) == OffsetAndMetadata(7, "m", 3)
    assert len(broker.requests_of(OffsetCommitRequest)) == 4
    # The coordinator was looked up again after NOT_COORDINATOR (and the timeout), not
    # after COORDINATOR_LOAD_IN_PROGRESS.
    assert len(broker.requests_of(FindCoordinatorRequest)) == 3


async def test_fetch_committed_retries_a_loading_coordinator(broker: FakeBroker) -> None:
    loading = iter([True, True])

    def load(body: Message) -> Message | None:
        if next(loading, False):
            return OffsetFetchResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        return None

    broker.overrides[OffsetFetchRequest] = load
    async with AsyncConsumer(broker.address, group_id="g", retry_backoff_ms=5) as consumer:
        assert await consumer.committed(TP) is None
    assert len(broker.requests_of(OffsetFetchRequest)) == 3


async def test_non_retriable_error_raises_at_once(broker: FakeBroker) -> None:
    broker.overrides[OffsetCommitRequest] = lambda body: commit_error(
        ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    )
    async with AsyncConsumer(broker.address, group_id="g", retry_backoff_ms=5) as consumer:
        with pytest.raises(InvalidCommitOffsetSizeError, match="t-0"):
            await consumer.commit({TP: OffsetAndMetadata(1)})
    assert len(broker.requests_of(OffsetCommitRequest)) == 1


async def test_retries_are_bounded_by_timeout_ms(broker: FakeBroker) -> None:
    broker.overrides[OffsetCommitRequest] = lambda body: commit_error(
        ErrorCode.COORDINATOR_NOT_AVAILABLE
    )
    async with AsyncConsumer(broker.address, group_id="g", retry_backoff_ms=20) as consumer:
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError, match="within 300 ms") as raised:
            await consumer.commit({TP: OffsetAndMetadata(1)}, timeout_ms=300)
        assert time.monotonic() - started < 1.0
        assert "COORDINATOR_NOT_AVAILABLE" in str(raised.value)
        with pytest.raises(ValueError, match="timeout_ms"):
            await consumer.commit({TP: OffsetAndMetadata(1)}, timeout_ms=0)
    assert len(broker.requests_of(OffsetCommitRequest)) >= 3
