"""broker/producer_ids.py: ids come from controller blocks, one fetch at a time, with a
bounded retry that ends in a retriable error."""

from __future__ import annotations

import asyncio

import pytest

from broker.producer_ids import ProducerIdManager, ProducerIdUnavailableError
from broker.rpc import RpcConnectionError
from protocol.errors import ErrorCode
from protocol.messages import AllocateProducerIdsResponse


async def test_ids_come_from_blocks_fetched_once() -> None:
    calls = 0

    async def allocate() -> AllocateProducerIdsResponse:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return AllocateProducerIdsResponse(producer_id_start=100 * calls, producer_id_len=3)

    manager = ProducerIdManager(allocate)
    ids = await asyncio.gather(*(manager.next_id() for _ in range(5)))
    assert sorted(ids) == [100, 101, 102, 200, 201] and calls == 2


async def test_failures_are_retried_a_bounded_number_of_times() -> None:
    answers: list[object] = [
        RpcConnectionError("down"),
        AllocateProducerIdsResponse(error_code=int(ErrorCode.STALE_BROKER_EPOCH)),
        AllocateProducerIdsResponse(producer_id_start=7, producer_id_len=1),
    ]

    async def allocate() -> AllocateProducerIdsResponse:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, AllocateProducerIdsResponse)
        return answer

    manager = ProducerIdManager(allocate, backoff_s=0.001)
    assert await manager.next_id() == 7

    async def down() -> AllocateProducerIdsResponse:
        raise RpcConnectionError("down")

    failing = ProducerIdManager(down, max_attempts=3, backoff_s=0.001)
    with pytest.raises(ProducerIdUnavailableError) as exc:
        await failing.next_id()
    assert exc.value.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
