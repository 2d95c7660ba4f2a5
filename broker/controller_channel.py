"""Everything the broker says to the controller.

Three connections, because responses on one connection come back in request order
and a long-polling FetchMetadata must not hold up a heartbeat:
- lifecycle: BrokerRegistration and BrokerHeartbeat (also the controlled shutdown);
- metadata: the FetchMetadata long-poll loop;
- requests: forwarded CreateTopics/DeleteTopics and, from issue 3, AlterPartition.

Registration retries an unreachable controller for a bounded period, then fails with
a message that says so. A heartbeat answered STALE_BROKER_EPOCH re-registers (same
incarnation id, so a retried registration is recognised by the controller).

Metadata is applied only from a controller that holds this incarnation's current
registration (`accepted`: set by a registration or a heartbeat answered at our broker
epoch, cleared by STALE_BROKER_EPOCH or a refused re-registration) and whose cluster
id is this broker's (meta.properties, or learnt at the first registration). A
controller that lost its data directory formats a new cluster id and refuses the
re-registration: the broker then applies nothing from it, keeps every replica, says
so in one line (repeated at most once a minute) and retries until a controller of its
own cluster answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from collections.abc import Callable

import msgspec

from broker.config import BrokerConfig
from broker.faults import NO_FAULTS
from broker.faults import Faults
from protocol.errors import ErrorCode
from protocol.fault_plan import CONTROLLER_PEER_ID
from protocol.messages import AllocateProducerIdsRequest
from protocol.messages import AllocateProducerIdsResponse
from protocol.messages import AlterPartitionRequest
from protocol.messages import AlterPartitionResponse
from protocol.messages import BrokerHeartbeatRequest
from protocol.messages import BrokerHeartbeatResponse
from protocol.messages import BrokerRegistrationRequest
from protocol.messages import BrokerRegistrationResponse
from protocol.messages import FetchMetadataRequest
from protocol.messages import FetchMetadataResponse
from protocol.messages import Listener
from protocol.messages import Message
from runtime.active_controller import ActiveController
from runtime.active_controller import ControllerClient
from runtime.peer_rpc import RpcAuthenticationError
from runtime.peer_rpc import RpcError
from runtime.peer_rpc import RpcErrorResponse
from runtime.tls_settings import outgoing_tls

log = logging.getLogger(__name__)


class ControllerError(Exception):
    """A controller answer the broker cannot live with (fatal at start-up)."""


class ControllerUnreachableError(ControllerError):
    pass


class ClusterIdMismatchError(ControllerError):
    pass


MetadataCallback = Callable[[FetchMetadataResponse], Awaitable[None]]

# A refusal that repeats (a foreign controller answering every retry) is logged again
# at most this often.
REFUSAL_LOG_INTERVAL_S = 60.0


class ControllerChannel:
    def __init__(
        self,
        config: BrokerConfig,
        *,
        incarnation_id: str,
        metadata_offset: Callable[[], int],
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.incarnation_id = incarnation_id
        timeout_s = config.request_timeout_ms / 1000
        # Which controller of the quorum is active: shared by the three connections.
        self.active = ActiveController(
            config.controller,
            client_id=f"broker-{self.node_id}",
            tls=outgoing_tls(config, config.controller_security_protocol),
            sasl=config.controller_sasl(),
        )

        def client(purpose: str) -> ControllerClient:
            return ControllerClient(
                self.active,
                purpose=purpose,
                request_timeout_s=timeout_s,
                connect_timeout_s=min(5.0, timeout_s),
                faults=faults,
                # Test fault rules name the controller by this id (its --node-id is
                # not known here).
                peer_id=CONTROLLER_PEER_ID,
            )

        self._lifecycle = client("lifecycle")
        self._metadata = client("metadata")
        self._requests = client("requests")
        self._metadata_offset = metadata_offset
        self._registration: BrokerRegistrationRequest | None = None
        self.broker_epoch = -1
        # This broker's cluster: from meta.properties, or learnt at the first
        # registration; never changes afterwards.
        self.cluster_id: str | None = None
        self.is_fenced = True
        self.unfenced = asyncio.Event()
        self.caught_up = asyncio.Event()
        # The controller holds this incarnation's registration at `broker_epoch`: only
        # then is metadata fetched and applied.
        self.accepted = asyncio.Event()
        self._refusals = 0
        self._refusal_logged_at = -REFUSAL_LOG_INTERVAL_S
        # Set to send the next heartbeat now (e.g. once caught up, to be unfenced sooner).
        self._heartbeat_now = asyncio.Event()
        self._heartbeat_failures = 0
        self._closing = False
        # "<path>: <error>" of failed log directories; while any, heartbeats ask to be
        # fenced (the controller then moves our leaderships and keeps us fenced).
        self._offline_log_dirs: list[str] = []

    @property
    def controller_address(self) -> str:
        host, port = self.active.address
        return f"{host}:{port}"

    # ------------------------------------------------------------------ registration

    async def register(
        self,
        *,
        cluster_id: str | None,
        listeners: list[Listener],
        clean_shutdown: bool,
        timeout_s: float,
    ) -> int:
        """BrokerRegistration, retried until `timeout_s` passes. Returns the epoch.
        `cluster_id`: this broker's cluster (meta.properties), None on a first start."""
        self.cluster_id = cluster_id
        self._registration = BrokerRegistrationRequest(
            broker_id=self.node_id,
            cluster_id=cluster_id,
            incarnation_id=self.incarnation_id,
            listeners=listeners,
            clean_shutdown=clean_shutdown,
            previous_broker_epoch=self.broker_epoch,
        )
        return await self._register(timeout_s)

    async def _register(self, timeout_s: float) -> int:
        assert self._registration is not None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                resp = await self._lifecycle.request_with_retry(
                    self._registration, deadline=deadline
                )
            except RpcErrorResponse as exc:
                raise ControllerError(
                    f"the controller at {self.controller_address} refused the registration: {exc}"
                ) from exc
            except RpcAuthenticationError as exc:
                raise ControllerError(
                    f"the controller at {self.controller_address} refused this broker's SASL "
                    f"authentication as {self.config.sasl_server_username!r} for "
                    f"{timeout_s:g}s ({exc}); check --sasl-server-username and its password"
                ) from exc
            except RpcError as exc:
                raise ControllerUnreachableError(
                    f"controller at {self.controller_address} unreachable for {timeout_s:g}s "
                    f"({exc}); start it first or fix --controller"
                ) from exc
            assert isinstance(resp, BrokerRegistrationResponse)
            code = ErrorCode.of(resp.error_code)
            if code == ErrorCode.NONE and (
                self.cluster_id is None or resp.cluster_id == self.cluster_id
            ):
                break
            detail = resp.error_message or code.name
            if code in (ErrorCode.NONE, ErrorCode.INCONSISTENT_CLUSTER_ID):
                raise ClusterIdMismatchError(
                    f"cluster id mismatch: the controller at {self.controller_address} runs "
                    f"cluster {resp.cluster_id or 'unknown'}, but --data-dir "
                    f"{self.config.data_dir} belongs to cluster {self.cluster_id} "
                    f"(meta.properties); nothing from that controller is applied and every "
                    f"replica here is kept. If the controller lost its data directory, "
                    f"restore it and restart the controller; if the broker points at the "
                    f"wrong controller, fix --controller (controller: {detail})"
                )
            if not code.retriable and code != ErrorCode.DUPLICATE_BROKER_REGISTRATION:
                raise ControllerError(
                    f"the controller at {self.controller_address} refused the registration of "
                    f"broker {self.node_id}: {code.name}: {detail}"
                )
            last_error = f"{code.name}: {detail}"
            if time.monotonic() >= deadline:
                raise ControllerError(
                    f"the controller at {self.controller_address} kept refusing the "
                    f"registration of broker {self.node_id} for {timeout_s:.0f}s: {last_error}"
                )
            log.warning("registration refused (%s); retrying", last_error)
            await asyncio.sleep(min(1.0, self.config.heartbeat_interval_ms / 1000))
        old = self.broker_epoch
        if resp.broker_epoch < old:
            # A controller whose log is shorter than the one that gave us `old` (restored
            # from an older backup): its metadata is behind ours, and epochs must grow.
            raise ControllerError(
                f"the controller at {self.controller_address} gave broker epoch "
                f"{resp.broker_epoch}, older than this incarnation's {old}: its metadata "
                "log is behind the one this broker followed (restored from an older "
                "backup?); restart this broker to register as a new incarnation"
            )
        self.broker_epoch = resp.broker_epoch
        if self.cluster_id is None and resp.cluster_id:
            self.cluster_id = resp.cluster_id
            # Every later registration of this incarnation names the cluster.
            self._registration = msgspec.structs.replace(
                self._registration, cluster_id=resp.cluster_id
            )
        self.is_fenced = True
        self.unfenced.clear()
        self._set_accepted()
        log.info(
            "registered with the controller at %s: broker epoch %d, cluster %s",
            self.controller_address,
            self.broker_epoch,
            self.cluster_id,
        )
        return self.broker_epoch

    # ------------------------------------------------------------------ heartbeats

    def _set_accepted(self) -> None:
        if self._refusals:
            log.info(
                "the controller at %s accepts this broker again (broker epoch %d) after %d "
                "refusal(s)",
                self.controller_address,
                self.broker_epoch,
                self._refusals,
            )
            self._refusals = 0
            self._refusal_logged_at = -REFUSAL_LOG_INTERVAL_S
        self.accepted.set()

    def _refused(self, why: str) -> None:
        """Stop applying metadata from this controller; say why (rate-limited)."""
        self.accepted.clear()
        self._refusals += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= REFUSAL_LOG_INTERVAL_S:
            self._refusal_logged_at = now
            again = f" (refused {self._refusals} times so far)" if self._refusals > 1 else ""
            log.error("%s; retrying%s", why, again)

    async def heartbeat_loop(self) -> None:
        interval_s = self.config.heartbeat_interval_ms / 1000
        while not self._closing:
            resp = await self._heartbeat(want_shut_down=False)
            if resp is not None and resp.error_code == ErrorCode.STALE_BROKER_EPOCH:
                # The controller does not hold our registration: apply nothing from it
                # until it accepts us again.
                self.accepted.clear()
                if not self._refusals:
                    log.warning(
                        "heartbeat with broker epoch %d is stale; registering again",
                        self.broker_epoch,
                    )
                try:
                    await self._register(self.config.controller_connect_timeout_ms / 1000)
                except ControllerError as exc:
                    self._refused(f"re-registration failed: {exc}")
                else:
                    continue  # heartbeat with the new epoch at once
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._heartbeat_now.wait()
            self._heartbeat_now.clear()

    async def _heartbeat(self, *, want_shut_down: bool) -> BrokerHeartbeatResponse | None:
        request = BrokerHeartbeatRequest(
            broker_id=self.node_id,
            broker_epoch=self.broker_epoch,
            current_metadata_offset=self._metadata_offset(),
            want_fence=bool(self._offline_log_dirs),
            want_shut_down=want_shut_down,
            offline_log_dirs=list(self._offline_log_dirs),
        )
        # A heartbeat older than the session timeout is useless: time out well before.
        timeout_s = max(0.5, 2 * self.config.heartbeat_interval_ms / 1000)
        try:
            resp = await self._lifecycle.request(request, timeout_s=timeout_s)
        except RpcError as exc:
            self._heartbeat_failures += 1
            if self._heartbeat_failures in (1, 10) or self._heartbeat_failures % 100 == 0:
                log.warning(
                    "heartbeat to the controller at %s failed (%d in a row): %s",
                    self.controller_address,
                    self._heartbeat_failures,
                    exc,
                )
            return None
        if self._heartbeat_failures:
            log.info("heartbeats reach the controller again")
            self._heartbeat_failures = 0
        assert isinstance(resp, BrokerHeartbeatResponse)
        if resp.error_code != ErrorCode.NONE:
            if resp.error_code != ErrorCode.STALE_BROKER_EPOCH:
                log.warning("heartbeat answered %s", ErrorCode.of(resp.error_code).name)
            return resp
        if request.broker_epoch == self.broker_epoch and not self.accepted.is_set():
            self._set_accepted()  # it holds our registration (e.g. restored controller)
        if resp.is_fenced != self.is_fenced:
            log.info(
                "the controller %s this broker (broker epoch %d)",
                "fenced" if resp.is_fenced else "unfenced",
                self.broker_epoch,
            )
        self.is_fenced = resp.is_fenced
        if resp.is_fenced:
            self.unfenced.clear()
        else:
            self.unfenced.set()
        return resp

    def report_offline_log_dir(self, path: str, error: str) -> None:
        """A log directory failed: from now on every heartbeat asks to be fenced and
        names it; the next heartbeat goes at once."""
        entry = f"{path}: {error}"
        if entry not in self._offline_log_dirs:
            self._offline_log_dirs.append(entry)
        self._heartbeat_now.set()

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        """Ask the controller to move our leaderships away (heartbeats with
        want_shut_down); True once it answers should_shut_down."""
        deadline = time.monotonic() + timeout_s
        interval_s = min(0.5, self.config.heartbeat_interval_ms / 1000)
        while True:
            resp = await self._heartbeat(want_shut_down=True)
            if resp is not None and resp.error_code == ErrorCode.NONE and resp.should_shut_down:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await asyncio.sleep(min(interval_s, remaining))

    # ------------------------------------------------------------------ metadata

    async def metadata_loop(self, on_metadata: MetadataCallback, from_offset: int = 0) -> None:
        """Follow the metadata log forever: long-poll once caught up. Fetches only while
        the controller accepts this incarnation; applies only answers of our cluster
        for our current broker epoch."""
        next_offset = from_offset
        failures = 0
        while not self._closing:
            if not self.accepted.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self.accepted.wait()
                continue
            max_wait_ms = self.config.metadata_max_wait_ms if self.caught_up.is_set() else 0
            epoch = self.broker_epoch
            request = FetchMetadataRequest(
                broker_id=self.node_id,
                broker_epoch=epoch,
                from_offset=next_offset,
                max_wait_ms=max_wait_ms,
            )
            try:
                resp = await self._metadata.request(
                    request, timeout_s=max_wait_ms / 1000 + self.config.request_timeout_ms / 1000
                )
            except RpcError as exc:
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("metadata fetch failed (%d in a row): %s", failures, exc)
                await asyncio.sleep(min(1.0, 0.05 * failures))
                continue
            assert isinstance(resp, FetchMetadataResponse)
            if epoch != self.broker_epoch or not self.accepted.is_set():
                continue  # the registration changed meanwhile: ask again as it is now
            if resp.error_code != ErrorCode.NONE:
                failures += 1
                code = ErrorCode.of(resp.error_code)
                if code == ErrorCode.STALE_BROKER_EPOCH:
                    # The controller does not hold our registration: the heartbeat loop
                    # registers again; nothing is applied meanwhile.
                    self.accepted.clear()
                    self._heartbeat_now.set()
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning(
                        "metadata fetch from offset %d answered %s (%d in a row)%s",
                        next_offset,
                        code.name,
                        failures,
                        f": {resp.error_message}" if resp.error_message else "",
                    )
                await asyncio.sleep(min(1.0, 0.05 * failures))
                continue
            failures = 0
            if resp.cluster_id != self.cluster_id:
                self._heartbeat_now.set()
                self._refused(
                    f"the controller at {self.controller_address} serves metadata of cluster "
                    f"{resp.cluster_id or 'unknown'}, but this broker belongs to cluster "
                    f"{self.cluster_id}; nothing of it is applied and every replica is kept"
                )
                continue
            if resp.entries or resp.is_snapshot:
                await on_metadata(resp)
            if resp.next_offset > next_offset or resp.is_snapshot:
                next_offset = resp.next_offset
            if (
                not self.caught_up.is_set()
                and next_offset >= resp.high_watermark
                and next_offset > self.broker_epoch
            ):
                log.info("caught up with the metadata log at offset %d", next_offset - 1)
                self.caught_up.set()
                self._heartbeat_now.set()

    # ------------------------------------------------------------------ requests

    async def forward(self, body: Message, timeout_s: float) -> Message:
        """Send a client's CreateTopics/DeleteTopics/ElectLeaders to the controller as it is."""
        deadline = time.monotonic() + timeout_s
        return await self._requests.request_with_retry(body, deadline=deadline, timeout_s=timeout_s)

    async def alter_partition(self, request: AlterPartitionRequest) -> AlterPartitionResponse:
        """Issue 3: the leader's ISR changes."""
        resp = await self._requests.request(request)
        assert isinstance(resp, AlterPartitionResponse)
        return resp

    async def allocate_producer_ids(self) -> AllocateProducerIdsResponse:
        """KIP-730: a block of producer ids for InitProducerId (broker/producer_ids.py)."""
        resp = await self._requests.request(
            AllocateProducerIdsRequest(broker_id=self.node_id, broker_epoch=self.broker_epoch)
        )
        assert isinstance(resp, AllocateProducerIdsResponse)
        return resp

    def stop_loops(self) -> None:
        """Make the heartbeat and metadata loops end at their next turn."""
        self._closing = True

    async def close(self) -> None:
        self._closing = True
        for client in (self._lifecycle, self._metadata, self._requests):
            await client.close()
