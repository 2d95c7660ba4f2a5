"""The controller process's life: open the data dir, replay, serve, fence, stop.

`run(config)` is what `python -m controller` calls; it returns the exit code
(0 after SIGTERM/SIGINT, 1 after a startup problem or a metadata log write failure,
each reported as one line on stderr).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import sys

import uvloop

from controller.config import ControllerConfig
from controller.errors import ControllerError
from controller.errors import CorruptMetadataError
from controller.errors import DataDirError
from controller.errors import InvariantViolation
from controller.faults import faults_for
from controller.handlers import ControllerHandlers
from controller.liveness import BrokerSessions
from controller.meta_properties import META_PROPERTIES
from controller.meta_properties import DataDirLock
from controller.meta_properties import load_or_create
from controller.meta_properties import prepare_data_dir
from controller.metadata_log import MetadataLog
from controller.metadata_log import Recovered
from controller.metadata_writer import MetadataWriter
from controller.quorum.driver import NotLeaderError
from controller.quorum.driver import QuorumDriver
from controller.quorum.quorum_state import QuorumStateFile
from controller.quorum.replica import QuorumSettings
from controller.quorum.replica import Role
from controller.quorum.replicated_log import ReplicatedMetadataLog
from controller.quorum.voting_rights import may_vote_at_start
from controller.server import ControllerServer
from controller.state import MetadataImage
from runtime.process_start import after_start
from runtime.settings import ConfigError
from runtime.tls import TlsConfigError
from runtime.tls_settings import listener_tls
from runtime.tls_settings import outgoing_tls

log = logging.getLogger(__name__)


def setup_logging(config: ControllerConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s %(levelname)s [node {config.node_id}] %(name)s: %(message)s"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.log_level.upper())


def _has_metadata(config: ControllerConfig) -> bool:
    for path in config.data_dir.iterdir():
        name = path.name
        if name.startswith("snapshot-") and name.endswith(".msgpack"):
            return True
        if name.startswith("metadata-") and name.endswith(".log") and path.stat().st_size > 0:
            return True
    return False


def _lost_metadata(
    config: ControllerConfig, state_file: QuorumStateFile, recovered: Recovered
) -> str | None:
    """Why an empty metadata log cannot be this controller's, or None. A controller
    that has led an epoch (its quorum-state says so) wrote that epoch's first entry
    (a LeaderChangeRecord) to its log: with no entry and no snapshot left, its log was
    lost (an emptied or lost volume), and starting would serve an empty cluster under
    the cluster id the brokers accept. (A crash between persisting the election and
    writing its entry looks the same; the message says what to do then.)"""
    if recovered.entries or recovered.snapshot_offset >= 0:
        return None
    state = state_file.read()
    if state.epoch < 1 or state.leader_id != config.node_id:
        return None
    return (
        f"the metadata log in {config.data_dir} is empty, but this controller led the "
        f"quorum in epoch {state.epoch} ({state_file.path}) and so had written to it: the "
        "cluster's metadata is lost (an emptied or lost volume?). Restore the data dir "
        "from a backup. If the cluster never held any metadata (the controller stopped "
        f"during its first election), move {state_file.path} aside and start again"
    )


def recover(
    config: ControllerConfig, *, entries: bool = True
) -> tuple[MetadataLog, MetadataImage, Recovered]:
    """Open the metadata log and rebuild the image (raises CorruptMetadataError).
    `entries` False: the snapshot only (a voter of a larger quorum applies entries as
    they are known to be committed)."""
    metadata_log, recovered = MetadataLog.open(config.data_dir)
    image = MetadataImage()
    try:
        if recovered.snapshot_offset >= 0:
            image.load_snapshot(recovered.snapshot_offset, recovered.snapshot_records)
        for entry in recovered.entries if entries else ():
            image.apply(entry.offset, entry.record)
    except InvariantViolation as exc:
        metadata_log.close()
        raise CorruptMetadataError(
            f"metadata log in {config.data_dir} breaks an invariant on replay ({exc}); restore "
            "the data dir from a backup"
        ) from None
    return metadata_log, image, recovered


class ControllerProcess:
    """Everything one running controller owns. Tests may drive it in-process."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.stop_event = asyncio.Event()
        self.fatal: str | None = None
        self.lock = DataDirLock(config.data_dir)
        self.server: ControllerServer | None = None
        self.writer: MetadataWriter | None = None
        self.handlers: ControllerHandlers | None = None
        self.driver: QuorumDriver | None = None
        self.sessions: BrokerSessions | None = None
        self._liveness: asyncio.Task[None] | None = None
        self._rebalance: asyncio.Task[None] | None = None
        self._bootstrap_password: str | None = None  # --sasl-bootstrap-username's
        self._bootstrap: asyncio.Task[None] | None = None

    def _on_fatal(self, message: str) -> None:
        self.fatal = message
        self.stop_event.set()

    async def start(self) -> tuple[str, int]:
        config = self.config
        prepare_data_dir(config.data_dir)
        self.lock.acquire()
        try:
            try:
                # No identity yet: this start formats a new cluster id.
                new_cluster = not (config.data_dir / META_PROPERTIES).exists()
                if len(config.voters) > 1 and new_cluster and not config.cluster_id:
                    raise DataDirError(
                        f"a quorum of {len(config.voters)} controllers needs --cluster-id, the "
                        "same on every one of them (any string of letters, digits, - and _)"
                    )
                meta = load_or_create(
                    config.data_dir,
                    config.node_id,
                    has_metadata=_has_metadata(config),
                    cluster_id=config.cluster_id,
                )
                state_file = QuorumStateFile(config.data_dir)
                had_state = state_file.exists()
                single = len(config.voters) == 1
                metadata_log, image, recovered = recover(config, entries=single)
                lost = _lost_metadata(config, state_file, recovered) if had_state else None
                if lost is not None:
                    metadata_log.close()
                    raise CorruptMetadataError(lost)
            except OSError as exc:
                raise DataDirError(
                    f"cannot use data dir {config.data_dir}: {exc}; check the disk and the "
                    "permissions of --data-dir"
                ) from None
            try:  # both made now: a file that cannot be used stops the start
                listener_tls(config, config.security_protocol)
                peer_tls = outgoing_tls(config, config.security_protocol)
                self._bootstrap_password = config.bootstrap_password()
            except (TlsConfigError, ConfigError) as exc:
                raise ControllerError(str(exc)) from None
            self.sessions = BrokerSessions(config.session_timeout_s)
            faults = faults_for(
                config.node_id,
                enabled=config.enable_test_faults,
                protections_off=config.protections_off,
            )
            self.driver = QuorumDriver(
                node_id=config.node_id,
                voters=config.voters,
                cluster_id=meta.cluster_id,
                metadata_log=metadata_log,
                recovered=recovered,
                state_file=state_file,
                settings=QuorumSettings(
                    fetch_timeout_ms=config.quorum_fetch_timeout_ms,
                    election_timeout_ms=config.quorum_election_timeout_ms,
                    election_backoff_max_ms=config.quorum_election_timeout_ms,
                ),
                faults=faults,
                # A voter of a larger quorum without its quorum state (a first start,
                # a lost disk), or whose log was lost, votes only once it knows the
                # quorum is new or has caught up (voting_rights.py).
                may_vote=may_vote_at_start(
                    single_voter=single,
                    state=state_file.read() if had_state else None,
                    log_empty=not recovered.entries and recovered.snapshot_offset < 0,
                ),
                on_committed=self._on_committed,
                on_role=self._on_role,
                on_fatal=self._on_fatal,
                tls=peer_tls,
            )
            self.writer = MetadataWriter(
                ReplicatedMetadataLog(self.driver, metadata_log),
                image,
                snapshot_every=config.snapshot_every,
                max_waiters=config.max_metadata_waiters,
                retained=recovered.entries if single else [],
                snapshot_offset=recovered.snapshot_offset,
                on_fatal=self._on_fatal,
            )
            self.handlers = ControllerHandlers(
                config,
                self.writer,
                self.sessions,
                meta.cluster_id,
                new_cluster=new_cluster,
                faults=faults,
            )
            self.server = ControllerServer(config, self.handlers, self.driver)
            self.driver.start()
            try:
                host, port = await self.server.start()
            except OSError as exc:
                hint = (
                    "is another controller running? stop it or choose another --listen"
                    if exc.errno == errno.EADDRINUSE
                    else "check --listen"
                )
                reason = os.strerror(exc.errno) if exc.errno else str(exc)
                raise ControllerError(
                    f"cannot listen on {config.listen}: {reason}; {hint}"
                ) from None
        except BaseException:
            await self._release()
            raise
        if len(config.voters) == 1:
            # A quorum of one: DescribeQuorum names the address actually bound.
            self.driver.voters[config.node_id] = (host, port)
        self._liveness = asyncio.create_task(self._liveness_loop())
        if config.auto_leader_rebalance_enable:
            self._rebalance = asyncio.create_task(self._rebalance_loop())
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        log.info(
            "controller %d listening on %s (cluster %s, metadata offset %d, %d brokers, "
            "%d topics, data dir %s)",
            config.node_id,
            listen,
            meta.cluster_id,
            image.last_offset,
            len(image.brokers),
            len(image.topics),
            config.data_dir,
        )
        after_start(f"controller-{config.node_id}")
        return host, port

    def _on_committed(self, high_watermark: int) -> None:
        if self.writer is not None:
            self.writer.apply_committed()

    def _on_role(self, role: Role, epoch: int, leader_id: int) -> None:
        if role is Role.LEADER:
            assert self.writer is not None and self.sessions is not None
            # KRaft's rule: a new active controller gives every live broker a full
            # session (their heartbeats went to the old one), so none is fenced for it.
            self.sessions.touch_all(
                (b.broker_id, b.broker_epoch)
                for b in self.writer.image.brokers.values()
                if not b.fenced
            )
            log.info(
                "controller %d is the active controller (quorum epoch %d)",
                self.config.node_id,
                epoch,
            )
            if self._bootstrap_password is not None and self._bootstrap is None:
                self._bootstrap = asyncio.get_running_loop().create_task(
                    self._write_bootstrap_user(self._bootstrap_password)
                )
        else:
            log.info(
                "controller %d is a %s in quorum epoch %d (leader %s)",
                self.config.node_id,
                role.value,
                epoch,
                leader_id if leader_id >= 0 else "unknown",
            )

    async def _write_bootstrap_user(self, password: str) -> None:
        """--sasl-bootstrap-username's credentials, if absent (scram_control.py); a
        leadership lost first leaves it to the next active controller."""
        assert self.handlers is not None and self.config.sasl_bootstrap_username
        try:
            await self.handlers.scram_control.write_bootstrap_user(
                self.config.sasl_bootstrap_username, password
            )
        except (NotLeaderError, ControllerError):
            pass  # the next active controller writes it; a failed log stops the process
        except Exception:
            log.exception("writing the bootstrap user failed")
        finally:
            self._bootstrap = None

    async def _liveness_loop(self) -> None:
        assert self.handlers is not None and self.driver is not None
        # A few checks per session timeout, one timer for all brokers. Each check notes
        # the time: a long gap between two is a controller stall (liveness.py).
        interval = self.handlers.sessions.check_interval_s
        while True:
            await asyncio.sleep(interval)
            if not self.driver.replica.is_leader:
                self.handlers.sessions.observe()  # a follower's clock, no fencing
                continue
            try:
                await self.handlers.fence_expired_brokers()
            except asyncio.CancelledError:
                raise
            except NotLeaderError:
                continue  # leadership moved during the check
            except ControllerError:
                return  # the writer failed and asked the process to stop
            except Exception:
                log.exception("fencing expired brokers failed")

    async def _rebalance_loop(self) -> None:
        """The active controller moves leaderships back to preferred replicas now and
        then (auto.leader.rebalance.enable), so that after failures and restarts the
        load does not stay piled on the brokers that survived."""
        assert self.handlers is not None and self.driver is not None
        interval = self.config.leader_imbalance_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            if not self.driver.replica.is_leader:
                continue
            try:
                await self.handlers.rebalance_leaders()
            except asyncio.CancelledError:
                raise
            except NotLeaderError:
                continue
            except ControllerError:
                return  # the writer failed and asked the process to stop
            except Exception:
                log.exception("the leader rebalance failed")

    async def _release(self) -> None:
        if self.driver is not None:
            await self.driver.stop(resign=True)
        if self.writer is not None:
            await self.writer.close()
            self.writer = None
        self.lock.release()

    async def stop(self) -> None:
        if self._bootstrap is not None:
            self._bootstrap.cancel()
            await asyncio.gather(self._bootstrap, return_exceptions=True)
        for task in (self._liveness, self._rebalance):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.server is not None:
            await self.server.close()
        await self._release()
        log.info("controller %d stopped", self.config.node_id)

    async def run_until_stopped(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        await self.start()
        try:
            await self.stop_event.wait()
        finally:
            await self.stop()
        if self.fatal is not None:
            print(f"Error: {self.fatal}", file=sys.stderr, flush=True)
            return 1
        return 0


def run(config: ControllerConfig) -> int:
    """Run a controller until SIGTERM/SIGINT; return the process exit code."""
    setup_logging(config)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(ControllerProcess(config).run_until_stopped())
    except ControllerError as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
