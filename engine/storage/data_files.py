"""The files of a data dir (SQLite databases, their -wal/-shm, lock, lease and peer
files, the console's log): created readable by their owner only, and a damaged database
refused at start with a message naming it (instead of a traceback, or an engine
that half starts on it).

Privacy: new directories are made 0700 and new files 0600 whatever the umask (the
umask can only take bits away); SQLite gives a database's -wal and -shm files the
mode of the database file, so creating that one first makes them private too.
Existing files and directories keep their modes: they are the user's to choose.

Damage: `probe` is a cheap read-only check made before anything is written (WAL
mode, migrations): the schema, and the first and last pages of each table. A full
`PRAGMA quick_check` reads every page (about 0.6 s per GB with a warm page cache,
far more from disk), too slow for every start of a big database. Damage found later
during the start is mapped by `is_damage` / `DamagedDatabase` too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from engine.storage.contract import StorageError

#: Primary result codes of SQLite (the low byte of extended ones).
SQLITE_CORRUPT = 11
SQLITE_NOTADB = 26

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


class DamagedDatabase(StorageError):
    """A SQLite file of the engine is damaged (or is no SQLite database at all)."""

    def __init__(self, paths: Sequence[Path], error: BaseException) -> None:
        self.paths = list(paths)
        super().__init__(damaged_message(self.paths, error))


#: SQLite's words for those codes (`sqlite3_errstr`), kept in the messages of the
#: StorageErrors the writer makes of them.
_DAMAGE_WORDS = ("database disk image is malformed", "file is not a database")


def is_damage(e: BaseException) -> bool:
    """Whether `e` says a database file is damaged, rather than busy, full or locked."""
    if isinstance(e, DamagedDatabase):
        return False  # told already
    if isinstance(e, sqlite3.DatabaseError):
        code = getattr(e, "sqlite_errorcode", None)
        if isinstance(code, int):
            return code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB)
    if isinstance(e, sqlite3.DatabaseError | StorageError):
        return any(words in str(e) for words in _DAMAGE_WORDS)
    return False


def damaged_message(paths: Sequence[Path], error: BaseException) -> str:
    """One line: which file, SQLite's words, and how to check it."""
    reason = str(error) or type(error).__name__
    first = str(paths[0]) if paths else "obelisk.sqlite"
    check = f"sqlite3 {shlex.quote(first)} 'PRAGMA integrity_check'"
    if len(paths) > 1:
        names = ", ".join(str(p) for p in paths)
        return (
            f"a database of this data dir is damaged ({reason}): check each of {names} "
            f"with {check} (and the others likewise), then restore the damaged one from "
            "a backup or recover it (sqlite3 .recover)"
        )
    return (
        f"the database {first} is damaged ({reason}): check it with {check}, then "
        "restore it from a backup or recover it (sqlite3 .recover)"
    )


def probe(conn: sqlite3.Connection) -> None:
    """Read the schema and each table's first and last rows: a few pages per table,
    whatever the file's size. Raises sqlite3.DatabaseError when they are damaged; a
    new (empty) file passes."""
    tables = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    for (name,) in tables:
        quoted = '"' + str(name).replace('"', '""') + '"'
        # NOT INDEXED: the table's own b-tree, not a covering index.
        conn.execute(f"SELECT * FROM {quoted} NOT INDEXED LIMIT 1").fetchall()
        key = [
            '"' + str(col).replace('"', '""') + '"'
            for _, col, *_rest, pk in sorted(
                conn.execute(f"PRAGMA table_info({quoted})").fetchall(), key=lambda r: r[-1]
            )
            if pk
        ]
        without_rowid = conn.execute(
            "SELECT sql LIKE '%WITHOUT ROWID%' FROM sqlite_master WHERE name = ?", (name,)
        ).fetchone()[0]
        order = ", ".join(f"{k} DESC" for k in key) if without_rowid else "rowid DESC"
        conn.execute(f"SELECT * FROM {quoted} NOT INDEXED ORDER BY {order} LIMIT 1").fetchall()


def private_dir(path: Path) -> None:
    """Make the directory `path` (0700) and its missing parents (the usual mode)."""
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # The umask may only take bits away from 0700; another process may make it first
    # (between the look above and here: then it is a directory, and that is fine).
    try:
        path.mkdir(mode=PRIVATE_DIR)
    except FileExistsError:
        if not path.is_dir():  # a file where the directory should be: say so
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path)) from None


def private_file(path: Path) -> None:
    """Create the empty file `path` (0600) unless it exists (then it is left alone)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE))
