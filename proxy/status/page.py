"""``GET /status`` for people and for programs: the live status page or the JSON document.

Content negotiation: ``?format=html`` or ``?format=json`` decides when given (another value is a 400);
otherwise the page is served when the ``Accept`` header ranks ``text/html`` above ``application/json``
(a browser's ``text/html,...,*/*;q=0.8``), and JSON in every other case (no Accept, ``*/*``, curl,
the SDKs, ``kvroute status``): JSON stays the default for programs.

The page is one self-contained file, ``proxy/status/static/status.html`` (package data: inline CSS and JS, no
framework, nothing fetched from elsewhere, so it works offline). It polls ``status?format=json`` every
2 s and redraws. It is sent with a Content-Security-Policy that allows only its own inline code and
requests to this gateway, so a page that tried to load anything from elsewhere would be blocked.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from aiohttp import web

from proxy.errors import InvalidRequest

CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"
)


@cache
def page_bytes() -> bytes:
    return resources.files("proxy.status").joinpath("static/status.html").read_bytes()


def _quality(accept: str, wanted: str) -> float:
    """The q of ``wanted`` (type/subtype) in an Accept header: the most specific range that covers it."""
    kind = wanted.split("/", 1)[0]
    best: tuple[int, float] = (-1, 0.0)  # (specificity, q)
    for item in accept.split(","):
        media, *params = (p.strip() for p in item.split(";"))
        specificity = {wanted: 2, f"{kind}/*": 1, "*/*": 0}.get(media.lower(), -1)
        if specificity > best[0]:
            best = (specificity, _q(params))
    return best[1]


def _q(params: list[str]) -> float:
    for p in params:
        name, _, value = p.partition("=")
        if name.strip().lower() == "q":
            try:
                return min(1.0, max(0.0, float(value)))
            except ValueError:
                return 0.0
    return 1.0


def wants_html(request: web.Request) -> bool:
    fmt = request.query.get("format")
    if fmt is not None:
        if fmt not in {"html", "json"}:
            raise InvalidRequest(f"format must be 'html' or 'json', not {fmt!r}", param="format")
        return fmt == "html"
    accept = request.headers.get("Accept", "")
    return _quality(accept, "text/html") > _quality(accept, "application/json")


def page_response() -> web.Response:
    return web.Response(
        body=page_bytes(),
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-cache", "Content-Security-Policy": CSP},
    )
