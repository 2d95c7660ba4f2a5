"""What a request to a controller needs to be allowed (issue 18). The controller listener
is the servers' own: its callers are brokers and the other controllers, and operators'
tools asking the quorum how it is. So every request is decided whole, by the API:

- the servers' APIs (registration, heartbeats, AlterPartition, FetchMetadata, producer
  id blocks, and the quorum's Vote, Begin/EndQuorumEpoch, QuorumFetch, FetchSnapshot):
  ClusterAction on the cluster; one that names a broker must come from the principal
  that registered it (a server cannot pose as another broker; a new registration of
  a fenced broker may come from another);
- the changes a broker forwards for its clients (CreateTopics, DeleteTopics,
  ElectLeaders, AlterUserScramCredentials, Create/DeleteAcls, AlterClientQuotas; the
  broker has checked its client's ACLs): ClusterAction, or Alter (AlterConfigs for
  quotas) on the cluster for an operator's tool;
- Metadata, DescribeCluster, DescribeQuorum: Describe or ClusterAction on the cluster;
- ApiVersions: nothing.

A refusal answers CLUSTER_AUTHORIZATION_FAILED. With the authorizer off, nothing is
checked.
"""

from __future__ import annotations

from typing import Any

from controller.state import MetadataImage
from protocol.api import ApiKey
from protocol.api import api_name
from protocol.errors import ErrorCode
from protocol.messages import Message
from runtime.access import RequestAccess
from runtime.acl import AclOperation
from runtime.acl import NotAuthorizedError
from runtime.server import RequestContext

CLUSTER_ACTION, ALTER, DESCRIBE = (
    AclOperation.CLUSTER_ACTION,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
)
NEEDS: dict[int, tuple[AclOperation, ...]] = {
    int(key): ops
    for keys, ops in (
        (
            (
                ApiKey.BROKER_REGISTRATION,
                ApiKey.BROKER_HEARTBEAT,
                ApiKey.ALTER_PARTITION,
                ApiKey.FETCH_METADATA,
                ApiKey.ALLOCATE_PRODUCER_IDS,
                ApiKey.VOTE,
                ApiKey.BEGIN_QUORUM_EPOCH,
                ApiKey.END_QUORUM_EPOCH,
                ApiKey.QUORUM_FETCH,
                ApiKey.FETCH_SNAPSHOT,
            ),
            (CLUSTER_ACTION,),
        ),
        (
            (
                ApiKey.CREATE_TOPICS,
                ApiKey.DELETE_TOPICS,
                ApiKey.ELECT_LEADERS,
                ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
                ApiKey.CREATE_ACLS,
                ApiKey.DELETE_ACLS,
                ApiKey.FAULT_CONTROL,
            ),
            (CLUSTER_ACTION, ALTER),
        ),
        ((ApiKey.ALTER_CLIENT_QUOTAS,), (CLUSTER_ACTION, AclOperation.ALTER_CONFIGS)),
        (
            (ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER, ApiKey.DESCRIBE_QUORUM),
            (DESCRIBE, CLUSTER_ACTION),
        ),
        ((ApiKey.API_VERSIONS,), ()),
    )
    for key in keys
}


class ControllerRequestAccess:
    def __init__(self, access: RequestAccess, image: Any) -> None:
        """`image`: returns the controller's current MetadataImage."""
        self.access = access
        self._image = image

    def check(self, ctx: RequestContext, api: int, body: Message) -> None:
        """Raise NotAuthorizedError unless `ctx`'s principal may make this request."""
        if not self.access.enabled:
            return
        needs = NEEDS.get(api)
        if needs is None:
            # Served without a rule: refused, never let through (a test lists them all).
            raise NotAuthorizedError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"{api_name(api)} has no authorization rule on the controller",
            )
        if not needs:
            return
        self.access.require_cluster(ctx, api_name(api), *needs)
        broker_id = getattr(body, "broker_id", None)
        if isinstance(broker_id, int):
            image: MetadataImage = self._image()
            broker = image.brokers.get(broker_id)
            # A registration may replace a fenced broker's (its principal may have
            # changed with its certificate), never a live one registered by another.
            registering = api == ApiKey.BROKER_REGISTRATION
            if (
                broker is not None
                and broker.principal not in (None, ctx.principal)
                and not (registering and broker.fenced)
            ):
                raise NotAuthorizedError(
                    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    f"{ctx.principal} sent {api_name(api)} for broker {broker_id}, which "
                    f"registered as {broker.principal}",
                )
