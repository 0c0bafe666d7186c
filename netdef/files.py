"""Reading input files within bounds, and writing files atomically.

Reading. Every file netdef reads by name (prototxts, weights, solver states, mean files, images, lists,
IDX files, HDF5 files) goes through ``open_input_file`` / ``read_input_file`` first: only a regular file
is read (``/dev/zero`` would be read until memory runs out, a FIFO would block forever), and only when
its size fits what its format can hold (a protobuf message is less than 2 GiB). The file is opened
without blocking and checked on the open descriptor, so a path swapped for a FIFO between a check and
the open cannot block either. The errors name the file and say what it is instead.

Writing: a reader sees the old file or the new one, never a torn one.

Every writer here puts the new contents into a temporary file beside the target (same folder, so the
final rename stays on one filesystem and is atomic), flushes it to disk, renames it over the target
and flushes the folder, so that the rename itself survives a crash. A failure at any point removes
the temporary file and leaves the target as it was.

The temporary file gets the permissions a plain ``open(path, "w")`` would give: those of the file it
replaces, or for a new file 0666 less the umask (``tempfile.mkstemp`` would give 0600, which other
users and tools reading the weights would then trip over).

One file: ``write_bytes_atomically`` / ``write_hdf5_atomically``. Several files that must change
together in an order (a snapshot's model, then its state): write every one with ``bytes_to_temp`` /
``hdf5_to_temp`` first, then ``replace`` them in order, and ``remove_quietly`` the temporary files if
anything fails.
"""
from __future__ import annotations

import contextlib
import io
import os
import stat

from .tempnames import temp_name

__all__ = ["IMAGE_FILE_LIMIT", "FileWriteError", "InputFileError", "PROTOBUF_LIMIT", "TEXT_LIST_LIMIT", "bytes_to_temp", "check_file_name", "check_input_file", "hdf5_to_temp",
           "missing_reason", "open_input_file", "read_input_file", "remove_quietly", "replace", "temp_beside",
           "write_bytes_atomically", "write_hdf5_atomically"]

_NAME_ATTEMPTS = 100

#: protobuf parses no message of 2 GiB or more, so no binary or text protobuf file can be larger.
PROTOBUF_LIMIT = 2**31 - 1
#: Text lists (image lists, HDF5 source lists) and single images: far more than any real one.
TEXT_LIST_LIMIT = 2**30
IMAGE_FILE_LIMIT = 2**30

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class InputFileError(ValueError):
    """An input file that netdef will not read: missing, unreadable, not a regular file or too large.
    The message names the file, what it was read as, and what is wrong."""


def check_file_name(path, what: str) -> None:
    """Raise InputFileError when ``path`` cannot name any file: it holds a NUL byte (a string field
    of a definition or a state file can; the OS calls would raise a bare ValueError). Every other
    path is left for the OS to judge."""
    if "\0" in os.fspath(path):
        # repr shows where the NUL is; printed as is, it would be invisible.
        raise InputFileError(f"{what} {os.fspath(path)!r}: the name holds a NUL byte, which no file name can")


def open_input_file(path, what: str, limit: int | None = None):
    """``path`` opened for binary reading (a file object), once it is known to be a regular file of at
    most ``limit`` bytes. ``what`` says what the file was to be (``"weights file"``) in errors."""
    return _open_regular_file(path, what, limit)[0]


def _open_regular_file(path, what: str, limit: int | None):
    """``open_input_file``'s file object and the size the file had when it was opened."""
    fd, size = _open_regular_fd(path, what, limit)
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), size
    except BaseException:
        os.close(fd)
        raise


def _open_regular_fd(path, what: str, limit: int | None) -> tuple[int, int]:
    """A descriptor of ``path`` opened for reading (still O_NONBLOCK, which changes nothing for a regular
    file), once it is known to be a regular file of at most ``limit`` bytes, and that size."""
    path = os.fspath(path)
    check_file_name(path, what)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputFileError(f"{what} {path}: {_reason(exc)}") from None
    try:
        info = os.fstat(fd)
        for is_kind, kind in _KINDS:
            if is_kind(info.st_mode):
                raise InputFileError(f"{what} {path}: is {kind}, not a regular file")
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(f"{what} {path}: not a regular file")
        if limit is not None and info.st_size > limit:
            raise InputFileError(f"{what} {path}: {info.st_size} bytes, more than such a file can hold "
                                 f"({limit} bytes)")
        return fd, info.st_size
    except BaseException:
        os.close(fd)
        raise


# What a read asks for beyond the size the file had when opened (a file that grows meanwhile).
_GROWTH_CHUNK = 1 << 16


def read_input_file(path, what: str, limit: int) -> bytes:
    """The bytes of ``path``, read as ``open_input_file`` allows; never more than ``limit`` bytes,
    even when the file grows while it is read.

    On the descriptor itself, not a file object: the data threads read an image file each, and every
    system call lets go of the GIL and takes it back, which on two threads is a wait on the other
    (a buffered file object made twelve calls an image where open, fstat, read and close do)."""
    fd, size = _open_regular_fd(path, what, limit)
    try:
        # Reads sized by the file, not by the limit: Python allocates what a read asks for before it
        # reads, and a read of limit + 1 bytes mapped and unmapped 1 GiB for every image, which on
        # two data threads made reading the files slower than on one.
        chunks, total = [], 0
        while total <= limit:
            asked = min(limit + 1 - total, max(size + 1 - total, _GROWTH_CHUNK))
            chunk = os.read(fd, asked)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if len(chunk) < asked and total == size:
                break  # the whole file as fstat saw it, and a short read: its end, without one more call
    finally:
        os.close(fd)
    if total > limit:
        raise InputFileError(f"{what} {os.fspath(path)}: grew past {limit} bytes while being read")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def check_input_file(path, what: str, limit: int | None = None) -> None:
    """Raise InputFileError unless ``path`` is a regular file of at most ``limit`` bytes: for files that
    a library opens by name itself (h5py, gzip, lmdb)."""
    open_input_file(path, what, limit).close()


def missing_reason(path, missing: str) -> str:
    """Why ``path`` names nothing that can be opened: ``missing`` when there is no such name, the
    system's words when the name is a link that leads nowhere (``Too many levels of symbolic links``),
    which is not the same mistake and must not be reported as a missing file."""
    if not os.path.lexists(path):
        return missing
    try:
        os.stat(path)
    except OSError as exc:
        return f"{os.fspath(path)} is a link that leads nowhere: {_reason(exc)}"
    return missing


def _reason(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    return exc.strerror or str(exc)


class FileWriteError(OSError):
    """Writing a file failed (a full disk, a quota, a file-size limit, an I/O error): the message names
    the file being written, not its temporary name, and says that the file of that name is unchanged.
    An OSError still, with the system's errno, so that callers may tell ENOSPC from the rest."""

    def __str__(self) -> str:
        return self.strerror


@contextlib.contextmanager
def _naming_target(path):
    """Re-raise an OSError of writing ``path`` (or its temporary file) as a FileWriteError naming it;
    without it a full disk says only ``[Errno 28] No space left on device``."""
    try:
        yield
    except FileWriteError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise FileWriteError(exc.errno, f"cannot write {os.fspath(path)}: {reason}; the file of that name, "
                                        f"if there was one, is unchanged") from exc


def temp_beside(path) -> str:
    """Create an empty temporary file in ``path``'s folder and return its name (``netdef.tempnames``:
    hidden, naming its writer so that a later run can tell when it was abandoned).

    Raises FileNotFoundError when the folder does not exist.
    """
    path = os.fspath(path)
    folder, name = os.path.split(path)
    existing_mode = _mode_of(path)
    for _ in range(_NAME_ATTEMPTS):
        tmp = os.path.join(folder, temp_name(name))
        try:
            # O_EXCL: never adopt a file someone else created. Mode 0o666: the kernel applies the umask,
            # exactly as for a plain open(); reading the umask ourselves would not be thread-safe.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        if existing_mode is not None:
            try:
                os.chmod(tmp, existing_mode)
            except OSError:
                pass  # e.g. a filesystem without modes: the umask's permissions are still sound
        return tmp
    raise FileExistsError(f"cannot create a temporary file beside {path}: {_NAME_ATTEMPTS} names taken")


def bytes_to_temp(path, data: bytes) -> str:
    """A temporary file beside ``path`` holding ``data``, flushed to disk; returns its name.
    FileWriteError, naming ``path``, when it cannot be written; no temporary file is left then."""
    with _naming_target(path):
        tmp = temp_beside(path)
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            remove_quietly(tmp)
            raise
    return tmp


def hdf5_to_temp(path, write_fn) -> str:
    """A temporary HDF5 file beside ``path`` filled by ``write_fn(h5py.File)``, flushed to disk;
    returns its name. Needs h5py (ImportError otherwise).

    The HDF5 file is made in memory and written by ``bytes_to_temp``: HDF5 writing to disk itself
    cannot be stopped cleanly by a full disk (its close fails again at exit, printing tracebacks,
    and the process can crash), while a plain write fails with one error naming the file."""
    import h5py

    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as handle:
        write_fn(handle)
    return bytes_to_temp(path, buffer.getbuffer())


def replace(tmp, path) -> None:
    """Rename the complete temporary file ``tmp`` over ``path``, then flush the folder, so that a
    rename done before a later one is also on disk before it (a snapshot's model before its state)."""
    with _naming_target(path):
        os.replace(tmp, path)
    try:
        _fsync_path(os.path.dirname(os.fspath(path)) or ".")
    except OSError:
        pass  # some systems cannot open or flush a folder; the rename itself has happened


def remove_quietly(path) -> None:
    """Delete ``path`` if it exists (cleanup that must not hide the error being handled)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def write_bytes_atomically(path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically."""
    tmp = bytes_to_temp(path, data)
    try:
        replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def write_hdf5_atomically(path, write_fn) -> None:
    """Replace ``path`` with the HDF5 file that ``write_fn(h5py.File)`` fills, atomically."""
    tmp = hdf5_to_temp(path, write_fn)
    try:
        replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def _mode_of(path: str) -> int | None:
    """Permission bits of an existing regular file at ``path`` (a plain open() keeps them), else None."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return stat.S_IMODE(info.st_mode) if stat.S_ISREG(info.st_mode) else None


def _fsync_path(path: str) -> None:
    """Flush a file or a folder by name (read-only is enough for fsync on POSIX)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
