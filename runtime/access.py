"""Who may make a request (issue 18): the one object both servers ask, built on the
ACL rule of runtime/acl.py and the ACLs of the process's metadata image. A request
comes with its RequestContext (principal, peer address); the resource is a topic, a
group or the cluster.

With the authorizer off every check passes at the cost of one attribute read. A
refusal is logged at most once per LOG_INTERVAL_S with a count of the rest (a denied
client retrying must not flood the log), naming the principal, host, operation and
resource, so an operator sees which ACL is missing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Protocol
from typing import TypeVar

from protocol.errors import ErrorCode
from runtime.acl import CLUSTER_NAME
from runtime.acl import AclAuthorizer
from runtime.acl import AclBinding
from runtime.acl import AclOperation
from runtime.acl import AuthorizerSettings
from runtime.acl import NotAuthorizedError
from runtime.acl import ResourceType
from runtime.acl import display_name
from runtime.server import RequestContext

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0
T = TypeVar("T")


def peer_host(peer: str) -> str:
    """The address part of "host:port" (an IPv6 address keeps its colons)."""
    return peer.rsplit(":", 1)[0] if ":" in peer else peer


class ImageWithAcls(Protocol):
    """What runtime/metadata_image.py's images have."""

    @property
    def acls(self) -> Mapping[str, AclBinding]: ...
    @property
    def acl_generation(self) -> int: ...


class RequestAccess:
    """`image` returns the process's current metadata image (the controller's may be
    replaced when a snapshot is loaded)."""

    def __init__(self, settings: AuthorizerSettings, image: Callable[[], ImageWithAcls]) -> None:
        self.authorizer = AclAuthorizer(settings)
        self._image = image
        self._last_logged = 0.0
        self._unlogged = 0

    @property
    def enabled(self) -> bool:
        return self.authorizer.enabled

    def allowed(
        self,
        ctx: RequestContext,
        operation: AclOperation,
        kind: ResourceType,
        name: str,
        *,
        quiet: bool = False,
    ) -> bool:
        """`quiet`: a refusal is not logged (a check with another way to pass)."""
        if not self.authorizer.enabled:
            return True
        host = peer_host(ctx.peer)
        image = self._image()
        if self.authorizer.authorize(
            ctx.principal, host, operation, kind, name, image.acls, image.acl_generation
        ):
            return True
        if not quiet:
            self._log_denial(ctx, host, operation, kind, name)
        return False

    def cluster(self, ctx: RequestContext, *operations: AclOperation, quiet: bool = False) -> bool:
        """Whether any of `operations` is allowed on the cluster."""
        return any(
            self.allowed(ctx, op, ResourceType.CLUSTER, CLUSTER_NAME, quiet=quiet)
            for op in operations
        )

    def require_cluster(self, ctx: RequestContext, api: str, *operations: AclOperation) -> None:
        """Raise NotAuthorizedError unless one of `operations` is allowed on the cluster."""
        if not self.cluster(ctx, *operations):
            wanted = " or ".join(display_name(op) for op in operations)
            raise NotAuthorizedError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"{ctx.principal} may not call {api}: it needs {wanted} on the cluster "
                "(an ACL: minibroker acl add, or --super-users)",
            )

    def split(
        self,
        ctx: RequestContext,
        operation: AclOperation,
        kind: ResourceType,
        items: Iterable[T],
        name: Callable[[T], str],
    ) -> tuple[list[T], list[T]]:
        """`items` into those allowed `operation` on their resource and the rest."""
        kept: list[T] = []
        refused: list[T] = []
        for item in items:
            (kept if self.allowed(ctx, operation, kind, name(item)) else refused).append(item)
        return kept, refused

    def _log_denial(
        self,
        ctx: RequestContext,
        host: str,
        operation: AclOperation,
        kind: ResourceType,
        name: str,
    ) -> None:
        now = time.monotonic()
        if now - self._last_logged < LOG_INTERVAL_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more refusals since the last line)" if self._unlogged else ""
        self._last_logged, self._unlogged = now, 0
        log.warning(
            "refused: %s from %s may not %s %s %r (listener %s)%s",
            ctx.principal,
            host,
            display_name(operation),
            display_name(kind),
            name,
            ctx.listener,
            more,
        )
