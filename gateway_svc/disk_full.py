"""DiskFull: a write of a batch job (its output, the Batch API's files or SQLite state) that
found no space left on its filesystem, named with the path, so a job ends with that one line
instead of a traceback. The one owner of what counts as a full disk: ENOSPC, a quota's EDQUOT,
and SQLite's SQLITE_FULL (SQLite reports ENOSPC as "database or disk is full")."""
import contextlib
import errno
import sqlite3

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    def __init__(self, path: str):
        super().__init__(errno.ENOSPC, f"no space left on device (ENOSPC) writing {path}")
        self.path = path

    def __str__(self) -> str:
        return self.strerror


def is_disk_full(e: BaseException) -> bool:
    if isinstance(e, OSError):
        return e.errno in _FULL_ERRNOS
    return isinstance(e, sqlite3.OperationalError) and getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


def as_disk_full(e: BaseException, path: str) -> DiskFull | None:
    """e as a DiskFull (naming `path` when e names no file), or None when e is not a full disk."""
    if isinstance(e, DiskFull):
        return e
    if is_disk_full(e):
        return DiskFull(getattr(e, "filename", None) or path)
    return None


@contextlib.contextmanager
def disk_full_named(path: str):
    """An OSError of a full disk inside raised as DiskFull, naming `path` when it names no file."""
    try:
        yield
    except OSError as e:
        full = as_disk_full(e, path)
        if full is None or full is e:
            raise
        raise full from e
