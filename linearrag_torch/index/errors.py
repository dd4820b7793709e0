"""The two errors of index folders (raised by the data checks, the storage layer and the lock)."""


class IndexFormatError(ValueError):
    """A missing, truncated, mismatched or foreign index folder (the message names the problem)."""


class IndexLockedError(OSError):
    """Another process holds the folder's write lock (the message names the folder and its pid)."""
