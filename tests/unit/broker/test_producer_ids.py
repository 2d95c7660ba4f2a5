"""broker/producer_ids.py: ids come from controller blocks, one fetch at a time, with a
bounded retry that ends in a retriable error."""

from __future__ import annotations

import asyncio

import pytest

from broker.producer_ids import ProducerIdManager
from broker.producer_ids import ProducerIdUnavailableError
from protocol.errors import ErrorCode
from protocol.messages import AllocateProducerIdsResponse
from runtime.peer_rpc import RpcConnectionError


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


async def test_epoch_bump_keeps_the_id_until_epochs_run_out() -> None:
    """KIP-360: the next epoch of the same id; at the last epoch a new id at 0."""

    async def allocate() -> AllocateProducerIdsResponse:
        return AllocateProducerIdsResponse(producer_id_start=500, producer_id_len=10)

    manager = ProducerIdManager(allocate)
    assert await manager.bump(42, 0) == (42, 1)
    assert await manager.bump(42, 32_765) == (42, 32_766)
    assert await manager.bump(42, 32_766) == (500, 0)  # no epoch left: a new id
    for pid, epoch in ((-1, 0), (42, -1), (42, 40_000)):
        with pytest.raises(ValueError, match="cannot bump"):
            await manager.bump(pid, epoch)
