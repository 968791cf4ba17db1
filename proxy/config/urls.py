"""URLs in settings: a replica's base URL checked, and a URL with its password hidden for the logs."""

from __future__ import annotations

from urllib.parse import urlsplit


def parse_url(v: str) -> str:
    parts = urlsplit(v.strip())
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"expected an http(s) URL, got {v!r}")
    parts.port  # noqa: B018 (raises ValueError for a port that is not a number in range)
    return v.strip().rstrip("/")


def redacted_url(url: str) -> str:
    """The URL without its password (``redis://user:***@host:port/db``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{netloc[2]}").geturl()
