"""One run per snapshot prefix: two runs writing ``prefix_iter_N.caffemodel`` / ``.solverstate`` would
each overwrite the other's files, so that a model and its state could come from different runs.

A run holds an exclusive ``flock`` on a hidden file beside its snapshots (``.<stem>.netdef-lock``)
while it trains. The kernel drops the lock when the process ends, however it ends (SIGKILL, a crash,
a power cut), so a dead run never keeps the prefix; a stale file is simply locked again. The holder
writes its process id and host into the file, so that the run refused can name it.
"""
from __future__ import annotations

import fcntl
import os
import socket

from ..excerpts import excerpt


class SnapshotPrefixInUseError(RuntimeError):
    """Another live process trains with the same snapshot_prefix; the message names it."""


def lock_path(prefix: str) -> str:
    """The lock file of ``prefix``: hidden, in the folder the snapshots go to."""
    folder, stem = os.path.split(prefix)
    return os.path.join(folder, f".{stem}.netdef-lock")


class SnapshotPrefixLock:
    """The held lock of one snapshot prefix; ``release`` (or the end of the process) lets it go."""

    def __init__(self, prefix: str, path: str, fd: int):
        self.prefix, self.path, self._fd = prefix, path, fd

    @classmethod
    def acquire(cls, prefix: str) -> "SnapshotPrefixLock | None":
        """Hold ``prefix`` for this process; SnapshotPrefixInUseError when a live process holds it.
        None when the snapshot folder does not exist (nothing can be written there, and the first
        snapshot reports that folder)."""
        path = lock_path(prefix)
        if not os.path.isdir(os.path.dirname(path) or "."):
            return None
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise SnapshotPrefixInUseError(
                    f"snapshot_prefix {prefix} is in use by another run ({holder}; lock {path}): two runs "
                    f"would overwrite each other's snapshots; give this run another snapshot_prefix or "
                    f"stop the other") from None
            except BaseException:
                os.close(fd)
                raise
            # A holder that was releasing may have removed the file between our open and our lock:
            # then we hold a file nobody else will see; start again on the one that is there now.
            if _same_file(fd, path):
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"process {os.getpid()} on host {socket.gethostname()}\n".encode())
        return cls(prefix, path, fd)

    def release(self) -> None:
        """Remove the lock file and let the lock go (removal first: a run waiting to lock the file we
        remove finds it gone and starts again, see ``acquire``)."""
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass  # already gone or not ours to remove: the lock itself is released below all the same
        os.close(self._fd)
        self._fd = None


def _read_holder(fd: int) -> str:
    text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    return excerpt(text) if text else "a process that has not yet written its id"


def _same_file(fd: int, path: str) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
