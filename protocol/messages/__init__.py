"""Request and response bodies of every API, as msgspec Structs (MessagePack maps).

Field names follow Kafka's JSON schemas so users can look them up. Every epoch field
defaults to -1, the sentinel that skips its check. New fields are only ever added
with a default, so an older peer's message still decodes (unknown fields are ignored).

Record data (`records`) is carried as raw bytes: one or more RecordBatch v2 batches,
never re-encoded per record. It is typed `memoryview` so that decoding does not copy
it: the field is a view into the received frame (which the frame decoder hands over
and never reuses). Any bytes-like value may be given when building a message.

Six modules (client_apis.py, group_apis.py, quorum_apis.py: the controller quorum's,
security_apis.py, quota_apis.py: client quotas, and cluster_apis.py, which also holds
the registry); every name is importable from `protocol.messages` as before.
"""

from __future__ import annotations

from protocol.messages import client_apis
from protocol.messages import cluster_apis
from protocol.messages import group_apis
from protocol.messages import quorum_apis
from protocol.messages import quota_apis
from protocol.messages import security_apis
from protocol.messages.client_apis import *  # noqa: F403
from protocol.messages.cluster_apis import *  # noqa: F403
from protocol.messages.group_apis import *  # noqa: F403
from protocol.messages.quorum_apis import *  # noqa: F403
from protocol.messages.quota_apis import *  # noqa: F403
from protocol.messages.security_apis import *  # noqa: F403

__all__ = [
    *client_apis.__all__,
    *cluster_apis.__all__,
    *group_apis.__all__,
    *quorum_apis.__all__,
    *quota_apis.__all__,
    *security_apis.__all__,
]
