"""A local server speaking the subset of OpenAI's chat-completions protocol
the provider uses. Tests script its answers, or give it a ``brain`` that
answers each request (``tests.drifting_model``); it records what it receives."""

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.helpers import serve_in_a_thread


@dataclass
class Reply:
    status: int = 200
    body: dict | None = None
    headers: dict = field(default_factory=dict)
    delay_seconds: float = 0
    #: Sent as it is instead of ``body``: what a broken proxy answers.
    raw: bytes | None = None
    content_type: str = "application/json"


def completion(content="", tool_calls=(), model="fake-model", finish_reason=None):
    """A chat.completion body; ``tool_calls`` as (id, name, arguments-string)."""
    message = {"role": "assistant", "content": content or None}
    if tool_calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            for call_id, name, args in tool_calls
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def error(status, message="boom", headers=None):
    return Reply(status, {"error": {"message": message, "type": "error"}}, headers or {})


@dataclass
class FakeOpenAI:
    server: ThreadingHTTPServer = None  # type: ignore[assignment]
    replies: deque = field(default_factory=deque)
    #: Served when the script is used up.
    default: Reply = field(default_factory=lambda: Reply(200, completion("done")))
    requests: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Answers a request's body once the scripted replies are used up.
    brain: Callable[[dict], Reply] | None = None
    #: (requests, seconds): past that many requests answered within any
    #: window of that many seconds, a request gets 429 with ``Retry-After``,
    #: as a provider's limit answers. None: no limit.
    limit: tuple[int, float] | None = None
    limit_retry_after: int = 1
    #: When each chat request arrived (monotonic), and each the limit refused.
    arrivals: list = field(default_factory=list)
    refused: list = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def tool_results_told(self) -> list[str]:
        """What the model was told as tool results, over every request."""
        return [
            message["content"]
            for sent in self.requests
            for message in sent["body"]["messages"]
            if message["role"] == "tool"
        ]

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def most_in_any_window(self, seconds: float) -> int:
        """The most chat requests that arrived within any ``seconds``."""
        times = sorted(self.arrivals)
        return max(
            (
                sum(1 for later in times[index:] if later - first < seconds)
                for index, first in enumerate(times)
            ),
            default=0,
        )

    def _over_limit(self) -> Reply | None:
        now = time.monotonic()
        with self.lock:
            self.arrivals.append(now)
            if self.limit is None:
                return None
            count, seconds = self.limit
            answered = [at for at in self.arrivals[:-1] if now - at < seconds]
            if len(answered) - sum(1 for at in self.refused if now - at < seconds) < count:
                return None
            self.refused.append(now)
        return error(429, "rate limited", {"retry-after": str(self.limit_retry_after)})

    def next_reply(self, body: dict) -> Reply:
        refusal = self._over_limit()
        if refusal is not None:
            return refusal
        with self.lock:
            if self.replies:
                return self.replies.popleft()
        return self.brain(body) if self.brain else self.default


def _handler(fake: FakeOpenAI):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            fake.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
            reply = fake.next_reply(body) if self.path == "/v1/chat/completions" else error(404)
            if reply.delay_seconds:
                time.sleep(reply.delay_seconds)
            data = reply.raw if reply.raw is not None else json.dumps(reply.body or {}).encode()
            try:
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type)
                self.send_header("content-length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out first

    return Handler


class _ManyClientsServer(ThreadingHTTPServer):
    #: Hundreds of runs connect at once (the bench's concurrent workers): the
    #: socketserver default backlog of 5 would refuse them as a model never does.
    request_queue_size = 1024


def start_fake_openai() -> FakeOpenAI:
    fake = FakeOpenAI()
    fake.server = _ManyClientsServer(("127.0.0.1", 0), _handler(fake))
    fake.server.daemon_threads = True
    serve_in_a_thread(fake.server)
    return fake
