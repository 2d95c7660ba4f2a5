"""A controller stall fences nobody (controller/liveness.py); issue 13.

Sessions run on an injected clock: `h.run_for(s)` is the controller running (its
liveness loop notes the time every check interval), a bare `clock.advance(s)` is the
controller not running for `s` (SIGSTOP, a pause, a blocked loop).
"""

from __future__ import annotations

from controller.liveness import BrokerSessions


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_after_a_stall_every_live_session_is_renewed_and_nobody_expires() -> None:
    clock = Clock()
    sessions = BrokerSessions(3.0, clock=clock)
    sessions.touch(1, 10)
    sessions.touch(2, 20)
    clock.now += 0.5  # a liveness check on time
    assert sessions.expired([(1, 10), (2, 20)]) == []
    clock.now += 0.2
    sessions.touch(2, 20)  # read between that check and the stall
    clock.now += 10.0  # the controller stalled: both heartbeated during it, unread
    assert sessions.expired([(1, 10), (2, 20)]) == []
    assert sessions.stalls == 1
    # The renewed session proves nothing: no new replicas on it until heard from.
    assert not sessions.heard_from(1, 10)
    sessions.touch(1, 10)  # its queued heartbeat is read
    assert sessions.heard_from(1, 10)
    # Broker 2's heartbeat never comes (it died during the stall): it is fenced one
    # session after the stall, broker 1 (heartbeating) is not.
    stalled_at = clock.now
    while (expired := sessions.expired([(1, 10), (2, 20)])) != [2]:
        assert expired == [] and clock.now - stalled_at < 3.0
        clock.now += sessions.check_interval_s
        sessions.touch(1, 10)
    assert clock.now - stalled_at >= 3.0


def test_a_session_that_ran_out_before_the_stall_is_not_renewed() -> None:
    clock = Clock()
    sessions = BrokerSessions(3.0, clock=clock)
    sessions.touch(1, 10)
    for _ in range(10):  # the controller runs 3.5 s; broker 1 is silent
        clock.now += 0.35
        sessions.observe()
    clock.now += 10.0
    assert sessions.expired([(1, 10)]) == [1]


def test_a_gap_shorter_than_the_stall_threshold_is_no_stall() -> None:
    clock = Clock()
    sessions = BrokerSessions(3.0, clock=clock)
    sessions.touch(1, 10)
    sessions.observe()
    for _ in range(5):
        clock.now += sessions.stall_threshold_s * 0.9  # a late but running loop
        sessions.observe()
    assert sessions.stalls == 0
    assert sessions.expired([(1, 10)]) == [1]


def test_a_controller_that_keeps_stalling_still_fences_a_dead_broker() -> None:
    """Bounded: the fresh session after a stall is given once per heartbeat; later
    stalls move the deadline by the stall minus one check interval."""
    clock = Clock()
    sessions = BrokerSessions(3.0, clock=clock)
    interval = sessions.check_interval_s
    sessions.touch(1, 10)  # alive: heartbeats after every stall
    sessions.touch(2, 20)  # dies now
    notes = 0
    while True:
        clock.now += 5.0  # stall
        notes += 1
        expired = sessions.expired([(1, 10), (2, 20)])
        assert 1 not in expired, f"the live broker was fenced after {notes} stalls"
        if expired == [2]:
            break
        sessions.touch(1, 10)
        assert notes <= 3.0 / interval + 1, "a dead broker outlived the bound"
    assert notes >= 3.0 / interval  # each stall spent one check interval of its session
    assert sessions.stalls == notes


async def test_a_stall_longer_than_the_session_fences_no_broker(harness) -> None:
    """The chaos finding: after a stall the controller fenced every broker at once."""
    h = harness
    epochs = {b: await h.start_broker(b) for b in (1, 2, 3)}
    await h.create_assigned("t", [[1, 2, 3]], configs={"min.insync.replicas": "2"})
    before = h.partition("t")
    h.run_for(1.0)
    h.clock.advance(10.0)  # SIGSTOP ... SIGCONT; broker 1 died meanwhile
    assert await h.handlers.fence_expired_brokers() == []
    assert h.partition("t") == before
    for b in (2, 3):  # the heartbeats that waited in the sockets
        assert not (await h.heartbeat(b, epochs[b])).is_fenced
    for _ in range(int(h.config.session_timeout_s / 0.5) + 1):
        h.run_for(0.5)
        for b in (2, 3):
            await h.heartbeat(b, epochs[b])
        await h.handlers.fence_expired_brokers()
    assert [b for b in (1, 2, 3) if h.image.brokers[b].fenced] == [1]
    after = h.partition("t")
    assert (after.leader, after.isr) == (2, [2, 3])
