"""The writer lock of an index folder: one writer at a time, readers take no lock."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from .errors import IndexLockedError

LOCK_NAME = ".lock"
_HELD: dict = {}  # folders whose write lock this process holds -> nesting depth


@contextmanager
def index_lock(path):
    """Hold the exclusive write lock of index folder ``path`` (which must exist) for the ``with`` block.

    The lock is a non-blocking fcntl.flock on ``path/.lock``, which records the holder's pid and is
    removed on release (a killed writer leaves the file behind, but not the lock: the kernel drops it, so a
    stale file never blocks the next writer).
    Another process holding it raises IndexLockedError("PATH is locked by another writer (pid N)").
    Re-entrant within a process (save() inside an add's read-modify-write). Readers need no lock.
    """
    import fcntl

    path = Path(path)
    key = str(path.resolve())
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    lock = path / LOCK_NAME
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise IndexLockedError(f"{path} is locked by another writer (pid {holder})") from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the previous holder may have removed the file between our open and flock: retry
            current = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    try:
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:  # a full disk: the pid only names the holder in the message above; the lock is the flock
            pass
        _HELD[key] = 1
        yield
    finally:
        _HELD.pop(key, None)
        try:
            os.unlink(lock)
        except OSError:
            pass
        os.close(fd)  # releases the flock


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"
