"""The model the bench's real workload waits on: a chat-completions server
that answers every request after ``latency`` seconds. A run's first turn
calls ``read_note``; once a tool result is in the messages, it answers.

With a limit (``python -m bench.model_server LATENCY RPM``) it is a
provider's limit: a token bucket of a second of ``RPM`` answers 429 with
``Retry-After: 1`` past it, and ``GET /stats`` tells when each request was
answered and refused (the bench's rate-limited row).

``GET /stats`` answers on every server with the client connections open now
and the most open at once since it started (``connections_open``,
``connections_most``): how many connections the workers' model clients
hold, which caps the runs waiting on the model at once (the steady-state
rows, ``bench.steady_state``). A connection counts from its first model
request: the bench's own looks at ``/stats`` are not counted.

It runs as a process of its own (``python -m bench.model_server LATENCY``
prints its base URL), as a real model does, and spends as little CPU as it
can: one asyncio thread serves every connection and keeps it open between
requests (HTTP/1.1), as a provider does. On a two-core machine each
millisecond it spends is one the runtime under measure does not get.
"""

import asyncio
import json
import sys
import time

from tests.fake_openai import completion

#: The two answers, encoded once (the shape is the tests' fake server's).
CALL = json.dumps(
    completion(tool_calls=[("call-1", "read_note", '{"slug": "bench"}')], model="bench-model")
).encode()
ANSWER = json.dumps(completion("the note says hello", model="bench-model")).encode()


def _response(status: str, body: bytes, close: bool) -> bytes:
    head = [f"HTTP/1.1 {status}", "content-type: application/json", f"content-length: {len(body)}"]
    if status.startswith("429"):
        head.append("retry-after: 1")
    if close:
        head.append("connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Limit:
    """Requests per minute as a provider keeps them: a bucket of a second's
    worth, refilled continuously; and when each request came."""

    def __init__(self, per_minute: int):
        self.rate = per_minute / 60
        self.tokens = self.capacity = max(1.0, self.rate)
        self.at = time.monotonic()
        self.answered: list[float] = []
        self.refused: list[float] = []

    def admits(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            self.answered.append(now)
            return True
        self.refused.append(now)
        return False

    def stats(self) -> dict:
        return {"answered": self.answered, "refused": self.refused}


REFUSED = json.dumps({"error": {"message": "rate limit reached", "type": "requests"}}).encode()

#: The listen backlog: thousands of clients may connect at once (4,000 runs
#: in flight), past asyncio's default of 100. The kernel caps it at
#: ``net.core.somaxconn``.
BACKLOG = 8192


class Connections:
    """Client connections open now, and the most open at once: counted in
    the one event-loop thread, so plain integers."""

    def __init__(self):
        self.open = 0
        self.most = 0

    def opened(self) -> None:
        self.open += 1
        self.most = max(self.most, self.open)

    def closed(self) -> None:
        self.open -= 1

    def stats(self) -> dict:
        return {"connections_open": self.open, "connections_most": self.most}


def _reply(body: bytes) -> bytes:
    """The tool call, or the answer once a tool result is in the messages."""
    messages = json.loads(body).get("messages", [])
    told = any(message.get("role") == "tool" for message in messages)
    return ANSWER if told else CALL


async def _serve(
    latency: float, limit: Limit | None, connections: Connections, reader, writer
) -> None:
    counted = False
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            length = 0
            for line in head.split("\r\n"):
                if line.startswith("content-length:"):
                    length = int(line.partition(":")[2])
            body = await reader.readexactly(length)
            close = "connection: close" in head
            if head.startswith("get /stats"):
                stats = {**connections.stats(), **(limit.stats() if limit else {})}
                writer.write(_response("200 OK", json.dumps(stats).encode(), close))
                await writer.drain()
                continue
            if not counted:
                connections.opened()
                counted = True
            if limit is not None and not limit.admits():
                writer.write(_response("429 Too Many Requests", REFUSED, close))
                await writer.drain()
                continue
            try:
                status, reply = "200 OK", _reply(body)
            except (ValueError, AttributeError):
                status, reply = "400 Bad Request", b'{"error": {"message": "bad request"}}'
            await asyncio.sleep(latency)
            writer.write(_response(status, reply, close))
            await writer.drain()
            if close:
                break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the client went away
    finally:
        if counted:
            connections.closed()
        writer.close()


async def main(latency: float, per_minute: int | None = None) -> None:
    limit = Limit(per_minute) if per_minute else None
    connections = Connections()
    server = await asyncio.start_server(
        lambda reader, writer: _serve(latency, limit, connections, reader, writer),
        "127.0.0.1",
        0,
        backlog=BACKLOG,
    )
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None))
