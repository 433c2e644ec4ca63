"""Files in places other users reach: made privately and exclusively, read only when they are ours.

Iris keeps files where every user of the machine can look: each rank's flight file
and hang dumps, and under emulation each rank's heap, live in ``/dev/shm`` by default.
Another user there can plant a symbolic link where we are about to write (so that we
overwrite the link's target), a FIFO where we are about to read (so that we block), or
a file of their own named like ours (so that a report shows their job, or reads
``/dev/zero`` until memory runs out). So:

* Our files go into a directory of this user's own, ``<base>/iris-<uid>``, made with
  mode 0700 and refused when it is not a real directory owned by us that nobody else
  may write (:func:`private_directory`).
* Every file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600
  (:func:`create_exclusive`): an existing name, a planted link included, is an error,
  never a file we write through.
* Every file is opened for reading with ``O_NOFOLLOW | O_NONBLOCK`` and used only if it
  is a regular file owned by this user and no larger than the reader expects
  (:func:`open_own`, :func:`read_own`); :func:`is_own_file` filters a listing alike.
* Outputs (traces, reports, pictures) are written to a temporary file beside the
  target and renamed over it once complete (:func:`replace_atomically`), so an
  interrupted write leaves the previous file intact; :func:`refuse_overwriting` keeps
  an output from replacing one of the command's inputs.

Example:
    >>> directory = private_directory("/dev/shm")          # /dev/shm/iris-1000, mode 0700
    >>> fd = create_exclusive(os.path.join(directory, "x.bin"), 4096)
    >>> data = read_own(os.path.join(directory, "x.bin"), max_bytes=1 << 20)
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile

#: Where the per-user directory goes when nobody says otherwise.
DEFAULT_BASE = "/dev/shm"


class UnsafeFileError(OSError):
    """A path is not ours to use: a link, not a regular file, another user's, too large.

    Its message is one line that names the path and says why.
    """


def default_base() -> str:
    """``/dev/shm`` where it exists, else the system's temporary directory.

    Example:
        >>> default_base()
        '/dev/shm'
    """
    return DEFAULT_BASE if os.path.isdir(DEFAULT_BASE) else tempfile.gettempdir()


def private_directory(base: str | None = None, create: bool = True) -> str:
    """This user's directory ``<base>/iris-<uid>`` (mode 0700), made if missing and checked.

    With ``create=False`` (readers) a missing directory is not made: its path is returned.

    Raises:
        UnsafeFileError: the name exists and is a link, not a directory, another user's,
            or writable by others (someone made it first: pick another base).

    Example:
        >>> private_directory("/dev/shm")
        '/dev/shm/iris-1000'
    """
    base = base or default_base()
    path = os.path.join(base, f"iris-{os.geteuid()}")
    if not create and not os.path.lexists(path):
        return path
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise UnsafeFileError(f"iris: cannot make {path}: {error.strerror}") from None
    check_private_directory(path)
    return path


def check_private_directory(path: str) -> None:
    """Raise :class:`UnsafeFileError` unless ``path`` is a real directory of ours that only we may write.

    Example:
        >>> check_private_directory("/dev/shm/iris-1000")
    """
    try:
        info = os.lstat(path)
    except OSError as error:
        raise UnsafeFileError(f"iris: cannot use {path}: {error.strerror}") from None
    hint = "remove it, or point IRIS_HANG_DIR / IRIS_EMU_SHM_DIR elsewhere"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeFileError(f"iris: {path} is not a directory (a link or a file is there): {hint}")
    if info.st_uid != os.geteuid():
        raise UnsafeFileError(f"iris: {path} belongs to user {info.st_uid}, not to this user: {hint}")
    if info.st_mode & 0o022:
        raise UnsafeFileError(
            f"iris: {path} is writable by other users (mode {info.st_mode & 0o777:o}): {hint}"
        )


def create_exclusive(path: str, size: int = 0) -> int:
    """Create ``path`` (mode 0600, never through a link, never over an existing file) and
    give it ``size`` bytes; returns an open read-write file descriptor.

    Raises:
        UnsafeFileError: ``path`` exists already (whatever it is).

    Example:
        >>> fd = create_exclusive("/dev/shm/iris-1000/iris-flight-ab12-rank0.bin", 8192)
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise UnsafeFileError(f"iris: {path} exists already; refusing to write through or over it") from None
    if size:
        try:
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            _unlink_quietly(path)
            raise
    return fd


def open_own(path: str, max_bytes: int, writable: bool = False) -> int:
    """Open ``path`` if it is a regular file of this user's of at most ``max_bytes``; returns the fd.

    Never follows a link and never blocks (a FIFO or a device is refused, not waited on).

    Raises:
        FileNotFoundError: nothing is there.
        UnsafeFileError: a link, not a regular file, another user's, or larger than ``max_bytes``.

    Example:
        >>> fd = open_own(path, max_bytes=1 << 30)
    """
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeFileError(f"{path}: is a symbolic link; refusing to follow it") from None
        raise UnsafeFileError(f"{path}: cannot be opened ({error.strerror})") from None
    try:
        info = os.fstat(fd)
        problem = _problem(info, max_bytes)
        if problem:
            raise UnsafeFileError(f"{path}: {problem}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_own(path: str, max_bytes: int) -> bytes:
    """The bytes of ``path``, under :func:`open_own`'s rules.

    Example:
        >>> header = read_own("/dev/shm/iris-1000/iris-flight-ab12-rank0.bin", 1 << 30)[:512]
    """
    fd = open_own(path, max_bytes)
    with os.fdopen(fd, "rb") as handle:
        return handle.read(max_bytes + 1)[:max_bytes]


def is_own_file(path: str) -> bool:
    """Whether ``path`` is a regular file (not a link) that belongs to this user.

    Example:
        >>> [p for p in glob.glob("/dev/shm/iris-*") if is_own_file(p)]
    """
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()


def _problem(info: os.stat_result, max_bytes: int) -> str:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file (a FIFO, device or directory); refusing to read it"
    if info.st_uid != os.geteuid():
        return f"belongs to user {info.st_uid}, not to this user; refusing to read it"
    if info.st_size > max_bytes:
        return f"is {info.st_size} bytes, more than the {max_bytes} such a file can be"
    return ""


@contextlib.contextmanager
def replace_atomically(path: str, mode: str = "wb", **open_args):
    """Write a new ``path``: yields a file beside it, renamed over ``path`` only once the block ends.

    An exception (Ctrl-C included) inside the block removes the temporary file and leaves
    whatever was at ``path`` untouched. The new file gets the permissions a plain
    ``open(path, "w")`` would give it.

    Example:
        >>> with replace_atomically("run.pftrace") as handle:
        ...     handle.write(data)
    """
    fd, temporary = _temporary_beside(path)
    try:
        with os.fdopen(fd, mode, **open_args) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        _unlink_quietly(temporary)
        raise


def _temporary_beside(path: str) -> tuple[int, str]:
    """A new temporary file beside ``path`` with the permissions ``open(path, "w")`` would give:
    ``(fd, name)``, for renaming over ``path`` once written."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=directory)
    os.fchmod(fd, 0o666 & ~_umask())
    return fd, temporary


@contextlib.contextmanager
def replacing(path: str):
    """Yields a temporary name beside ``path``; renamed over ``path`` if the block ends normally.

    For writers that want a file name rather than a handle (matplotlib, numpy, Perfetto).

    Example:
        >>> with replacing("timeline.png") as partial:
        ...     figure.savefig(partial, format="png")
    """
    fd, temporary = _temporary_beside(path)
    os.close(fd)
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        _unlink_quietly(temporary)
        raise


def refuse_overwriting(outputs: list[str | None], inputs: list[str]) -> str:
    """A one-line complaint if an output names one of the inputs (or the same output twice); else ``""``.

    Example:
        >>> refuse_overwriting(["rank0.npz"], ["rank0.npz", "rank1.npz"])
        'rank0.npz is an input of this command; write the output elsewhere'
    """
    read = {_identity(name) for name in inputs}
    written: set[str] = set()
    for output in outputs:
        if output is None:
            continue
        key = _identity(output)
        if key in read:
            return f"{output} is an input of this command; write the output elsewhere"
        if key in written:
            return f"{output} is named as two outputs of this command"
        written.add(key)
    return ""


def _umask() -> int:
    """This process's umask, read without setting it (``os.umask`` can only swap it, which
    would leave it at another value for an instant while other threads create files)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _identity(path: str) -> str:
    try:
        info = os.stat(path)
        return f"{info.st_dev}:{info.st_ino}"
    except OSError:
        return os.path.realpath(path)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
