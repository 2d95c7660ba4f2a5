"""The rate a quota is measured with, and the throttle time a violation costs, as Kafka
computes them (its metrics' SampledStat and Rate, and QuotaUtils.throttleTime). Pure:
times are given, in milliseconds.

A rate is kept in `samples` windows of `window_ms` each (quota.window.num = 11 x
quota.window.size.seconds = 1 by default). Recording adds to the current window, or
starts the next one (reusing the oldest slot) once the current one is `window_ms` old;
a window older than all of them together counts as empty. The rate is the sum of the
windows over the time they span, measured from the start of the oldest, but never
less than `samples - 1` whole windows: a client's first burst is spread over the whole
period instead of the few milliseconds it took, as Kafka does.

When a recording brings the rate above the quota, the client is throttled for

    throttle_ms = (rate - quota) / quota * window_size_ms

the time it must stay silent for its rate over the same window to come back down to
the quota (Kafka's docs: "X = (O - T) / T * W").
"""

from __future__ import annotations

from protocol.invariants import invariant


class SampledRate:
    """One entity's rate of one quantity (bytes, or percent of a second)."""

    __slots__ = ("_current", "_starts", "_values", "samples", "window_ms")

    def __init__(self, samples: int, window_ms: int) -> None:
        invariant(samples >= 2 and window_ms >= 1, lambda: f"{samples} x {window_ms} ms")
        self.samples = samples
        self.window_ms = window_ms
        self._starts: list[float] = []  # each window's start, ms
        self._values: list[float] = []
        self._current = 0

    def record(self, value: float, now_ms: float) -> None:
        if not self._starts:
            self._starts.append(now_ms)
            self._values.append(0.0)
        elif now_ms - self._starts[self._current] >= self.window_ms:
            self._current = (self._current + 1) % self.samples
            if self._current >= len(self._starts):
                self._starts.append(now_ms)
                self._values.append(0.0)
            else:
                self._starts[self._current] = now_ms
                self._values[self._current] = 0.0
        self._values[self._current] += value

    def _purge(self, now_ms: float) -> None:
        """Windows older than all windows together count as empty (and start now)."""
        expire_ms = self.samples * self.window_ms
        for i, start in enumerate(self._starts):
            if now_ms - start >= expire_ms:
                self._starts[i] = now_ms
                self._values[i] = 0.0

    def window_size_ms(self, now_ms: float) -> float:
        """The time the windows span, at least `samples - 1` whole windows."""
        self._purge(now_ms)
        oldest = min(self._starts, default=now_ms)
        elapsed = now_ms - oldest
        full = int(elapsed // self.window_ms)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return elapsed

    def rate(self, now_ms: float) -> float:
        """Per second."""
        size_ms = self.window_size_ms(now_ms)
        return sum(self._values) / (size_ms / 1000)

    def unrecord(self, value: float, now_ms: float) -> None:
        """Take back a recording (a Fetch answered empty because it is throttled)."""
        self.record(-value, now_ms)

    def idle(self, now_ms: float) -> bool:
        """Nothing recorded within the last `samples` windows: safe to forget."""
        last = self._starts[self._current] if self._starts else -float("inf")
        return now_ms - last >= self.samples * self.window_ms


def throttle_ms(rate: float, quota: float, window_size_ms: float, max_ms: float) -> int:
    """How long a client whose rate is `rate` against `quota` must be throttled: 0
    within the quota, else (rate - quota) / quota * window, at most `max_ms`."""
    if rate <= quota:
        return 0
    return round(min((rate - quota) / quota * window_size_ms, max_ms))
