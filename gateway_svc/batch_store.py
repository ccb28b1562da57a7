"""BatchStore: the Batch API's state under --batch-dir: an SQLite database (stdlib sqlite3, WAL,
so several gateway processes may share it) of files and batches, the files' bytes on disk,
and each batch's work folder (its output record and its lock).

Objects come out in OpenAI's shapes (a file, a batch with request_counts and usage, lists). A batch's
work is owned by whichever gateway holds the flock of its folder's lock file (batch_jobs), so
gateways sharing one --batch-dir on a local filesystem never run a batch twice, and a killed
gateway's batches are free again at once (the kernel drops its locks).

A full disk: every write to the database raises DiskFull (SQLite keeps its state whole; the
write is not made). So that a batch cut off by a full disk can still be marked failed, the
folder keeps a reserve file, allocated while there is space and given up to record that
(CockroachDB's "ballast file" does the same for its own state).
"""
import contextlib
import json
import os
import sqlite3
import time

from gateway_svc.disk_full import DiskFull, disk_full_named, is_disk_full
from gateway_svc.ids import new_id

TERMINAL = ("completed", "failed", "cancelled", "expired")
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
COMPLETION_WINDOW_S = {"24h": 24 * 3600}
RESERVE_BYTES = 1 << 20  # room for a few database writes (a WAL frame is a 4 KiB page) when the disk is full

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, bytes INTEGER, created_at INTEGER, filename TEXT, purpose TEXT);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, endpoint TEXT, input_file_id TEXT, completion_window TEXT, status TEXT,
    output_file_id TEXT, error_file_id TEXT, errors TEXT, metadata TEXT,
    created_at INTEGER, in_progress_at INTEGER, expires_at INTEGER, finalizing_at INTEGER,
    completed_at INTEGER, failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,
    total INTEGER DEFAULT 0, completed INTEGER DEFAULT 0, failed INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status);
"""
# Columns added since the first schema, for a --batch-dir made before them.
_ADDED_COLUMNS = {"input_tokens": "INTEGER DEFAULT 0", "output_tokens": "INTEGER DEFAULT 0"}
_FILE_FIELDS = ("id", "bytes", "created_at", "filename", "purpose")
_TIMES = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
          "cancelling_at", "cancelled_at")


def default_batch_dir() -> str:
    """Under the user's data directory ($XDG_DATA_HOME, else ~/.local/share)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "stepserve", "batches")


class BatchStore:
    def __init__(self, batch_dir: str):
        self.batch_dir = batch_dir
        os.makedirs(os.path.join(batch_dir, "files"), exist_ok=True)
        os.makedirs(os.path.join(batch_dir, "work"), exist_ok=True)
        self.db_path = os.path.join(batch_dir, "state.sqlite3")
        self._reserve_path = os.path.join(batch_dir, "reserve")
        self._db = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.executescript(_SCHEMA)
        columns = {row["name"] for row in self._db.execute("PRAGMA table_info(batches)")}
        for name, kind in _ADDED_COLUMNS.items():
            if name not in columns:
                with contextlib.suppress(sqlite3.OperationalError):  # another gateway added it meanwhile
                    self._db.execute(f"ALTER TABLE batches ADD COLUMN {name} {kind}")
        self.keep_reserve()

    def _write(self, query: str, args=()) -> sqlite3.Cursor:
        try:
            return self._db.execute(query, args)
        except sqlite3.OperationalError as e:
            if is_disk_full(e):
                raise DiskFull(self.db_path) from e
            raise

    @contextlib.contextmanager
    def transaction(self):
        """The writes inside are made together, or none of them."""
        self._write("BEGIN IMMEDIATE")
        try:
            yield
            self._write("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # SQLite may have rolled it back itself (a failed COMMIT)
                self._db.execute("ROLLBACK")
            raise

    # ---- the reserve -----------------------------------------------------------------

    def keep_reserve(self) -> None:
        """Allocates the reserve file when it is not there and there is room for it."""
        path = self._reserve_path
        if os.path.exists(path) and os.path.getsize(path) == RESERVE_BYTES:
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)  # blocks taken, not a sparse file
            finally:
                os.close(fd)
        except OSError:  # no room, or a filesystem that cannot allocate: the batches run without it
            self.release_reserve()

    def release_reserve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._reserve_path)

    # ---- files -----------------------------------------------------------------------

    def file_path(self, file_id: str) -> str:
        return os.path.join(self.batch_dir, "files", file_id)

    def add_file(self, file_id: str, filename: str, purpose: str) -> dict:
        """Registers a file whose bytes are already at file_path(file_id)."""
        size = os.path.getsize(self.file_path(file_id))
        self._write("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?)",
                    (file_id, size, int(time.time()), filename, purpose))
        return self.file(file_id)

    def file(self, file_id: str) -> dict | None:
        row = self._db.execute("SELECT * FROM files WHERE id = ?", (file_id,)).fetchone()
        return _file_object(row) if row else None

    def files(self, purpose: str | None = None, limit: int = 10000, after: str | None = None) -> list[dict]:
        query, args = "SELECT * FROM files WHERE 1", []
        if purpose:
            query, args = query + " AND purpose = ?", [purpose]
        if after:
            query, args = query + " AND rowid > (SELECT rowid FROM files WHERE id = ?)", [*args, after]
        rows = self._db.execute(query + " ORDER BY rowid LIMIT ?", (*args, limit)).fetchall()
        return [_file_object(row) for row in rows]

    def delete_file(self, file_id: str) -> bool:
        if self._write("DELETE FROM files WHERE id = ?", (file_id,)).rowcount == 0:
            return False
        try:
            os.remove(self.file_path(file_id))
        except FileNotFoundError:
            pass
        return True

    # ---- batches ---------------------------------------------------------------------

    def work_dir(self, batch_id: str) -> str:
        return os.path.join(self.batch_dir, "work", batch_id)

    def add_batch(self, input_file_id: str, endpoint: str, completion_window: str, metadata: dict | None) -> dict:
        batch_id = new_id("batch_")
        now = int(time.time())
        with disk_full_named(self.work_dir(batch_id)):
            os.makedirs(self.work_dir(batch_id), exist_ok=True)
        self._write("INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, metadata, "
                         "created_at, expires_at) VALUES (?, ?, ?, ?, 'validating', ?, ?, ?)",
                         (batch_id, endpoint, input_file_id, completion_window, json.dumps(metadata),
                          now, now + COMPLETION_WINDOW_S[completion_window]))
        return self.batch(batch_id)

    def batch(self, batch_id: str) -> dict | None:
        row = self._db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return _batch_object(row) if row else None

    def batches(self, limit: int = 20, after: str | None = None) -> list[dict]:
        """Newest first, as OpenAI lists them; `after`: the last id of the previous page."""
        query, args = "SELECT * FROM batches", []
        if after:
            query, args = query + " WHERE rowid < (SELECT rowid FROM batches WHERE id = ?)", [after]
        rows = self._db.execute(query + " ORDER BY rowid DESC LIMIT ?", (*args, limit)).fetchall()
        return [_batch_object(row) for row in rows]

    def active_batch_ids(self) -> list[str]:
        marks = ",".join("?" * len(ACTIVE))
        return [row[0] for row in self._db.execute(
            f"SELECT id FROM batches WHERE status IN ({marks}) ORDER BY rowid", ACTIVE)]

    def status(self, batch_id: str) -> str | None:
        row = self._db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return row[0] if row else None

    def set_status(self, batch_id: str, status: str, only_from: tuple[str, ...] = (), **fields) -> bool:
        """Moves the batch to `status` (stamping its `<status>_at` time once) with other fields;
        with only_from, only from one of those statuses (False when it was not in one)."""
        fields["status"] = status
        stamp = f"{status}_at"
        assignments = [f"{name} = ?" for name in fields]
        if stamp in _TIMES:
            assignments.append(f"{stamp} = COALESCE({stamp}, {int(time.time())})")
        query = f"UPDATE batches SET {', '.join(assignments)} WHERE id = ?"
        args = [json.dumps(v) if name == "errors" else v for name, v in fields.items()] + [batch_id]
        if only_from:
            query += f" AND status IN ({','.join('?' * len(only_from))})"
            args += list(only_from)
        return self._write(query, args).rowcount == 1

    def set_counts(self, batch_id: str, total: int, completed: int, failed: int,
                   input_tokens: int = 0, output_tokens: int = 0) -> None:
        self._write("UPDATE batches SET total = ?, completed = ?, failed = ?, input_tokens = ?, "
                         "output_tokens = ? WHERE id = ?",
                         (total, completed, failed, input_tokens, output_tokens, batch_id))

    def num_batches_by_status(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT status, COUNT(*) FROM batches GROUP BY status").fetchall())

    def close(self) -> None:
        self._db.close()


def _file_object(row: sqlite3.Row) -> dict:
    return {**{name: row[name] for name in _FILE_FIELDS}, "object": "file", "status": "processed",
            "expires_at": None, "status_details": None}


def _batch_object(row: sqlite3.Row) -> dict:
    return {"id": row["id"], "object": "batch", "endpoint": row["endpoint"],
            "errors": json.loads(row["errors"]) if row["errors"] else None,
            "input_file_id": row["input_file_id"], "completion_window": row["completion_window"],
            "status": row["status"], "output_file_id": row["output_file_id"], "error_file_id": row["error_file_id"],
            **{name: row[name] for name in _TIMES},
            "request_counts": {"total": row["total"], "completed": row["completed"], "failed": row["failed"]},
            "usage": {"input_tokens": row["input_tokens"], "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": row["output_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": row["input_tokens"] + row["output_tokens"]},
            "metadata": json.loads(row["metadata"]) if row["metadata"] else None}
