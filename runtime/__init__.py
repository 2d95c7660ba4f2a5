"""The shared runtime of the minibroker processes (Kafka's server-common): the pieces
that broker, controller and client all need above the sans-I/O `protocol` package.

- settings.py     the declarative configuration machinery: settings declared once as
                  config-dataclass fields, and from them the flags, MINIBROKER_*
                  environment variables, TOML loading, validation and README tables.
- fileio.py       durable files: atomic_write, fsync_directory, the data-dir lock,
                  the serial writer thread.
- meta_properties.py  `meta.properties`, the identity of a data directory.
- rpc.py          the one pipelined request/response connection (bounded in flight,
                  a timed-out request closes it, write backpressure), under the
                  reconnecting RpcClient and the client's BrokerConnection.
- peer_rpc.py     the reconnecting client for one peer (RpcClient, the Rpc* errors):
                  a broker's controller channel and follower fetches, a
                  controller's quorum peers.
- server.py       the one server loop: listeners, connection bounds, dispatch.
- metadata_image.py, metadata_answers.py  the one replay of metadata records and the
                  one builder of Metadata / DescribeCluster answers.
- faults.py       the test-only fault controls (FaultControl): delay, drop, drop the
                  answer, hold; the rules themselves are protocol/fault_plan.py.

Dependencies: runtime depends only on protocol; broker, controller and client depend
on runtime and protocol, never on each other.
"""
