"""Linux system calls Python's `os` module does not wrap (prctl, syncfs), looked up in
the C library once, at import."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable


def linux_libc_function(name: str) -> Callable[..., int] | None:
    """The C library's `name` (errno kept for ctypes.get_errno), or None off Linux or
    where the C library lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None
