"""The gateway's own credentials towards its replicas, and replica ids that never show a secret.

A replica URL may carry credentials (``http://user:pass@host:30000``, for a replica behind an
authenticating proxy). Its **id**, the name shown in ``x-kvroute-replica``, ``/status``, ``/metrics``,
logs, the admin API and the shared state, is the URL without them (``replica_id_of``); the credentials are
kept here and sent as HTTP Basic authentication on every request to that replica. A replica without
credentials in its URL gets ``--replica-api-key`` as ``Authorization: Bearer KEY`` (SGLang's
``--api-key``), when one is set. A client's own ``Authorization`` header is never forwarded
(``proxy/upstream/relay.py``): the keys clients present are kvroute's, not the replicas'.
"""

from __future__ import annotations

import base64
from urllib.parse import unquote, urlsplit, urlunsplit

from routing.types import ReplicaId


def replica_id_of(url: str) -> ReplicaId:
    """The URL without userinfo and trailing slash: what the replica is called everywhere."""
    parts = urlsplit(url.strip())
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=netloc)).rstrip("/")


def _basic(url: str) -> str | None:
    parts = urlsplit(url.strip())
    if parts.username is None:
        return None
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode("ascii")


class ReplicaAuth:
    """Per replica id, the ``Authorization`` value the gateway sends it (or none)."""

    def __init__(self, api_key: str | None = None) -> None:
        self._default = f"Bearer {api_key}" if api_key else None
        self._by_id: dict[ReplicaId, str] = {}

    def register(self, url: str) -> ReplicaId:
        """The replica's id; its URL's credentials, if any, are kept for it."""
        rid, basic = replica_id_of(url), _basic(url)
        if basic is not None:
            self._by_id[rid] = basic
        return rid

    def forget(self, rid: ReplicaId) -> None:
        self._by_id.pop(rid, None)

    def authorization(self, base_url: str) -> str | None:
        return self._by_id.get(base_url, self._default)
