"""The names of netdef's temporary files, and which of them are left over from a killed writer.

A file being written atomically (``netdef.files``) lives beside its target as
``.<target name>.<writer>.<pid>.<random>.tmp`` until it is renamed over the target. A process killed
in between (SIGKILL, power loss) leaves it behind; each is as large as a snapshot. ``stale_temps``
finds those that are certainly abandoned, so that the next run can remove its own leftovers:

- ``writer`` identifies the process space the writer's PID belongs to: a digest of the kernel's
  boot id and the PID namespace (the host name where /proc does not say). When it is ours, the
  writer's PID is checked: a file whose writer no longer exists is stale. A live process with that
  PID keeps the file, even when it merely reuses the number: never delete what might be written.
- Any other writer (another machine on a shared filesystem, another container, before a reboot)
  cannot be asked: its file is stale only when nothing has modified it for ``FOREIGN_AGE_S``
  (a day; a writer keeps modifying its file until it renames it, in seconds).
- Names of the earlier scheme ``.<target>.<random>.tmp`` carry no PID: the age rule applies.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import secrets
import socket
import time

FOREIGN_AGE_S = 24 * 3600

_TEMP = re.compile(r"^\.(?P<target>.+?)\.(?:(?P<writer>[0-9a-f]{8})\.(?P<pid>\d{1,10})\.)?[0-9a-f]{8}\.tmp$")


@functools.cache
def writer_tag() -> str:
    """8 hex digits naming this process's PID space (same for every process that shares it)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            space = handle.read().strip() + ":" + os.readlink("/proc/self/ns/pid")
    except OSError:
        space = socket.gethostname()
    return hashlib.sha256(space.encode()).hexdigest()[:8]


def temp_name(target_name: str) -> str:
    """A fresh temporary file name for the file named ``target_name`` (no folder)."""
    return f".{target_name}.{writer_tag()}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process (or a number we cannot ask about): assume it writes
    return True


def _stale(folder: str, name: str, writer: str | None, pid: str | None, now: float) -> bool:
    if writer == writer_tag() and pid is not None:
        return int(pid) != os.getpid() and not _alive(int(pid))
    try:
        return now - os.lstat(os.path.join(folder, name)).st_mtime > FOREIGN_AGE_S
    except OSError:
        return False


def stale_temps(folder: str, target: re.Pattern) -> list[str]:
    """Paths of abandoned temporary files in ``folder`` whose target's name matches ``target``
    (fully), by the rules of the module docstring."""
    now = time.time()
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return []
    found = []
    for name in sorted(names):
        match = _TEMP.match(name)
        if match and target.fullmatch(match["target"]) and _stale(folder or ".", name, match["writer"],
                                                                   match["pid"], now):
            found.append(os.path.join(folder, name))
    return found
