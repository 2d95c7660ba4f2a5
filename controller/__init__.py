"""The minibroker controller process: the cluster's metadata owner.

It keeps a durable metadata log (records appended and fsynced before a change is
acknowledged, replayed at start, snapshotted now and then), tracks broker liveness
and fencing, elects partition leaders, and serves brokers and tools over the wire
protocol. Run it with `python -m controller`.
"""
