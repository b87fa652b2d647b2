"""The model the bench's real workload waits on: a chat-completions server
that answers every request after ``latency`` seconds. A run's first turn
calls ``read_note``; once a tool result is in the messages, it answers.

It runs as a process of its own (``python -m bench.model_server LATENCY``
prints its base URL), as a real model does, and spends as little CPU as it
can: one asyncio thread serves every connection and keeps it open between
requests (HTTP/1.1), as a provider does. On a two-core machine each
millisecond it spends is one the runtime under measure does not get.
"""

import asyncio
import json
import sys

from tests.fake_openai import completion

#: The two answers, encoded once (the shape is the tests' fake server's).
CALL = json.dumps(
    completion(tool_calls=[("call-1", "read_note", '{"slug": "bench"}')], model="bench-model")
).encode()
ANSWER = json.dumps(completion("the note says hello", model="bench-model")).encode()


def _response(status: str, body: bytes, close: bool) -> bytes:
    head = [f"HTTP/1.1 {status}", "content-type: application/json", f"content-length: {len(body)}"]
    if close:
        head.append("connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _reply(body: bytes) -> bytes:
    """The tool call, or the answer once a tool result is in the messages."""
    messages = json.loads(body).get("messages", [])
    told = any(message.get("role") == "tool" for message in messages)
    return ANSWER if told else CALL


async def _serve(latency: float, reader, writer) -> None:
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            length = 0
            for line in head.split("\r\n"):
                if line.startswith("content-length:"):
                    length = int(line.partition(":")[2])
            body = await reader.readexactly(length)
            close = "connection: close" in head
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
        writer.close()


async def main(latency: float) -> None:
    server = await asyncio.start_server(
        lambda reader, writer: _serve(latency, reader, writer), "127.0.0.1", 0, backlog=1024
    )
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1])))
