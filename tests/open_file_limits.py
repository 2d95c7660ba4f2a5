"""This process's open-file limit and descriptors, for tests of running out of them:
real descriptors and a real RLIMIT_NOFILE, restored on the way out."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def open_file_limit(soft: int) -> Iterator[None]:
    """Lower this process's open-file soft limit for the block (restored after)."""
    old_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (old_soft, hard))


@contextlib.contextmanager
def descriptors_exhausted() -> Iterator[None]:
    """No descriptor left for this process (EMFILE on the next open), restored after."""
    fillers: list[int] = []
    with open_file_limit(open_fds()):
        try:
            while True:  # take whatever is left below the limit
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        try:
            yield
        finally:
            for fd in fillers:
                os.close(fd)
