"""Client quotas' arithmetic and model (runtime/quota_rate.py, runtime/client_quotas.py):
the rate over Kafka's sampled windows, the throttle time Kafka's formula gives, and
which entity's quota applies (the most specific one)."""

from __future__ import annotations

import pytest

from runtime.client_quotas import CONSUMER_BYTE_RATE
from runtime.client_quotas import PRODUCER_BYTE_RATE
from runtime.client_quotas import entity_problem
from runtime.client_quotas import resolve
from runtime.client_quotas import value_problem
from runtime.quota_rate import SampledRate
from runtime.quota_rate import throttle_ms


def test_a_first_burst_is_spread_over_all_but_one_window() -> None:
    """11 x 1 s windows: 10 s at least, so 1 MB at once is 100 kB/s, not 1 MB/ms."""
    rate = SampledRate(11, 1000)
    rate.record(1_000_000, now_ms=0)
    assert rate.window_size_ms(0) == 10_000
    assert rate.rate(0) == pytest.approx(100_000)


def test_the_rate_spans_from_the_oldest_window_and_old_windows_expire() -> None:
    rate = SampledRate(3, 1000)
    for t in (0, 1000, 2000):
        rate.record(300, now_ms=t)
    # windows started at 0, 1000, 2000; at 2500 they span 2.5 s
    assert rate.rate(2500) == pytest.approx(900 / 2.5)
    # at 3000 the window started at 0 is 3 windows old: empty (and starts now)
    assert rate.rate(3000) == pytest.approx(600 / 2.0)
    rate.record(100, now_ms=3000)  # reuses the oldest slot
    assert rate.rate(3000) == pytest.approx(700 / 2.0)
    assert not rate.idle(3000) and rate.idle(6000)


def test_throttle_time_is_kafkas_formula_and_bounded() -> None:
    """X = (O - T) / T * W: at twice the quota over 10 s, 10 s of silence."""
    assert throttle_ms(200.0, 100.0, 10_000, 60_000) == 10_000
    assert throttle_ms(150.0, 100.0, 10_000, 60_000) == 5_000
    assert throttle_ms(100.0, 100.0, 10_000, 60_000) == 0, "at the quota is within it"
    assert throttle_ms(10_000.0, 1.0, 10_000, 30_000) == 30_000, "bounded"


def test_a_recording_over_the_quota_is_throttled_from_the_window_in_use() -> None:
    rate = SampledRate(11, 1000)
    rate.record(20_000, now_ms=0)  # twice what the 10 s minimum window allows at 1000/s
    assert throttle_ms(rate.rate(0), 1000.0, rate.window_size_ms(0), 60_000) == 10_000
    rate.record(1, now_ms=11_000)  # the burst's window is 11 windows old: forgotten
    assert rate.rate(11_000) < 1000.0


def test_unrecord_takes_a_fetch_back() -> None:
    rate = SampledRate(11, 1000)
    rate.record(500, now_ms=0)
    rate.record(700, now_ms=10)
    rate.unrecord(700, now_ms=20)
    assert rate.rate(20) == pytest.approx(500 / 10.02), "only the first one counts"


QUOTAS = {
    (("client-id", "c"), ("user", "u")): {PRODUCER_BYTE_RATE: 1.0},
    (("client-id", None), ("user", "u")): {PRODUCER_BYTE_RATE: 2.0},
    (("user", "u"),): {PRODUCER_BYTE_RATE: 3.0, CONSUMER_BYTE_RATE: 30.0},
    (("client-id", "c"), ("user", None)): {PRODUCER_BYTE_RATE: 4.0},
    (("client-id", None), ("user", None)): {PRODUCER_BYTE_RATE: 5.0},
    (("user", None),): {PRODUCER_BYTE_RATE: 6.0},
    (("client-id", "c"),): {PRODUCER_BYTE_RATE: 7.0},
    (("client-id", None),): {PRODUCER_BYTE_RATE: 8.0, CONSUMER_BYTE_RATE: 80.0},
}


def test_the_most_specific_entity_wins_key_by_key_in_kafkas_order() -> None:
    order = list(QUOTAS)
    for i, entity in enumerate(order):
        quotas = {e: QUOTAS[e] for e in order[i:]}
        found = resolve(quotas, "u", "c", PRODUCER_BYTE_RATE)
        assert found is not None and found[0] == float(i + 1), entity
    # each key on its own: no consumer quota on /users/u/clients/c, /users/u's applies
    assert resolve(QUOTAS, "u", "c", CONSUMER_BYTE_RATE) == (30.0, ("u", ""))
    assert resolve(QUOTAS, "v", "d", CONSUMER_BYTE_RATE) == (80.0, ("", "d"))
    assert resolve({}, "u", "c", PRODUCER_BYTE_RATE) is None


def test_who_shares_a_quota() -> None:
    """A quota on /users/u is shared by all of u's client ids; one on a default is
    each name's own (Kafka's metric tags)."""
    only_user = {(("user", "u"),): {PRODUCER_BYTE_RATE: 3.0}}
    assert resolve(only_user, "u", "c1", PRODUCER_BYTE_RATE) == (3.0, ("u", ""))
    assert resolve(only_user, "u", "c2", PRODUCER_BYTE_RATE) == (3.0, ("u", ""))
    default_pair = {(("client-id", None), ("user", None)): {PRODUCER_BYTE_RATE: 5.0}}
    assert resolve(default_pair, "u", "c", PRODUCER_BYTE_RATE) == (5.0, ("u", "c"))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("producer_byte_rate", -1.0, "must be positive"),
        ("producer_byte_rate", 0.0, "must be positive"),
        ("producer_byte_rate", 1.5, "whole number"),
        ("request_percentage", float("nan"), "must be positive"),
        ("produce_byte_rate", 5.0, "unknown quota key"),
        ("controller_mutation_rate", 5.0, "not supported"),
        ("consumer_byte_rate", 2.0**60, "at most"),
    ],
)
def test_bad_values_say_what_is_wrong(key: str, value: float, message: str) -> None:
    problem = value_problem(key, value)
    assert problem is not None and message in problem
    assert value_problem("request_percentage", 12.5) is None


def test_bad_entities_say_what_is_wrong() -> None:
    assert "needs a user" in (entity_problem([]) or "")
    assert "ip quotas" in (entity_problem([("ip", "1.2.3.4")]) or "")
    assert "named twice" in (entity_problem([("user", "a"), ("user", "b")]) or "")
    assert "empty user name" in (entity_problem([("user", "")]) or "")
    assert entity_problem([("user", None), ("client-id", "c")]) is None
