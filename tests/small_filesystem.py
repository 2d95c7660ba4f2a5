"""Real, small file systems for tests of full and failing disks, mounted on a test
directory, so the errors come from the kernel, not from a mock:

- `small_filesystem`: a tmpfs of a given size (ENOSPC when full), which can be grown
  in place (what freeing space does);
- `failing_filesystem`: ext4 in an image file on a loop device, which can be made to
  fail every later operation with EIO (the EXT4_IOC_SHUTDOWN ioctl: what the kernel
  does to a file system whose disk returns errors).

Mounting needs root (CAP_SYS_ADMIN), as on the CI machines. Where it is missing the
tests skip loudly with the reason; with `CI` set in the environment they fail.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

# _IOR('X', 125, __u32) from linux/ext4.h, and its "no log flush" flag.
EXT4_IOC_SHUTDOWN = (2 << 30) | (4 << 16) | (ord("X") << 8) | 125
EXT4_GOING_FLAGS_NOLOGFLUSH = 2


def _unavailable(reason: str) -> None:
    """Skip loudly, or fail where CI is set."""
    if os.environ.get("CI"):
        pytest.fail(f"DISK-FAILURE TESTS CANNOT RUN IN CI: {reason}")
    pytest.skip(f"DISK-FAILURE TESTS SKIPPED: {reason}")


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


class SmallFilesystem:
    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        self.size_bytes = size_bytes

    def resize(self, size_bytes: int) -> None:
        """Grow (or shrink) the file system in place: what freeing space does."""
        self._remount(f"remount,size={size_bytes}")
        self.size_bytes = size_bytes

    def fail_with_io_errors(self) -> None:
        """Every later operation on the file system fails with EIO (ext4 only)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)

    def free_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def _remount(self, options: str) -> None:
        done = _mount("-o", options, str(self.path))
        assert done.returncode == 0, f"mount -o {options} {self.path}: {done.stderr.strip()}"


@contextlib.contextmanager
def small_filesystem(path: Path, size_bytes: int) -> Iterator[SmallFilesystem]:
    """Mount a `size_bytes` tmpfs on `path` (created) for the duration."""
    path.mkdir(parents=True, exist_ok=True)
    done = _mount("-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(path))
    if done.returncode != 0:
        _unavailable(
            f"cannot mount a tmpfs on {path} ({done.stderr.strip() or done.returncode}): "
            "the disk-failure tests need root (CAP_SYS_ADMIN) to make a small real file system"
        )
    try:
        yield SmallFilesystem(path, size_bytes)
    finally:
        # Lazy: a process of the test that still holds a file must not fail the unmount.
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@contextlib.contextmanager
def failing_filesystem(path: Path, image: Path, size_bytes: int) -> Iterator[SmallFilesystem]:
    """Mount an ext4 file system of `size_bytes`, kept in the file `image`, on `path`."""
    path.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as out:
        out.truncate(size_bytes)
    made = subprocess.run(
        ["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True, timeout=60
    )
    if made.returncode != 0:
        _unavailable(f"mkfs.ext4 {image} failed: {made.stderr.strip()} (install e2fsprogs)")
    done = _mount("-o", "loop", str(image), str(path))
    if done.returncode != 0:
        _unavailable(
            f"cannot mount {image} on {path} through a loop device "
            f"({done.stderr.strip() or done.returncode}): the disk-failure tests need root"
        )
    try:
        yield SmallFilesystem(path, size_bytes)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
