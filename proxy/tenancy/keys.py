"""Client API keys (``--api-keys``): who may call ``/v1/*`` and ``/generate``, as which tenant, how fast.

The setting names a file, or holds the same content inline (it starts with ``[`` or ``{``; handy in
``KVROUTE_API_KEYS``). One entry per key, as JSON lines, a JSON array, or TOML ``[[key]]`` tables (a
file ending in ``.toml``)::

    {"sha256": "9f86d0...", "tenant": "acme", "requests_per_minute": 600, "tokens_per_minute": 2000000}
    {"key": "sk-plain-text", "tenant": "globex"}

``sha256`` is the hex SHA-256 of the key; a plain ``key`` is hashed at load and never kept: only hashes
are held in memory, and a presented key is looked up by its hash. ``tenant`` (optional) names the tenant
whose prefixes and KV are kept apart from every other tenant's (``proxy/tenancy/namespace.py``); the limits
are optional (0 or absent: unlimited) and belong to the tenant, shared by its keys (they must agree), or to
the key alone when it has no tenant. Errors name the entry (its line or index), never a key.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HEX64 = re.compile(r"[0-9a-f]{64}")


class ApiKeysError(ValueError):
    """The keys cannot be loaded; the message names the entry, never a key."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    sha256: str
    tenant: str = ""
    requests_per_minute: int = 0  # 0: unlimited
    tokens_per_minute: int = 0

    @property
    def bucket(self) -> str:
        """What its rate limits are counted on: the tenant, or the key alone."""
        return f"tenant:{self.tenant}" if self.tenant else f"key:{self.sha256[:16]}"


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class KeyRing:
    def __init__(self, keys: list[ApiKey]) -> None:
        self._by_hash = {k.sha256: k for k in keys}
        limits: dict[str, tuple[int, int]] = {}
        for k in keys:
            lim = (k.requests_per_minute, k.tokens_per_minute)
            if limits.setdefault(k.bucket, lim) != lim:
                raise ApiKeysError(f"the keys of tenant {k.tenant!r} have different limits")

    def __len__(self) -> int:
        return len(self._by_hash)

    def authenticate(self, authorization: str | None) -> ApiKey | None:
        """The key an ``Authorization: Bearer <key>`` header presents, or None."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self._by_hash.get(key_hash(token.strip()))

    def tenants(self) -> int:
        return len(self.tenant_names())

    def tenant_names(self) -> frozenset[str]:
        return frozenset(k.tenant for k in self._by_hash.values() if k.tenant)


def _limit(doc: dict[str, Any], name: str, where: str) -> int:
    value = doc.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApiKeysError(f"{where}: {name!r} must be a non-negative integer")
    return value


def _entry(doc: object, where: str) -> ApiKey:
    if not isinstance(doc, dict):
        raise ApiKeysError(f"{where}: expected an object")
    unknown = set(doc) - {"key", "sha256", "tenant", "requests_per_minute", "tokens_per_minute"}
    if unknown:
        raise ApiKeysError(f"{where}: unknown fields {sorted(unknown)}")
    plain, hashed = doc.get("key"), doc.get("sha256")
    if (plain is None) == (hashed is None):
        raise ApiKeysError(f"{where}: give exactly one of 'key' and 'sha256'")
    if plain is not None and (not isinstance(plain, str) or not plain.strip()):
        raise ApiKeysError(f"{where}: 'key' must be a non-empty string")
    if hashed is not None and (not isinstance(hashed, str) or not _HEX64.fullmatch(hashed.lower())):
        raise ApiKeysError(f"{where}: 'sha256' must be 64 hex digits")
    tenant = doc.get("tenant", "")
    if not isinstance(tenant, str):
        raise ApiKeysError(f"{where}: 'tenant' must be a string")
    digest = key_hash(plain.strip()) if isinstance(plain, str) else str(hashed).lower()
    rpm, tpm = _limit(doc, "requests_per_minute", where), _limit(doc, "tokens_per_minute", where)
    return ApiKey(digest, tenant, rpm, tpm)


def _json_entries(text: str, source: str) -> list[tuple[object, str]]:
    try:
        if text.lstrip().startswith("["):
            return [(d, f"{source} entry {i}") for i, d in enumerate(json.loads(text))]
        lines = [
            (n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip() and not ln.startswith("#")
        ]
        return [(json.loads(ln), f"{source} line {n}") for n, ln in lines]
    except json.JSONDecodeError as e:
        raise ApiKeysError(f"{source}: not JSON lines or a JSON array (line {e.lineno})") from None


def _inline(value: str) -> bool:
    return value.lstrip()[:1] in ("[", "{")


def _file_entries(path: str) -> list[tuple[object, str]]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ApiKeysError(f"cannot read {path}: {e.strerror or e}") from None
    if not path.endswith(".toml"):
        return _json_entries(text, path)
    try:
        tables = tomllib.loads(text).get("key", [])
    except tomllib.TOMLDecodeError as e:
        raise ApiKeysError(f"{path}: {e}") from None
    return [(d, f"{path} [[key]] {i}") for i, d in enumerate(tables)]


def load_keys(value: str) -> KeyRing:
    """The keys of the ``api_keys`` setting (a path, or inline JSON); raises ApiKeysError."""
    entries = _json_entries(value, "inline api_keys") if _inline(value) else _file_entries(value)
    keys = [_entry(doc, where) for doc, where in entries]
    if not keys:
        raise ApiKeysError(f"{'inline api_keys' if _inline(value) else value}: no keys")
    return KeyRing(keys)
