"""The chat replies' disk cache: SQLite, keyed on the model, the messages and the generation settings, so that a
rerun of the same questions costs no tokens (answers/chat.py's ``LLM`` reads and writes it)."""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path


class ResponseCache:
    """Chat replies on disk (SQLite), keyed on sha256 of model + messages + settings. Thread-safe;
    several processes may share a file (WAL journal, writes retried while another holds the lock)."""

    def __init__(self, path):
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        self._conn = None

    @staticmethod
    def key(model: str, messages: list[dict], settings: dict) -> str:
        blob = json.dumps({"model": model, "messages": messages, "settings": settings}, sort_keys=True,
                          ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, model TEXT NOT NULL, "
                         "reply TEXT NOT NULL, usage TEXT NOT NULL, created REAL NOT NULL)")
            conn.commit()
            self._conn = conn
        return self._conn

    def get(self, key: str) -> dict | None:
        with self._lock:
            row = self._db().execute("SELECT reply, usage FROM replies WHERE key = ?", (key,)).fetchone()
        return None if row is None else {"text": row[0], "usage": json.loads(row[1])}

    def put(self, key: str, model: str, text: str, usage: dict) -> None:
        with self._lock:
            db = self._db()
            db.execute("INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?, ?)",
                       (key, model, text, json.dumps(usage), time.time()))
            db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db().execute("SELECT COUNT(*) FROM replies").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
