"""The controller quorum under test: what its voters say during a run, and their
metadata logs after it, for the checker's metadata check (checker.py).

- `QuorumWatch`: every `interval` seconds, DescribeQuorum of every controller (each
  bounded by a timeout, all at once); each round is one history op of process
  "quorum", f "quorum-sample", type info, with extra {"voters": {id: {"role",
  "leader_id", "leader_epoch", "high_watermark", "log_end_offset"}}} (a controller that
  did not answer is absent; a round nobody answered is not recorded).
- `collect_metadata(backend, dest)`: after the heal, each controller's data directory
  is copied (`Backend.copy_data`) and read back as a restart would read it
  (`MetadataLog.open` on the copy), plus one last DescribeQuorum of each. The result
  (metadata.json in a run directory):

      {"available": bool, "reason": str | null, "errors": [str], "voter-count": int,
       "voters": {id: {"snapshot": [last offset, epoch] | null,
                       "entries": [[offset, epoch, crc32 of the encoded entry]]}},
       "final": {id: {the DescribeQuorum fields above}}}
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
import zlib
from pathlib import Path
from typing import Any

from controller.errors import CorruptMetadataError
from controller.metadata_log import MetadataLog
from controller.metadata_log import encode_entry
from protocol.messages import DescribeQuorumResponse
from runtime.active_controller import describe_quorum_at
from runtime.peer_rpc import RpcError

from .backends import Backend
from .backends import BackendError
from .history import INFO
from .history import History

log = logging.getLogger(__name__)

QUORUM = "quorum"  # the history's process for quorum samples
SAMPLE = "quorum-sample"
_CLIENT_ID = "minibroker-chaos"
COPY_TRIES = 3


def _state(answer: DescribeQuorumResponse) -> dict[str, Any]:
    return {
        "role": answer.role,
        "leader_id": answer.leader_id,
        "leader_epoch": answer.leader_epoch,
        "high_watermark": answer.high_watermark,
        "log_end_offset": answer.log_end_offset,
    }


async def describe_all(
    addresses: dict[int, tuple[str, int]], timeout_s: float, tls: ssl.SSLContext | None = None
) -> dict[int, dict[str, Any]]:
    """Every controller's DescribeQuorum answer, at once; the silent ones left out."""

    async def one(address: tuple[str, int]) -> DescribeQuorumResponse | None:
        try:
            async with asyncio.timeout(timeout_s + 1.0):
                return await describe_quorum_at(address, _CLIENT_ID, timeout_s, tls=tls)
        except (RpcError, OSError, TimeoutError):
            return None

    answers = await asyncio.gather(*(one(a) for a in addresses.values()))
    return {
        node_id: _state(answer)
        for node_id, answer in zip(addresses, answers, strict=True)
        if answer is not None and answer.error_code == 0
    }


class QuorumWatch:
    """Samples the quorum into the history until stopped (bounded: one round at a time,
    each bounded by `timeout_s`)."""

    def __init__(
        self,
        history: History,
        addresses: dict[int, tuple[str, int]],
        *,
        interval: float = 0.5,
        timeout_s: float = 1.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.history = history
        self.addresses = addresses
        self.tls = tls
        self.interval = interval
        self.timeout_s = timeout_s
        self.rounds = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            voters = await describe_all(self.addresses, self.timeout_s, self.tls)
            if voters:
                self.rounds += 1
                self.history.record(QUORUM, INFO, SAMPLE, extra={"voters": voters})
            try:
                async with asyncio.timeout(self.interval):
                    await stop.wait()
            except TimeoutError:
                pass


def read_metadata_log(directory: Path) -> dict[str, Any]:
    """A voter's metadata log as the checker compares it. Opens `directory` for
    recovery, which may cut a torn tail: give it a copy, never a live data dir."""
    metadata_log, recovered = MetadataLog.open(directory)
    metadata_log.close()
    snapshot = None
    if recovered.snapshot_offset >= 0:
        snapshot = [recovered.snapshot_offset, recovered.snapshot_epoch]
    return {
        "snapshot": snapshot,
        "entries": [[e.offset, e.epoch, zlib.crc32(encode_entry(e))] for e in recovered.entries],
    }


async def collect_metadata(backend: Backend, dest: Path) -> dict[str, Any]:
    """Every controller's metadata log (from a copy of its data dir) and its last
    DescribeQuorum answer; copies are deleted once read."""
    result: dict[str, Any] = {
        "available": True,
        "reason": None,
        "errors": [],
        "voter-count": len(backend.controller_ids),
        "voters": {},
    }
    result["final"] = await describe_all(backend.controller_addresses(), 2.0, backend.tls_context())
    for node_id, node in zip(backend.controller_ids, backend.controller_nodes, strict=True):
        copy = dest / node
        errors = []
        # A copy taken while the controller rolls a snapshot may miss a file it
        # deleted meanwhile: a few tries.
        for _ in range(COPY_TRIES):
            try:
                await backend.copy_data(node, copy)
                result["voters"][node_id] = await asyncio.to_thread(read_metadata_log, copy)
                break
            except (OSError, CorruptMetadataError, BackendError) as exc:
                errors.append(f"{node}: {type(exc).__name__}: {exc}"[:500])
            finally:
                shutil.rmtree(copy, ignore_errors=True)
        else:
            result["errors"].append(errors[-1])
    if not result["voters"]:
        result["available"] = False
        result["reason"] = "no controller's metadata log could be read"
    return result
