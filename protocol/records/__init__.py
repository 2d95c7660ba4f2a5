"""Kafka's RecordBatch v2, split by job; `protocol.record_batch` is the public face."""
