"""minibroker's wire protocol, sans-I/O: framing, headers, message schemas, error
codes and the RecordBatch v2 codec. No sockets, no event loop, no files."""
