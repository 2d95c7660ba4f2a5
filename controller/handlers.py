"""The controller's dispatcher: one table of served APIs (api key -> the handler that
answers it) drives both the dispatch and the ApiVersions answer, and the handlers
live in the controller's parts, split by job as Kafka splits its QuorumController:

- cluster_membership.py: BrokerRegistration, BrokerHeartbeat, fencing, unfencing;
- replication_control.py: AlterPartition, ElectLeaders, partition changes on fencing;
- topic_control.py: CreateTopics, DeleteTopics;
- producer_id_control.py: AllocateProducerIds;
- metadata_service.py: Metadata, DescribeCluster, FetchMetadata (read-only).

A handler that changes metadata hands a `build` function to the single writer
(metadata_writer.py): it decides from the image under the writer's lock, returns
the records and the answer, and the answer goes out only after the records are
durable and applied. Handlers that only read answer from the image directly.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

from controller.acl_control import AclControl
from controller.cluster_membership import ClusterMembership
from controller.config import ControllerConfig
from controller.context import ControllerContext
from controller.context import ControllerPart
from controller.faults import Faults
from controller.faults import faults_for
from controller.liveness import BrokerSessions
from controller.metadata_service import MetadataService
from controller.metadata_writer import MetadataWriter
from controller.producer_id_control import PRODUCER_ID_BLOCK_SIZE
from controller.producer_id_control import ProducerIdControl
from controller.quota_control import QuotaControl
from controller.replication_control import ReplicationControl
from controller.scram_control import ScramControl
from controller.topic_control import TopicControl
from protocol.api import ApiKey
from protocol.messages import API_SPECS
from protocol.messages import ApiVersionRange
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import FaultControlRequest
from protocol.messages import FaultControlResponse
from protocol.messages import Message

__all__ = ["PRODUCER_ID_BLOCK_SIZE", "SERVED_APIS", "ControllerHandlers", "ServedApi"]

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[Message]]


class ServedApi(NamedTuple):
    handler: str  # the ControllerHandlers attribute that answers it
    test_faults_only: bool = False  # served only with --enable-test-faults


# The APIs a controller serves, in ApiVersions order; everything else is answered
# INVALID_REQUEST by the connection layer ("unknown or unserved API key").
SERVED_APIS: dict[ApiKey, ServedApi] = {
    ApiKey.API_VERSIONS: ServedApi("api_versions"),
    ApiKey.METADATA: ServedApi("metadata"),
    ApiKey.CREATE_TOPICS: ServedApi("create_topics"),
    ApiKey.DELETE_TOPICS: ServedApi("delete_topics"),
    ApiKey.ALTER_PARTITION: ServedApi("alter_partition"),
    ApiKey.DESCRIBE_CLUSTER: ServedApi("describe_cluster"),
    ApiKey.BROKER_REGISTRATION: ServedApi("broker_registration"),
    ApiKey.BROKER_HEARTBEAT: ServedApi("broker_heartbeat"),
    ApiKey.FETCH_METADATA: ServedApi("fetch_metadata"),
    ApiKey.ALLOCATE_PRODUCER_IDS: ServedApi("allocate_producer_ids"),
    ApiKey.ELECT_LEADERS: ServedApi("elect_leaders"),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: ServedApi("alter_user_scram_credentials"),
    ApiKey.CREATE_ACLS: ServedApi("create_acls"),
    ApiKey.DELETE_ACLS: ServedApi("delete_acls"),
    ApiKey.ALTER_CLIENT_QUOTAS: ServedApi("alter_client_quotas"),
    ApiKey.FAULT_CONTROL: ServedApi("fault_control", test_faults_only=True),
}


class ControllerHandlers(ControllerPart):
    """The controller's parts behind one dispatch table, `handlers` (api key ->
    handler), which the server looks a request's handler up in."""

    def __init__(
        self,
        config: ControllerConfig,
        writer: MetadataWriter,
        sessions: BrokerSessions,
        cluster_id: str,
        *,
        new_cluster: bool = False,
        rng: random.Random | None = None,
        faults: Faults | None = None,
    ) -> None:
        """`new_cluster`: this start formatted `cluster_id` on an empty data dir."""
        if faults is None:
            faults = faults_for(
                config.node_id,
                enabled=config.enable_test_faults,
                protections_off=config.protections_off,
            )
        super().__init__(
            ControllerContext(
                config=config,
                writer=writer,
                sessions=sessions,
                cluster_id=cluster_id,
                faults=faults,
                rng=rng or random.Random(),
                new_cluster=new_cluster,
            )
        )
        self.faults = faults
        self.replication = ReplicationControl(self.ctx)
        self.membership = ClusterMembership(self.ctx, self.replication)
        self.topic_control = TopicControl(self.ctx)
        self.producer_ids = ProducerIdControl(self.ctx)
        self.metadata_service = MetadataService(self.ctx)
        self.scram_control = ScramControl(self.ctx)
        self.acl_control = AclControl(self.ctx)
        self.quota_control = QuotaControl(self.ctx)

        self.broker_registration = self.membership.broker_registration
        self.broker_heartbeat = self.membership.broker_heartbeat
        self.fence_expired_brokers = self.membership.fence_expired_brokers
        self.alter_partition = self.replication.alter_partition
        self.elect_leaders = self.replication.elect_leaders
        self.rebalance_leaders = self.replication.rebalance_leaders
        self.create_topics = self.topic_control.create_topics
        self.delete_topics = self.topic_control.delete_topics
        self.allocate_producer_ids = self.producer_ids.allocate_producer_ids
        self.alter_user_scram_credentials = self.scram_control.alter_user_scram_credentials
        self.create_acls = self.acl_control.create_acls
        self.delete_acls = self.acl_control.delete_acls
        self.alter_client_quotas = self.quota_control.alter_client_quotas
        self.metadata = self.metadata_service.metadata
        self.describe_cluster = self.metadata_service.describe_cluster
        self.fetch_metadata = self.metadata_service.fetch_metadata

        self.handlers: dict[int, Handler] = {
            key: getattr(self, api.handler)
            for key, api in SERVED_APIS.items()
            if self.faults.enabled or not api.test_faults_only
        }
        if config.enable_test_faults:
            log.warning(
                "TEST FAULTS ENABLED: never use this in production (controller %d)",
                config.node_id,
            )
        if config.unsafe_keep_restarted_replicas_in_isr:
            log.warning(
                "UNSAFE TEST SWITCH --unsafe-keep-restarted-replicas-in-isr is ON: a broker that "
                "registers again stays in the ISRs it was in (ZooKeeper-era behaviour, KIP-101 "
                "scenario 1); a restarted replica that lost data can be elected. Never run this "
                "in production."
            )
        if config.unsafe_ignore_broker_epochs:
            log.warning(
                "UNSAFE TEST FAULT ON: AlterPartition does NOT check ISR members' broker epochs "
                "(KIP-903 protection off); a rebooted replica with an empty disk can rejoin the "
                "ISR. Never run this in production."
            )

    # Tests read and set these.

    @property
    def new_cluster(self) -> bool:
        return self.ctx.new_cluster

    @new_cluster.setter
    def new_cluster(self, value: bool) -> None:
        self.ctx.new_cluster = value

    @property
    def unclean_elections(self) -> int:
        return self.ctx.unclean_elections

    async def api_versions(self, request: ApiVersionsRequest) -> ApiVersionsResponse:
        """Exactly the APIs of the dispatch table."""
        return ApiVersionsResponse(
            api_keys=[
                ApiVersionRange(
                    api_key=int(key),
                    min_version=API_SPECS[key].min_version,
                    max_version=API_SPECS[key].max_version,
                )
                for key in self.handlers
            ]
        )

    async def fault_control(self, request: FaultControlRequest) -> FaultControlResponse:
        """Test only (served with --enable-test-faults): see controller/faults.py."""
        return self.faults.control(request)
