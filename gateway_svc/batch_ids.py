"""BatchIds: the custom_ids and line numbers a batch job has read or finished, kept in SQLite.

A job must know every custom_id it has read (to refuse a duplicate) and, when it resumes,
every one already in the output file. In a Python set a million ids cost ~100 MB and grow with
the file; here they live in a private temporary SQLite database (stdlib sqlite3) that spills
to disk past a small page cache, so the job's memory stays flat however many lines it reads.
"""
import sqlite3

_CACHE_KIB = 2048  # SQLite's page cache for the ids (its default size); past it, pages go to the temporary file


class BatchIds:
    def __init__(self):
        # "": a private temporary database on disk, deleted when the connection closes.
        self._db = sqlite3.connect("", isolation_level=None)
        self._db.executescript(f"""
            PRAGMA cache_size = -{_CACHE_KIB};
            PRAGMA journal_mode = OFF;
            PRAGMA synchronous = OFF;
            CREATE TABLE seen (custom_id TEXT PRIMARY KEY) WITHOUT ROWID;
            CREATE TABLE done_ids (custom_id TEXT PRIMARY KEY) WITHOUT ROWID;
            CREATE TABLE done_lines (line_no INTEGER PRIMARY KEY);
            BEGIN;
        """)  # one transaction never committed: no per-insert commit, and nothing to keep anyway

    def first_sight(self, custom_id: str) -> bool:
        """Records the custom_id as read; False when it was read before (a duplicate)."""
        return self._db.execute("INSERT OR IGNORE INTO seen VALUES (?)", (custom_id,)).rowcount == 1

    def add_done(self, custom_id: str | None, line_no: int | None) -> None:
        if custom_id is not None:
            self._db.execute("INSERT OR IGNORE INTO done_ids VALUES (?)", (custom_id,))
        if line_no is not None:
            self._db.execute("INSERT OR IGNORE INTO done_lines VALUES (?)", (line_no,))

    def is_done(self, custom_id: str | None, line_no: int) -> bool:
        if self._db.execute("SELECT 1 FROM done_lines WHERE line_no = ?", (line_no,)).fetchone():
            return True
        return custom_id is not None and bool(
            self._db.execute("SELECT 1 FROM done_ids WHERE custom_id = ?", (custom_id,)).fetchone())

    def close(self) -> None:
        self._db.close()
