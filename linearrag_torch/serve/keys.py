"""API keys of a store server (`linearrag serve --keys-file KEYS.json`): each key scoped to some indexes, with a role.

The file holds hashes, never keys:

    {"keys": [
      {"name": "search-app", "sha256": "<hex sha256 of the key>", "role": "read", "indexes": ["wiki", "news"]},
      {"name": "ingest", "sha256": "...", "role": "write", "indexes": ["news"]},
      {"name": "ops", "sha256": "...", "role": "admin", "indexes": "*"}
    ]}

A key is sent as ``Authorization: Bearer KEY``; the server hashes what it receives and looks the hash up. Keys are
meant to be long random tokens (``new_key``: 32 random bytes), for which one SHA-256 is enough (a slow password
hash guards guessable secrets, which these are not). Roles are ordered: read (search, answer, explain, list),
write (read, and adding and deleting passages), admin (write, and creating, loading, unloading, dropping and
reloading indexes). ``indexes`` is a list of index names or "*" (every index, those created later too).

What a key sees: an index outside its scope is answered 404, as an index that does not exist (names do not leak);
a route above its role 403; no key, or an unknown one, 401. ``GET /v1/indexes``, ``/info`` and ``/metrics`` show
only the indexes in its scope. The single ``--api-key`` is an admin key over every index.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from pathlib import Path

ROLES = ("read", "write", "admin")


def hash_key(key: str) -> str:
    """The hex SHA-256 of ``key`` (what a keys file stores)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A new random key (URL-safe, 43 characters)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    """Who a request is: ``name`` (of the key), ``role`` (one of ROLES), ``indexes`` (a frozenset of names, or
    None: every index)."""

    name: str
    role: str
    indexes: frozenset | None = None

    def sees(self, index: str) -> bool:
        """Whether ``index`` is in this key's scope."""
        return self.indexes is None or index in self.indexes

    def may(self, role: str) -> bool:
        """Whether this key's role is ``role`` or above it."""
        return ROLES.index(self.role) >= ROLES.index(role)


OPEN = Principal("anonymous", "admin", None)  # a server without keys: every route, every index


class Keys:
    """The keys a server accepts. ``entries``: hex SHA-256 -> Principal. Empty (and no ``api_key``): the server is
    open (every request is OPEN)."""

    def __init__(self, entries: dict | None = None, api_key: str | None = None):
        self.entries = dict(entries or {})
        if api_key:
            self.entries[hash_key(api_key)] = Principal("api-key", "admin", None)

    @property
    def open(self) -> bool:
        return not self.entries

    @classmethod
    def load(cls, path, api_key: str | None = None) -> "Keys":
        """Read a keys file (ValueError naming the file and the entry when it is malformed)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"cannot read the keys file {path}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
            raise ValueError(f'{path}: expected {{"keys": [...]}}')
        entries = {}
        for i, e in enumerate(data["keys"]):
            where = f"{path}: keys[{i}]"
            if not isinstance(e, dict):
                raise ValueError(f"{where}: expected an object")
            unknown = set(e) - {"name", "sha256", "role", "indexes"}
            if unknown:
                raise ValueError(f"{where}: unknown field {sorted(unknown)[0]!r}")
            digest = e.get("sha256")
            if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(f"{where}.sha256: expected the key's SHA-256 as 64 lowercase hex digits")
            if e.get("role") not in ROLES:
                raise ValueError(f"{where}.role: expected one of {', '.join(ROLES)}, got {e.get('role')!r}")
            scope = e.get("indexes")
            if scope == "*":
                indexes = None
            elif isinstance(scope, list) and all(isinstance(x, str) and x for x in scope):
                indexes = frozenset(scope)
            else:
                raise ValueError(f'{where}.indexes: expected a list of index names or "*"')
            if digest in entries:
                raise ValueError(f"{where}.sha256: the same key is listed twice")
            entries[digest] = Principal(str(e.get("name") or f"key {i}"), e["role"], indexes)
        return cls(entries, api_key)

    def resolve(self, authorization: bytes | str | None) -> Principal | None:
        """The Principal of an Authorization header's value ("Bearer KEY"), None when it names no key here (OPEN
        when the server has no keys)."""
        if self.open:
            return OPEN
        if isinstance(authorization, str):
            authorization = authorization.encode("latin-1", "replace")
        scheme, _, token = (authorization or b"").partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        digest = hashlib.sha256(token.strip()).hexdigest()
        for known, principal in self.entries.items():  # compared in constant time, each
            if hmac.compare_digest(known, digest):
                return principal
        return None


__all__ = ["Keys", "OPEN", "Principal", "ROLES", "hash_key", "new_key"]
