"""Collect every broker's replica logs with DescribeReplicaLog, for the checker.

A raw request over `protocol.connection.ClientConnection` straight to each broker's
address (the client library would route by metadata, which lists unfenced brokers
only; a broker that is up but fenced still has a replica worth comparing).

The result (replicas.json in a run directory):

    {"available": bool, "reason": str | null, "errors": [str],
     "partitions": {partition: {broker id: {"log_start_offset", "log_end_offset",
         "high_watermark", "leader_id", "leader_epoch", "isr", "epoch_entries":
         [[epoch, start offset]], "batches": [[base, last, leader epoch, crc]]}}}}

`available` is false when no broker serves DescribeReplicaLog (it answers
INVALID_REQUEST or UNSUPPORTED_VERSION: an older broker), so the checker reports
"replica comparison unavailable" instead of passing silently.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Mapping
from typing import Any

from protocol.connection import Response
from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.messages import DescribeReplicaLogRequest
from protocol.messages import DescribeReplicaLogResponse
from protocol.messages import Message
from runtime.peer_rpc import RpcClient
from runtime.peer_rpc import RpcError
from runtime.peer_rpc import RpcErrorResponse
from runtime.sasl import SaslCredentials

log = logging.getLogger(__name__)

_NOT_SERVED = (ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION)


class ReplicaLogUnsupported(Exception):
    """The broker does not serve DescribeReplicaLog."""


async def request(
    host: str,
    port: int,
    body: Message,
    *,
    timeout: float = 5.0,
    tls: ssl.SSLContext | None = None,
    sasl: SaslCredentials | None = None,
) -> Response:
    """One request on a fresh connection (TLS with `tls`, authenticated as `sasl`);
    the whole exchange bounded by `timeout`."""
    client = RpcClient(
        host,
        port,
        name="broker",
        client_id="minibroker-chaos",
        request_timeout_s=timeout,
        connect_timeout_s=timeout,
        max_in_flight=1,
        tls=tls,
        sasl=sasl,
    )
    try:
        async with asyncio.timeout(timeout):
            answer = await client.request(body)
    except RpcErrorResponse as exc:
        return Response(-1, None, exc.error, exc.message)
    except RpcError as exc:
        raise OSError(str(exc)) from exc
    finally:
        await client.close()
    return Response(-1, answer, ErrorCode.NONE, "")


async def describe_replica(
    host: str,
    port: int,
    topic: str,
    partition: int,
    *,
    timeout: float = 5.0,
    tls: ssl.SSLContext | None = None,
    sasl: SaslCredentials | None = None,
) -> dict[str, Any] | None:
    """One replica as a dict, None when the broker hosts none of the partition.
    Raises ReplicaLogUnsupported, or OSError / TimeoutError / DecodeError."""
    response = await request(
        host,
        port,
        DescribeReplicaLogRequest(topic=topic, partition=partition),
        timeout=timeout,
        tls=tls,
        sasl=sasl,
    )
    if response.error_code in _NOT_SERVED:
        raise ReplicaLogUnsupported(
            f"{host}:{port} answered DescribeReplicaLog with {response.error_code.name} "
            f"({response.error_message})"
        )
    if response.error_code != ErrorCode.NONE:
        raise OSError(f"{host}:{port}: {response.error_code.name} {response.error_message}")
    body = response.body
    assert isinstance(body, DescribeReplicaLogResponse)
    if body.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return None
    if body.error_code != ErrorCode.NONE:
        raise OSError(
            f"{host}:{port}: DescribeReplicaLog {topic}-{partition}: "
            f"{ErrorCode(body.error_code).name} {body.error_message}"
        )
    return {
        "log_start_offset": body.log_start_offset,
        "log_end_offset": body.log_end_offset,
        "high_watermark": body.high_watermark,
        "leader_id": body.leader_id,
        "leader_epoch": body.leader_epoch,
        "isr": list(body.isr),
        "epoch_entries": [[e.epoch, e.start_offset] for e in body.epoch_entries],
        "batches": [[b.base_offset, b.last_offset, b.leader_epoch, b.crc] for b in body.batches],
    }


async def collect(
    brokers: Mapping[int, tuple[str, int]],
    topic: str,
    partitions: int,
    *,
    timeout: float = 5.0,
    tls: ssl.SSLContext | None = None,
    sasl: SaslCredentials | None = None,
) -> dict[str, Any]:
    """Every broker's replica of every partition (see the module doc)."""
    out: dict[str, Any] = {"available": True, "reason": None, "errors": [], "partitions": {}}
    unsupported: list[str] = []
    for node_id, (host, port) in sorted(brokers.items()):
        for p in range(partitions):
            try:
                replica = await describe_replica(
                    host, port, topic, p, timeout=timeout, tls=tls, sasl=sasl
                )
            except ReplicaLogUnsupported as exc:
                unsupported.append(f"broker {node_id}: {exc}")
                break
            except (OSError, TimeoutError, DecodeError) as exc:
                out["errors"].append(f"broker {node_id} partition {p}: {exc!r}")
                continue
            if replica is not None:
                out["partitions"].setdefault(str(p), {})[str(node_id)] = replica
    if unsupported:
        out["available"] = False
        out["reason"] = "; ".join(unsupported)
    elif not out["partitions"]:
        out["available"] = False
        out["reason"] = "no broker answered for any partition: " + "; ".join(out["errors"][:3])
    return out


async def collect_converged(
    brokers: Mapping[int, tuple[str, int]],
    topic: str,
    partitions: int,
    *,
    wait: float = 30.0,
    tls: ssl.SSLContext | None = None,
    sasl: SaslCredentials | None = None,
) -> dict[str, Any]:
    """Collect, waiting up to `wait` seconds for the replicas of each partition to agree
    on their log end offset and high watermark (the workload has stopped: followers
    catch up and truncate their uncommitted tails). Returns the last collection with
    `converged` set."""
    deadline = time.monotonic() + wait
    while True:
        result = await collect(brokers, topic, partitions, tls=tls, sasl=sasl)
        converged = (
            result["available"]
            and not result["errors"]
            and all(
                len({(r["log_end_offset"], r["high_watermark"]) for r in by_broker.values()}) == 1
                for by_broker in result["partitions"].values()
            )
        )
        result["converged"] = bool(converged)
        if converged or not result["available"] or time.monotonic() >= deadline:
            return result
        await asyncio.sleep(1.0)
