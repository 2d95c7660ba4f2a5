"""Consumer groups on the broker: a group's state (group.py), the classic rebalance
protocol (membership.py), the records of __consumer_offsets (records.py) and what one
of its partitions holds in memory (shard_cache.py). The coordinator that serves the
APIs over them: broker/group_coordinator.py."""
