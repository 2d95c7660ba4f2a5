"""Exceptions the controller raises to stop itself with one clear line."""

from __future__ import annotations

from protocol.invariants import InvariantError
from protocol.invariants import invariant


class ControllerError(Exception):
    """A condition that stops the controller; its message says what was wrong and what
    to do, and becomes the single error line printed by `python -m controller`."""


class DataDirError(ControllerError):
    """The data directory cannot be used (not a directory, not writable, locked)."""


class CorruptMetadataError(ControllerError):
    """The metadata log or a snapshot is damaged in a way replay cannot repair."""


class MetadataLogWriteError(ControllerError):
    """Writing or syncing the metadata log failed: the on-disk state is unknown, so the
    controller stops rather than acknowledge anything else (replay repairs the tail)."""


# A metadata invariant (offsets, epochs) was about to be broken: a bug, never input.
# The one invariant helper (protocol/invariants.py), under the controller's old name.
InvariantViolation = InvariantError

__all__ = [
    "ControllerError",
    "CorruptMetadataError",
    "DataDirError",
    "InvariantViolation",
    "MetadataLogWriteError",
    "invariant",
]
