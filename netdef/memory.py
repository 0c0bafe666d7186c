"""How much memory this process may still allocate, and refusing an allocation that cannot fit.

A size written in a definition (``num_output: 4000000000``, ``local_size: 2147483647``) is checked
before the array is made, so that the error names the blob or layer. Waiting for the allocation to fail
is not enough: NumPy's ``zeros`` of more than the machine's memory may succeed (the kernel overcommits)
and the process is then killed while the array is written. Two bounds, the lower one counts:

- the machine's physical memory;
- under an address-space limit (``RLIMIT_AS``: ``ulimit -v``, a batch system, the fuzzer's 3 GiB cap),
  the limit less what the process has mapped already: beyond it every allocation fails, whatever the
  machine has free.

The second needs /proc/self/status (a file read per check, slow beside the allocation it guards), read
only when such a limit is set (benchmarks/README.md, "The figures behind the solver's, the exchange's
and the data's choices").
"""
from __future__ import annotations

import os
import resource


class BlobTooLargeError(MemoryError):
    """An array that could never fit in what this process may allocate (a typo such as
    ``num_output: 4000000000``): refused before allocating, the message names what it was for."""


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def status_bytes(field: str) -> int:
    """A size in bytes that /proc/self/status tells (``VmSize``, ``VmHWM``...), or 0 where it does not."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def mapped_bytes() -> int:
    """This process's virtual memory size (VmSize), or 0 where /proc does not tell it."""
    return status_bytes("VmSize")


def available_bytes() -> tuple[int, str]:
    """(bytes this process may still allocate, what bounds it: for messages)."""
    physical = physical_memory_bytes()
    soft_limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft_limit == resource.RLIM_INFINITY:
        return physical, f"this machine's memory ({physical} bytes)"
    mapped = mapped_bytes()
    left = max(soft_limit - mapped, 0)
    if left >= physical:
        return physical, f"this machine's memory ({physical} bytes)"
    return left, (f"what this process's address-space limit leaves ({left} bytes: RLIMIT_AS {soft_limit} "
                  f"bytes, {mapped} mapped)")


def check_fits(nbytes: int, what: str) -> None:
    """Raise BlobTooLargeError, naming ``what`` (``"blob 'ip' of shape (4000000000, 3)"``), when
    ``nbytes`` more could not be allocated now."""
    available, bound = available_bytes()
    if nbytes > available:
        raise BlobTooLargeError(f"{what} needs {nbytes} bytes, more than {bound}")
