"""A local HTTP server for the HTTP tools: it records what it receives, can
hold a request until the test releases it, and can misbehave (drop the
connection, cut a body short, answer garbage, send a huge or gzip-bomb body).
And the resolver the tests install in ``http_guard`` so names reach it."""

import functools
import json
import socket
import ssl
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        """The URL of ``path`` here, by address or by a name (``host``) the
        test's resolver maps to 127.0.0.1."""
        return f"{self.scheme}://{host}:{self.port}{path}"

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
            return self._reply(payload={"path": self.path})

        do_GET = _route
        do_POST = _route

    return Handler


def start_http_server(tls: ssl.SSLContext | None = None) -> LocalHttpServer:
    """Serve on 127.0.0.1; with ``tls``, HTTPS with that server context."""
    state = LocalHttpServer(server=None, scheme="https" if tls else "http")  # type: ignore[arg-type]
    state.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    if tls is not None:
        tls.sni_callback = lambda _socket, name, _context: state.server_names.append(name)
        state.server.socket = tls.wrap_socket(state.server.socket, server_side=True)
    state.server.daemon_threads = True
    threading.Thread(target=state.server.serve_forever, daemon=True).start()
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
    lookup); a name not added does not resolve. ``lookups`` lists the names
    asked for, in order."""

    __test__ = False  # not a pytest test class

    def __init__(self):
        self.answers: dict[str, list[list[str]]] = {}
        self.lookups: list[str] = []

    def add(self, name: str, *answers: list[str]) -> None:
        self.answers[name] = list(answers)

    def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append(host)
        answers = self.answers.get(host)
        if not answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return answers.pop(0) if len(answers) > 1 else answers[0]
