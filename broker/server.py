"""The broker process: start-up and shutdown order, and the wiring between parts.

Start-up:
 1. load and recover the logs of the data directory (LogManager.startup, in a thread);
 2. bind every listener (port 0 picks a free port) without accepting yet, so the
    advertised addresses carry real ports and a busy port fails fast;
 3. register with the controller (bounded retry) -> broker epoch, cluster id (stored
    in meta.properties on first start; another cluster's controller is refused);
 4. start heartbeats and follow the metadata log until caught up;
 5. publish the image: become leader / follower of the assigned partitions, then
    delete the local logs whose topic a RemoveTopicRecord deleted (while this broker
    was down) and set every other unassigned local log aside as stray (never deleted
    on that inference);
 6. accept connections, start the background jobs, wait until the controller
    unfences this broker, and log `broker N started ...`.

Shutdown (SIGTERM/SIGINT): stop accepting, ask the controller to move leaderships
away (bounded), stop following metadata, drop connections, release waiting
requests, checkpoint, LogManager.shutdown() (which writes the clean-shutdown marker).

Test-only switches (--enable-test-faults and the --unsafe-* protections it allows) are
checked and announced at WARNING before anything else; see broker/faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import logging
import signal
import uuid
from collections.abc import Coroutine
from typing import Any

from broker.config import BrokerConfig
from broker.controller_channel import ControllerChannel
from broker.controller_channel import ControllerError
from broker.faults import NO_FAULTS
from broker.faults import Faults
from broker.faults import NoFsyncLogManager
from broker.faults import TestFaults
from broker.group_coordinator import GroupCoordinator
from broker.handlers import Handlers
from broker.metadata_image import MetadataDelta
from broker.metadata_image import MetadataImage
from broker.quota_enforcement import QuotaEnforcer
from broker.replica_manager import ReplicaManager
from broker.request_authorization import BrokerRequestAccess
from broker.storage.errors import StorageError
from broker.storage.errors import os_error_advice
from broker.storage.file_handles import warn_if_open_files_exceed_limit
from broker.storage.log import LogConfig
from broker.storage.log_manager import LogManager
from broker.storage.meta_properties import MetaProperties
from protocol.connection import NATIVE
from protocol.connection_limits import ConnectionTable
from protocol.kafka.codec import KAFKA
from protocol.messages import FetchMetadataResponse
from protocol.messages import Listener
from runtime.access import RequestAccess
from runtime.authorization_settings import authorizer_settings
from runtime.fileio import describe_os_error
from runtime.process_start import after_start
from runtime.sasl import image_lookup
from runtime.server import ListenerServer
from runtime.server import SaslConfig
from runtime.settings import ConfigError
from runtime.settings import announce_test_switches
from runtime.settings import refusal
from runtime.settings import topic_defaults
from runtime.settings import unsafe_switches_on
from runtime.tasks import cancel_and_wait
from runtime.tls import TlsConfigError
from runtime.tls import uses_sasl
from runtime.tls import uses_tls
from runtime.tls_settings import listener_tls
from runtime.tls_settings import outgoing_tls

log = logging.getLogger(__name__)


def _dump_tasks() -> None:
    """SIGUSR1: log where every task is waiting (for a broker that seems stuck)."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(limit=8, file=out)
    log.warning("SIGUSR1: %d tasks\n%s", len(asyncio.all_tasks()), out.getvalue())


class StartupError(Exception):
    """Start-up cannot go on; the message says what is wrong and what to do."""


def base_log_config(config: BrokerConfig) -> LogConfig:
    """The broker-wide defaults that topic configs override (the broker settings that
    declare a topic config's default, runtime/settings.py)."""
    return LogConfig(**topic_defaults(config))


def protections_off(config: BrokerConfig) -> tuple[str, ...]:
    """The unsafe switches that are on (their flag names)."""
    return unsafe_switches_on(config)


def check_test_switches(config: BrokerConfig) -> None:
    """Refuse an unsafe switch without --enable-test-faults (StartupError)."""
    reason = refusal(config)
    if reason is not None:
        raise StartupError(reason)


def full_delta(image: MetadataImage) -> MetadataDelta:
    """The whole image as one delta: what a broker does on its first catch-up."""
    delta = MetadataDelta(brokers_changed=True)
    for state in image.partitions():
        delta.changed[state.tp] = state
    for info in image.topics_by_id.values():
        delta.topic_configs[info.name] = dict(info.configs)
    return delta


async def _start_step(done: asyncio.Event, timeout_s: float, failure: str) -> None:
    """Wait for one step of start-up; past `timeout_s` the broker refuses to start."""
    try:
        async with asyncio.timeout(timeout_s):
            await done.wait()
    except TimeoutError:
        raise StartupError(failure) from None


class Broker:
    def __init__(self, config: BrokerConfig, *, faults: Faults | None = None) -> None:
        self.config = config
        if faults is None:
            faults = (
                TestFaults(node_id=config.node_id, protections_off=protections_off(config))
                if config.enable_test_faults
                else NO_FAULTS
            )
        self.faults = faults
        self.node_id = config.node_id
        self.incarnation_id = uuid.uuid4().hex
        self.image = MetadataImage()
        self.log_manager: LogManager | None = None
        self.replica_manager: ReplicaManager | None = None
        self.controller: ControllerChannel | None = None
        self.coordinator: GroupCoordinator | None = None
        self.listeners: list[ListenerServer] = []
        self.started = asyncio.Event()
        self.stopping = asyncio.Event()
        self.exit_code = 0
        self._image_updated = asyncio.Condition()
        self._metadata_lock = asyncio.Lock()
        self._published = False
        self._tasks: list[asyncio.Task[None]] = []
        self._meta: MetaProperties | None = None
        self._logs_loaded = False

    # ------------------------------------------------------------------ start-up

    def _announce_test_switches(self) -> None:
        check_test_switches(self.config)
        if self.config.enable_test_faults:
            announce_test_switches(self.config, log, f"broker {self.node_id}")

    async def start(self) -> None:
        config = self.config
        self._announce_test_switches()
        try:  # the password of SASL connections out, read first: a missing one stops the start
            config.inter_broker_sasl()
            config.controller_sasl()
        except ConfigError as exc:
            raise StartupError(f"connections to brokers and controllers: {exc}") from None
        try:
            config.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(
                f"cannot create --data-dir {config.data_dir}: {exc.strerror}; "
                "choose a writable directory"
            ) from exc
        self._meta = self._read_meta_properties()
        await self._load_logs()
        try:
            # Claim the directory for this node id (the lock is held from here on).
            self._meta = MetaProperties.check_or_write(config.data_dir, node_id=self.node_id)
        except StorageError as exc:
            raise StartupError(str(exc)) from exc
        except OSError as exc:
            raise StartupError(self._disk_error("cannot write meta.properties", exc)) from exc
        await self._bind_listeners()
        assert self.log_manager is not None and self.replica_manager is not None
        self.controller = ControllerChannel(
            self.config,
            incarnation_id=self.incarnation_id,
            metadata_offset=lambda: self.image.offset,
            faults=self.faults,
        )
        # Our broker epoch and AlterPartition go through this channel; the follower
        # fetchers' connections to leaders get the test faults.
        self.replica_manager.attach_controller(self.controller, faults=self.faults)
        # Registers its leadership listener before the first metadata is published.
        self.coordinator = GroupCoordinator(
            config=self.config,
            image=self.image,
            replica_manager=self.replica_manager,
            controller=self.controller,
        )
        advertised = self.config.advertised()
        listeners = [Listener(name=s.name, host=s.host, port=s.port) for s in advertised.values()]
        try:
            await self.controller.register(
                cluster_id=self._meta.cluster_id if self._meta else None,
                listeners=listeners,
                clean_shutdown=bool(self.log_manager.had_clean_shutdown),
                timeout_s=config.controller_connect_timeout_ms / 1000,
            )
        except ControllerError as exc:
            raise StartupError(str(exc)) from exc
        self._store_cluster_id(self.controller.cluster_id)
        self._spawn(self.controller.heartbeat_loop(), "heartbeats")
        self._spawn(self.controller.metadata_loop(self._on_metadata), "metadata")
        timeout_s = config.controller_connect_timeout_ms / 1000
        await _start_step(
            self.controller.caught_up,
            timeout_s,
            f"could not catch up with the metadata log of the controller at "
            f"{self.controller.controller_address} within {timeout_s:.0f}s; "
            "check that the controller is healthy",
        )
        await self._publish()
        failure = self.log_manager.dir_failure.failure
        if failure is not None:  # creating or leading a replica failed on the disk
            raise StartupError(str(failure))
        for server in self.listeners:
            await server.start_serving()
        assert self.replica_manager is not None
        self.replica_manager.start_background()
        await _start_step(
            self.controller.unfenced,
            timeout_s,
            f"the controller at {self.controller.controller_address} did not unfence "
            f"broker {self.node_id} within {timeout_s:.0f}s; check the controller's log",
        )
        listener_text = ", ".join(str(s) for s in self.config.listeners)
        advertised_text = ", ".join(str(s) for s in advertised.values())
        protocols = {s.name: self.config.security_protocol(s.name) for s in self.config.listeners}
        tls = [name for name, protocol in protocols.items() if uses_tls(protocol)]
        sasl = [name for name, protocol in protocols.items() if uses_sasl(protocol)]
        security = "".join(
            f"; {what} on {', '.join(names)}"
            for what, names in (("TLS", tls), ("SASL", sasl))
            if names
        )
        log.info(
            "broker %d started: listeners %s (advertised %s), broker epoch %d, cluster %s, "
            "metadata offset %d, %d partitions%s",
            self.node_id,
            listener_text,
            advertised_text,
            self.controller.broker_epoch,
            self.controller.cluster_id,
            self.image.offset,
            len(self.replica_manager.partitions),
            security,
        )
        after_start(f"broker-{self.node_id}")
        self.started.set()

    def _disk_error(self, what: str, exc: OSError) -> str:
        """One line for a start-up step the file system refused: what, where, why, and
        what to do."""
        data_dir = self.config.data_dir
        return f"{what} in {data_dir}: {describe_os_error(exc)}; {os_error_advice(exc, data_dir)}"

    def _read_meta_properties(self) -> MetaProperties | None:
        try:
            meta = MetaProperties.read(self.config.data_dir)
        except StorageError as exc:
            raise StartupError(f"{exc}") from exc
        except OSError as exc:  # a directory in its place, EIO, EACCES, ...
            raise StartupError(self._disk_error("cannot read meta.properties", exc)) from exc
        if meta is not None and meta.node_id != self.node_id:
            raise StartupError(
                f"{self.config.data_dir} belongs to broker {meta.node_id}, not {self.node_id}; "
                "use that node id or another --data-dir"
            )
        return meta

    def _store_cluster_id(self, cluster_id: str | None) -> None:
        if not cluster_id or (self._meta is not None and self._meta.cluster_id == cluster_id):
            return
        if self._meta is not None and self._meta.cluster_id:
            raise StartupError(
                f"cluster id mismatch: {self.config.data_dir} belongs to cluster "
                f"{self._meta.cluster_id} but the controller at "
                f"{self.channel.controller_address} serves cluster "
                f"{cluster_id}; point --controller at the right cluster or use an empty "
                "--data-dir"
            )
        try:
            self._meta = MetaProperties.check_or_write(
                self.config.data_dir, node_id=self.node_id, cluster_id=cluster_id
            )
        except StorageError as exc:
            raise StartupError(f"cannot record the cluster id: {exc}") from exc
        except OSError as exc:
            raise StartupError(self._disk_error("cannot record the cluster id", exc)) from exc

    async def _load_logs(self) -> None:
        manager = NoFsyncLogManager if self.config.unsafe_skip_fsync else LogManager
        self.log_manager = manager(
            self.config.data_dir,
            base_log_config(self.config),
            max_open_segment_files=self.config.max_open_segment_files,
        )
        warn_if_open_files_exceed_limit(self.config.max_open_segment_files)
        try:
            loaded = await asyncio.to_thread(self.log_manager.startup)
            hws = self.log_manager.read_high_watermarks()
        except StorageError as exc:
            raise StartupError(f"cannot load the logs in {self.config.data_dir}: {exc}") from exc
        except OSError as exc:
            raise StartupError(self._disk_error("cannot load the logs", exc)) from exc
        self._logs_loaded = True
        log.info(
            "loaded %d logs from %s %s",
            len(loaded),
            self.config.data_dir,
            self.log_manager.shutdown_description,
        )
        self.replica_manager = ReplicaManager(
            self.config,
            self.log_manager,
            self.image,
            base_log_config=base_log_config(self.config),
            checkpointed_high_watermarks=hws,
        )

    async def _bind_listeners(self) -> None:
        assert self.replica_manager is not None
        assert self.controller is None
        # Handlers need the controller channel; it exists before any request is accepted.
        bound: dict[str, int] = {}
        # One table for all listeners: connection limits are per process, as Kafka's.
        table = ConnectionTable(self.config.connection_limits())
        # Client quotas on every listener, secure or not (issue 18).
        quotas = QuotaEnforcer(
            self.image, self.config.quota_window_num, self.config.quota_window_size_seconds
        )
        try:  # the contexts of the connections out, made now: a bad file stops the start
            for protocol in (
                self.config.inter_broker_protocol,
                self.config.controller_security_protocol,
            ):
                outgoing_tls(self.config, protocol)
        except TlsConfigError as exc:
            raise StartupError(f"connections to brokers and controllers: {exc}") from None
        for spec in self.config.listeners:
            protocol = self.config.security_protocol(spec.name)
            try:
                tls = listener_tls(self.config, protocol)
            except TlsConfigError as exc:
                raise StartupError(f"listener {spec.name}: {exc}") from None
            sasl = (
                SaslConfig(
                    self.config.sasl_enabled_mechanisms,
                    image_lookup(lambda: self.image.scram_credentials),
                )
                if uses_sasl(protocol)
                else None
            )
            server = ListenerServer(
                spec.name,
                spec.host,
                spec.port,
                {},
                table=table,
                response_reservation=self.replica_manager.fetch_reservation,
                faults=self.faults,
                codec=KAFKA if spec.name in self.config.kafka_listeners else NATIVE,
                tls=tls,
                sasl=sasl,
                quotas=quotas,
            )
            try:
                bound[spec.name] = await server.bind()
            except OSError as exc:
                why = "port in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
                raise StartupError(
                    f"cannot listen on {spec}: {why}; choose another port in --listeners "
                    "or stop the process that holds it"
                ) from exc
            self.listeners.append(server)
        self.config = self.config.with_bound_ports(bound)

    def _install_handlers(self) -> None:
        assert self.replica_manager is not None and self.controller is not None
        handlers = Handlers(
            node_id=self.node_id,
            image=self.image,
            replica_manager=self.replica_manager,
            controller=self.controller,
            image_updated=self._image_updated,
            max_forward_wait_s=self.config.request_timeout_ms / 1000,
            faults=self.faults,
            coordinator=self.coordinator,
            inter_broker_listener=self.config.listeners[0].name,
            authorizer_enabled=self.config.authorizer_enabled,
        )
        access = RequestAccess(authorizer_settings(self.config), lambda: self.image)
        table = BrokerRequestAccess(access, self.image).wrap(handlers.table())
        for server in self.listeners:
            server.handlers.update(table)

    # ------------------------------------------------------------------ metadata

    async def _on_metadata(self, resp: FetchMetadataResponse) -> None:
        async with self._metadata_lock:
            delta = self.image.apply(
                resp.entries, is_snapshot=resp.is_snapshot, next_offset=resp.next_offset
            )
            if resp.cluster_id:
                self.image.cluster_id = resp.cluster_id
            if delta.removed and self.coordinator is not None:
                self.coordinator.on_partitions_deleted(set(delta.removed))
            if self._published:
                assert self.replica_manager is not None
                await self.replica_manager.apply_delta(delta)
        async with self._image_updated:
            self._image_updated.notify_all()

    async def _publish(self) -> None:
        assert self.replica_manager is not None
        async with self._metadata_lock:
            await self.replica_manager.apply_delta(full_delta(self.image))
            await self.replica_manager.handle_unassigned_logs()
            self._published = True
        self._install_handlers()

    # ------------------------------------------------------------------ running

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._task_done)
        self._tasks.append(task)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error(
                "%s loop failed: %s: %s; shutting down",
                task.get_name(),
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            self.exit_code = 1
            self.stopping.set()

    def request_stop(self, signame: str = "") -> None:
        if self.stopping.is_set():
            return
        if signame:
            log.info("received %s: shutting down", signame)
        self.stopping.set()

    async def run(self) -> int:
        """Start, serve until SIGTERM/SIGINT (or a fatal error), stop. Exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop, sig.name)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
        start = asyncio.create_task(self.start(), name="start")
        stop_wait = asyncio.create_task(self.stopping.wait())
        await asyncio.wait({start, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not start.done():
            await cancel_and_wait([start])
            log.info("start-up interrupted")
            await self.stop(controlled=False)
            stop_wait.cancel()
            return self.exit_code
        stop_wait.cancel()
        exc = start.exception()
        if exc is not None:
            await self.stop(controlled=False)
            if isinstance(exc, StartupError):
                raise exc
            raise exc
        await self.stopping.wait()
        await self.stop(controlled=True)
        return self.exit_code

    # ------------------------------------------------------------------ shutdown

    async def stop(self, *, controlled: bool = True) -> None:
        for server in self.listeners:
            server.stop_accepting()
        channel = self.controller
        heartbeats = [t for t in self._tasks if t.get_name() == "heartbeats"]
        for task in heartbeats:
            task.cancel()
        if controlled and channel is not None and channel.broker_epoch >= 0:
            timeout_s = self.config.controlled_shutdown_timeout_ms / 1000
            log.info("controlled shutdown: asking the controller to move leaderships away")
            ok = await channel.controlled_shutdown(timeout_s)
            if ok:
                log.info("controlled shutdown acknowledged by the controller")
            else:
                log.warning(
                    "controlled shutdown not acknowledged within %.1fs; stopping anyway",
                    timeout_s,
                )
        if channel is not None:
            channel.stop_loops()
        await cancel_and_wait(self._tasks)
        for server in self.listeners:
            await server.close()
        if self.coordinator is not None:
            self.coordinator.close()  # no offsets load may read a closing log
        if self.replica_manager is not None:
            await self.replica_manager.shutdown()
        if self.log_manager is not None and self._logs_loaded:
            try:
                await asyncio.to_thread(self.log_manager.shutdown)
            except (StorageError, OSError) as exc:
                log.error("log shutdown failed: %s", exc)
                self.exit_code = self.exit_code or 1
        if channel is not None:
            await channel.close()
        log.info("broker %d stopped", self.node_id)
