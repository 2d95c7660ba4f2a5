"""What this broker is for a partition it holds a replica of."""

from __future__ import annotations

import enum


class Role(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    OFFLINE = "offline"  # a replica here, but the partition has no leader
    STOPPED = "stopped"  # removed from this broker; in-flight requests must give up
