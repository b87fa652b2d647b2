"""A local HTTP server for the HTTP tools: it records what it receives and
can hold a request until the test releases it."""

import json
import threading
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

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def url(self, path: str) -> str:
        return f"http://{self.host}{path}"

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

        def _route(self):
            self._record()
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


def start_http_server() -> LocalHttpServer:
    state = LocalHttpServer(server=None)  # type: ignore[arg-type]
    state.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.server.daemon_threads = True
    threading.Thread(target=state.server.serve_forever, daemon=True).start()
    return state
