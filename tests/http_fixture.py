"""A local HTTP server for the HTTP tools: it records what it receives, can
hold a request until the test releases it, and can misbehave (drop the
connection, cut a body short, answer garbage or any status, send a huge or
gzip-bomb body, trickle its answer, name a charset that is not one).
And the resolver the tests install in ``http_guard`` so names reach it."""

import functools
import gzip
import json
import socket
import ssl
import threading
import time
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.helpers import serve_in_a_thread


@dataclass
class ReceivedRequest:
    method: str
    path: str
    headers: dict
    body: bytes


@dataclass
class LocalHttpServer:
    server: ThreadingHTTPServer
    received: list = field(default_factory=list)
    #: Set by a held request when it arrives; the test sets ``release``.
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    #: Body bytes ``/huge`` and ``/gzip-bomb`` managed to write before the
    #: client hung up.
    body_bytes_sent: int = 0
    streamed: threading.Event = field(default_factory=threading.Event)

    scheme: str = "http"
    #: The server names TLS clients asked for (SNI), in order.
    server_names: list = field(default_factory=list)
    address: str = "127.0.0.1"

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def host(self) -> str:
        """host:port as an allow-list entry names it."""
        return f"{self._url_host}:{self.port}"

    @property
    def _url_host(self) -> str:
        return f"[{self.address}]" if ":" in self.address else self.address

    def url(self, path: str, host: str | None = None) -> str:
        """The URL of ``path`` here, by address or by a name (``host``) the
        test's resolver maps to the address (or the address spelled another way)."""
        return f"{self.scheme}://{host or self._url_host}:{self.port}{path}"

    def posts(self) -> list:
        return [request for request in self.received if request.method == "POST"]


def _handler(state: LocalHttpServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _record(self):
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            state.received.append(
                ReceivedRequest(self.command, self.path, dict(self.headers), body)
            )

        def _reply(self, status=200, payload=None, headers=()):
            data = json.dumps(payload if payload is not None else {"ok": True}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up first (a timeout test)

        def _stream(self, chunks, headers=()):
            self.send_response(200)
            self.send_header("content-type", "text/plain; charset=utf-8")
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            try:
                for chunk in chunks:
                    self.wfile.write(chunk)
                    state.body_bytes_sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading: what the cap tests want
            finally:
                state.streamed.set()

        def _misbehave(self) -> bool:
            if self.path == "/drop":  # read the request, close without a word
                self.close_connection = True
                return True
            if self.path == "/cut-body":
                self.send_response(200)
                self.send_header("content-length", "1000")
                self.end_headers()
                self.wfile.write(b'{"partial": ')
                self.close_connection = True
                return True
            if self.path == "/garbage":
                self.wfile.write(b"this is not HTTP\r\n\r\n")
                self.close_connection = True
                return True
            if self.path == "/huge":  # 64 MiB, far more than the cap
                self._stream(b"x" * 65536 for _ in range(1024))
                return True
            if self.path == "/gzip-bomb":
                self._stream([gzip_bomb()], [("content-encoding", "gzip")])
                return True
            if self.path == "/gzip-members":  # two gzip members, one after the other
                members = gzip.compress(b"first, ") + gzip.compress(b"second")
                self._stream([members], [("content-encoding", "gzip")])
                return True
            if self.path == "/gzip-cut":  # a complete HTTP body: half a gzip stream
                whole = gzip.compress(b"".join(b"line %d\n" % n for n in range(5000)))
                self._stream([whole[: len(whole) // 2]], [("content-encoding", "gzip")])
                return True
            if self.path.startswith("/charset/"):  # "ok", in whatever charset the path names
                self.send_response(200)
                charset = self.path.removeprefix("/charset/")
                self.send_header("content-type", f"text/plain; charset={charset}")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                return True
            if self.path == "/trickle":  # a byte every 0.2 s for 10 s, each within a read timeout
                self.send_response(200)
                self.send_header("content-length", "50")
                self.end_headers()
                try:
                    for _ in range(50):
                        self.wfile.write(b"x")
                        if state.release.wait(0.2):
                            break
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: what the test wants
                self.close_connection = True
                return True
            if self.path.startswith("/redirect-to/"):
                self._reply(302, headers=[("location", self.path.removeprefix("/redirect-to/"))])
                return True
            return False

        def _route(self):
            if self.path == "/no-read":  # leave the body unread: the client's write stalls
                state.release.wait(timeout=5)
                self.close_connection = True
                return None
            self._record()
            if self._misbehave():
                return None
            if self.path.startswith("/hold"):
                state.held.set()
                state.release.wait(timeout=60)
                return self._reply(payload={"held": True})
            if self.path == "/slow":
                state.release.wait(timeout=5)
                return self._reply()
            if self.path == "/redirect-out":
                return self._reply(302, headers=[("location", "http://blocked.invalid/x")])
            if self.path == "/redirect-in":
                return self._reply(302, headers=[("location", "/ok")])
            if self.path.startswith("/status/"):  # answer with the status the path names
                return self._reply(int(self.path.removeprefix("/status/")), {"error": "as asked"})
            return self._reply(payload={"path": self.path})

        do_GET = _route
        do_POST = _route

    return Handler


class _IPv6HttpServer(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def start_http_server(
    tls: ssl.SSLContext | None = None, address: str = "127.0.0.1"
) -> LocalHttpServer:
    """Serve on ``address`` (127.0.0.1, or ::1); with ``tls``, HTTPS with that
    server context."""
    scheme = "https" if tls else "http"
    state = LocalHttpServer(server=None, scheme=scheme, address=address)  # type: ignore[arg-type]
    server_class = _IPv6HttpServer if ":" in address else ThreadingHTTPServer
    state.server = server_class((address, 0), _handler(state))
    if tls is not None:
        tls.sni_callback = lambda _socket, name, _context: state.server_names.append(name)
        state.server.socket = tls.wrap_socket(state.server.socket, server_side=True)
    state.server.daemon_threads = True
    serve_in_a_thread(state.server)
    return state


@functools.cache
def gzip_bomb() -> bytes:
    """About 200 KB of gzip that decompresses to 200 MiB of zeros."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    zeros = bytes(1 << 20)
    return b"".join(compressor.compress(zeros) for _ in range(200)) + compressor.flush()


class TestResolver:
    """Names the HTTP tools resolve, as the test says: ``add("hook.test",
    ["127.0.0.1"])``. Each lookup takes the next answer given, the last one
    repeating (``add(name, first, then)`` re-binds the name after one
    lookup); a name not added, or added without answers, does not resolve.
    ``lookups`` lists the names asked for, in order."""

    __test__ = False  # not a pytest test class

    def __init__(self):
        self.answers: dict[str, list[list[str]]] = {}
        self.delays: dict[str, float] = {}
        self.lookups: list[str] = []

    def add(self, name: str, *answers: list[str], delay: float = 0) -> None:
        """``delay``: each lookup of ``name`` takes that many seconds, as from
        a DNS server that is slow to answer (or, with no answers, never does)."""
        self.answers[name] = list(answers)
        self.delays[name] = delay

    def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append(host)
        time.sleep(self.delays.get(host, 0))
        answers = self.answers.get(host)
        if not answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return answers.pop(0) if len(answers) > 1 else answers[0]
