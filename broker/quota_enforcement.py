"""Client quotas enforced on a broker (issue 18; Kafka's ClientQuotaManager and
ClientRequestQuotaManager, KIP-13, KIP-124, KIP-219), on every listener:

- Produce: the request's record bytes against producer_byte_rate;
- Fetch of a consumer (never a follower's, replica_id >= 0): the answer's record bytes
  against consumer_byte_rate. A throttled Fetch is answered without its records, which
  are not counted (the consumer asks again for the same offsets after the throttle),
  as Kafka does;
- every request of a client: the time its handler ran on the event loop, as percent of
  a second, against request_percentage.

A request is recorded, then checked: over the quota, the answer carries
`throttle_time_ms` (runtime/quota_rate.py: the time that brings the rate back to the
quota; the largest of the request's quotas), and the server answers at once and reads
nothing more from the connection for that long (KIP-219; runtime/server.py). A
request_percentage throttle is at most one quota window, as in Kafka; a byte-rate one
at most MAX_BYTE_RATE_THROTTLE_MS (Kafka has no bound there; ours keeps a client that
sends one huge request from being muted past its request timeout).

Which quota applies and who shares it: runtime/client_quotas.py. The principal is the
connection's (User:ANONYMOUS without authentication), the client id the request
header's. With no quota in the metadata image nothing is measured (`active`).

State is bounded: one rate per (quota key, sharer), forgotten once idle for all the
windows, and at most MAX_TRACKED of them (the oldest go first).
"""

from __future__ import annotations

import logging
import time

from broker.metadata_image import MetadataImage
from protocol.api import ApiKey
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import Message
from protocol.messages import ProduceRequest
from runtime.client_quotas import CONSUMER_BYTE_RATE
from runtime.client_quotas import PRODUCER_BYTE_RATE
from runtime.client_quotas import QUOTA_KEYS
from runtime.client_quotas import REQUEST_PERCENTAGE
from runtime.client_quotas import resolve
from runtime.client_quotas import user_of
from runtime.quota_rate import SampledRate
from runtime.quota_rate import throttle_ms
from runtime.server import RequestContext

log = logging.getLogger(__name__)

MAX_TRACKED = 10_000  # rates kept at once, and (user, client id) resolutions cached
SWEEP_EVERY = 1_000  # charges between two sweeps of idle rates
MAX_BYTE_RATE_THROTTLE_MS = 30_000

_EMPTY = memoryview(b"")
Resolved = dict[str, tuple[float, tuple[str, str]]]  # key -> (quota, sharer)


def produce_bytes(request: ProduceRequest) -> int:
    return sum(len(p.records) for t in request.topics for p in t.partitions)


def fetched_bytes(response: FetchResponse) -> int:
    return sum(len(p.records) for t in response.responses for p in t.partitions)


class QuotaEnforcer:
    def __init__(self, image: MetadataImage, window_num: int, window_size_s: int) -> None:
        self.image = image
        self.window_num = window_num
        self.window_ms = window_size_s * 1000
        self._rates: dict[tuple[str, tuple[str, str]], SampledRate] = {}
        self._resolved: dict[tuple[str, str], Resolved] = {}
        self._resolved_at = -1  # the image's client_quota_changes they were resolved at
        self._charges = 0

    def active(self) -> bool:
        """Any quota at all (else nothing is measured: a dict's truth on the hot path)."""
        return bool(self.image.client_quotas)

    def quotas_of(self, user: str, client_id: str) -> Resolved:
        if self._resolved_at != self.image.client_quota_changes:
            self._resolved.clear()
            self._resolved_at = self.image.client_quota_changes
        found = self._resolved.get((user, client_id))
        if found is None:
            if len(self._resolved) >= MAX_TRACKED:
                self._resolved.clear()
            quotas = self.image.client_quotas
            found = {}
            for key in QUOTA_KEYS:
                match = resolve(quotas, user, client_id, key)
                if match is not None:
                    found[key] = match
            self._resolved[(user, client_id)] = found
        return found

    def admit(self, ctx: RequestContext, request: Message) -> None:
        """Before a consumer's Fetch runs: at most what its quota allows in the windows
        (Kafka caps fetch.max.bytes so), else one answer over it would be throttled,
        sent empty and asked again for ever. The first batch still comes whole."""
        if not isinstance(request, FetchRequest) or request.replica_id >= 0:
            return
        quota = self.quotas_of(user_of(ctx.principal), ctx.client_id or "").get(CONSUMER_BYTE_RATE)
        if quota is not None:
            window_bytes = quota[0] * (self.window_num - 1) * self.window_ms / 1000
            request.max_bytes = max(1, min(request.max_bytes, int(window_bytes)))

    def charge(
        self,
        ctx: RequestContext,
        api_key: int,
        request: Message,
        response: Message,
        handle_s: float,
    ) -> int:
        """Record one served request; the throttle time its client gets (0: none), also
        set in `response` when it has the field."""
        if isinstance(request, FetchRequest) and request.replica_id >= 0:
            return 0  # replication is never a client's quota
        quotas = self.quotas_of(user_of(ctx.principal), ctx.client_id or "")
        if not quotas:
            return 0
        now_ms = time.monotonic() * 1000
        self._maybe_sweep(now_ms)
        throttle = 0
        if REQUEST_PERCENTAGE in quotas:
            throttle = self._record(
                quotas[REQUEST_PERCENTAGE], REQUEST_PERCENTAGE, handle_s * 100, now_ms
            )
        produce = quotas.get(PRODUCER_BYTE_RATE) if api_key == ApiKey.PRODUCE else None
        if produce is not None and isinstance(request, ProduceRequest):
            size = produce_bytes(request)
            throttle = max(throttle, self._record(produce, PRODUCER_BYTE_RATE, size, now_ms))
        consume = quotas.get(CONSUMER_BYTE_RATE) if api_key == ApiKey.FETCH else None
        if consume is not None and isinstance(response, FetchResponse):
            size = fetched_bytes(response)
            throttle = max(throttle, self._record(consume, CONSUMER_BYTE_RATE, size, now_ms))
            if throttle > 0:  # answered without its records, which are not counted
                self._rate(CONSUMER_BYTE_RATE, consume[1]).unrecord(size, now_ms)
                for topic in response.responses:
                    for partition in topic.partitions:
                        partition.records = _EMPTY
        if throttle > 0:
            log.debug(
                "throttling %s (client %r) for %d ms after %s",
                ctx.principal,
                ctx.client_id,
                throttle,
                ApiKey(api_key).name,
            )
            if hasattr(response, "throttle_time_ms"):
                response.throttle_time_ms = throttle  # type: ignore[attr-defined]
        return throttle

    def _rate(self, key: str, sharer: tuple[str, str]) -> SampledRate:
        rate = self._rates.get((key, sharer))
        if rate is None:
            if len(self._rates) >= MAX_TRACKED:
                del self._rates[next(iter(self._rates))]  # the oldest tracked
            rate = SampledRate(self.window_num, self.window_ms)
            self._rates[(key, sharer)] = rate
        return rate

    def _record(
        self, quota: tuple[float, tuple[str, str]], key: str, value: float, now_ms: float
    ) -> int:
        limit, sharer = quota
        rate = self._rate(key, sharer)
        rate.record(value, now_ms)
        observed = rate.rate(now_ms)
        longest = self.window_ms if key == REQUEST_PERCENTAGE else MAX_BYTE_RATE_THROTTLE_MS
        return throttle_ms(observed, limit, rate.window_size_ms(now_ms), longest)

    def _maybe_sweep(self, now_ms: float) -> None:
        self._charges += 1
        if self._charges % SWEEP_EVERY:
            return
        for k in [k for k, rate in self._rates.items() if rate.idle(now_ms)]:
            del self._rates[k]

    def tracked(self) -> int:
        return len(self._rates)
