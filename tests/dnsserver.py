"""A small authoritative DNS server on 127.0.0.1 for tests: UDP, in a thread, answers built with dnspython.

The test owns the zone and changes it while the server runs: ``set(name, "A", "127.0.0.2", ...)``,
``set(name, "SRV", "0 0 30000 host.")``, ``clear(name)``. A name with records of other types only gets an
empty answer (NOERROR), an unknown name NXDOMAIN. ``mode`` makes it misbehave: ``"servfail"`` answers
SERVFAIL to everything; ``"hold"`` receives queries and answers them only once ``release()`` is called
(or never, if the test does not). ``queries`` counts what arrived. Being in a thread, it answers while
the test's event loop is busy or blocked, and the gateway under test may run in-process or as a
subprocess.
"""

from __future__ import annotations

import socketserver
import threading
from types import TracebackType
from typing import Literal, Self

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

Mode = Literal["answer", "servfail", "hold"]


class DnsServer:
    def __init__(self, ttl: int = 1) -> None:
        self.ttl = ttl
        self.mode: Mode = "answer"
        self.queries = 0
        self._zone: dict[tuple[dns.name.Name, dns.rdatatype.RdataType], tuple[str, ...]] = {}
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._server = socketserver.ThreadingUDPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def set(self, name: str, rdtype: str, *rdatas: str) -> None:
        with self._lock:
            self._zone[(dns.name.from_text(name), dns.rdatatype.from_text(rdtype))] = rdatas

    def clear(self, name: str) -> None:
        with self._lock:
            qname = dns.name.from_text(name)
            self._zone = {k: v for k, v in self._zone.items() if k[0] != qname}

    def release(self) -> None:
        """Answer the held queries (and every later one at once)."""
        self._released.set()

    def answer(self, wire: bytes) -> bytes:
        query = dns.message.from_wire(wire)
        with self._lock:
            self.queries += 1
            mode, zone = self.mode, dict(self._zone)
        if mode == "hold":
            self._released.wait()
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        question = query.question[0]
        if mode == "servfail":
            response.set_rcode(dns.rcode.SERVFAIL)
        elif not any(name == question.name for name, _ in zone):
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif rdatas := zone.get((question.name, question.rdtype)):
            rrset = dns.rrset.from_text_list(
                question.name, self.ttl, dns.rdataclass.IN, question.rdtype, rdatas
            )
            response.answer.append(rrset)
        return response.to_wire()

    def _handler(self) -> type[socketserver.BaseRequestHandler]:
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data, sock = self.request
                sock.sendto(server.answer(data), self.client_address)

        return Handler

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
