"""A real webhook receiver for the run-ended and approval webhooks' tests:
an HTTP server on the loopback that answers as the test says, or holds its
answers until the test releases them."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import free_port

#: In the URL's query, as hook URLs often carry their credential: never shown.
TOKEN = "tok-SECRET-42"
#: What the run-ended webhook's receiver is told to check signatures with.
SECRET = "run-webhook-secret"


class Receiver:
    """A webhook receiver on 127.0.0.1:``port``, started when the test says
    (before that, connections are refused). It answers ``status`` (and
    ``body``); while ``holding`` is above 0 it holds each next POST (one
    fewer to hold each time) until ``release`` is set: ``held`` counts
    them, ``wait_held`` waits for them. ``answered`` lists (event id,
    status) of every answer it wrote whole and not held (the client of a
    held one may be gone). With ``echo_authorization`` the answer ends with
    the request's ``Authorization`` header, as a receiver that says which
    credentials it refused may."""

    def __init__(self):
        self.port = free_port()
        self.status, self.body, self.holding, self.held = 200, "", 0, 0
        self.echo_authorization = False
        self.posts: list[tuple[dict, bytes]] = []
        self.answered: list[tuple[str, int]] = []
        self.release = threading.Event()
        self._changed = threading.Condition()
        self._server = None

    def url(self, path: str = f"/hooks/runs?token={TOKEN}") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {name.lower(): value for name, value in self.headers.items()}
                receiver.posts.append((headers, body))
                status, answer = receiver.status, receiver.body
                if receiver.echo_authorization:
                    answer += f" {headers.get('authorization')}"
                answer = answer.encode()
                if receiver.hold_this_one():
                    receiver.release.wait(timeout=120)
                    status = None  # its client may be gone: not counted as answered
                # Counted before it is answered: the client goes on as soon as
                # it reads the answer, and a test that asks next must see it.
                counted = None
                if status is not None and "x-nrllm-event-id" in headers:
                    counted = (headers["x-nrllm-event-id"], status)
                    receiver.answered.append(counted)
                try:
                    self.send_response(status or 200)
                    self.send_header("content-length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    # A held POST's client gave up (or was killed): not answered.
                    if counted is not None:
                        receiver.answered.remove(counted)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def hold_this_one(self) -> bool:
        with self._changed:
            if self.holding <= 0:
                return False
            self.holding -= 1
            self.held += 1
            self._changed.notify_all()
            return True

    def wait_held(self, count: int, timeout: float = 120) -> bool:
        """Wait until ``count`` POSTs are held in all; whether they are."""
        with self._changed:
            return self._changed.wait_for(lambda: self.held >= count, timeout)

    def stop(self):
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def delivered(self) -> dict[str, int]:
        """How many 2xx answers each event id got."""
        counts: dict[str, int] = {}
        for event_id, status in self.answered:
            if 200 <= status < 300:
                counts[event_id] = counts.get(event_id, 0) + 1
        return counts


@pytest.fixture
def receiver(settings):
    """A receiver (not yet started) whose address the SSRF guard allows, with the
    run-ended webhook signed by ``SECRET``."""
    receiver = Receiver()
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [f"127.0.0.1:{receiver.port}"]
    settings.NRLLM_RUN_WEBHOOK_SECRET = SECRET
    yield receiver
    receiver.stop()
