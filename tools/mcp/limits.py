"""A cap in bytes on each JSON-RPC message an MCP server sends, applied as
the bytes arrive: a server answering with gigabytes costs this process
``MESSAGE_BYTES``, never the whole answer parsed and then cut.

The SDK caps one server-sent event of a streamable-HTTP answer
(``max_sse_event_size``, given ``MESSAGE_BYTES`` here); it reads a stdio
line and a JSON body of any size whole. Those two are read here instead:

- ``capped_stdio_client``: the SDK's ``stdio_client`` (its process start and
  its bounded shutdown, reused), its reader cut at the cap per line;
- ``CappedJsonBodies``: the HTTP client's transport, a JSON body cut at the
  cap.

A message past the cap is not parsed. If its start shows it answers a
request (the id comes first in what SDK servers write; over HTTP the
request is known), a JSON-RPC error stands in for it (code
``PAST_THE_CAP``, the answer's first characters in its data); the session
reads that as it reads any answer (``sessions``: a listing that fails, a
call's result cut and marked ``truncated``). A notification or a server's
request past the cap is dropped; an answer whose id cannot be read from its
start ends the session, as a connection that broke.
"""

import json
import logging
import sys
from contextlib import asynccontextmanager

import anyio
import anyio.lowlevel
import httpx2
from mcp.client import stdio

logger = logging.getLogger(__name__)

#: The most bytes of one JSON-RPC message read from a server. A listing of
#: a hundred tools with their schemas is a few hundred kilobytes.
MESSAGE_BYTES = 4 * 1024 * 1024
#: The code of the error standing in for an answer past the cap (in the
#: range JSON-RPC leaves to implementations; the SDK uses none of it).
PAST_THE_CAP = -32099
#: How many characters of an answer past the cap its stand-in keeps (as
#: many as the journal keeps of a result, ``results.RESULT_CHARS``).
KEPT_CHARS = 64_000
#: How many bytes of a message past the cap are kept to read its id from
#: and to keep ``KEPT_CHARS`` of (a character is at most 4 bytes).
START_BYTES = 4 * KEPT_CHARS


class UnreadableAnswer(Exception):
    """An answer past the cap whose id is not in its start."""


def past_the_cap(start: bytes, request_id=None) -> bytes | None:
    """The stand-in for a message past the cap whose first bytes are
    ``start``: a JSON-RPC error answering its request (``request_id``, or
    the id its start shows), or None for a notification or a server's
    request, which are dropped. Raises ``UnreadableAnswer``."""
    start = start[:START_BYTES]
    fields = _leading_fields(start.decode("utf-8", "replace"))
    if "method" in fields:
        return None
    answered = fields.get("id", request_id)
    if not isinstance(answered, str | int) or isinstance(answered, bool):
        raise UnreadableAnswer("an answer past the cap does not show its id first")
    error = {
        "code": PAST_THE_CAP,
        "message": f"the answer is larger than {MESSAGE_BYTES} bytes, this client's cap",
        "data": {"start": start.decode("utf-8", "replace")[:KEPT_CHARS]},
    }
    return json.dumps({"jsonrpc": "2.0", "id": answered, "error": error}).encode()


def _leading_fields(text: str) -> dict:
    """The members of the JSON object ``text`` starts with, in order, up to
    the first whose value does not end within it."""
    decoder, fields = json.JSONDecoder(), {}
    position = _skip_space(text, 0)
    if not text.startswith("{", position):
        return fields
    position += 1
    try:
        while True:
            key, position = decoder.raw_decode(text, _skip_space(text, position))
            position = _skip_space(text, position)
            if text[position] != ":":
                return fields
            value, position = decoder.raw_decode(text, _skip_space(text, position + 1))
            fields[key] = value
            position = _skip_space(text, position)
            if text[position] != ",":
                return fields
            position += 1
    except (ValueError, IndexError):
        return fields


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


async def capped_lines(receive_stream):
    """``(line, None)`` for each line of the byte stream, or ``(None,
    start)`` for a line past ``MESSAGE_BYTES`` — its first ``START_BYTES``,
    the rest read and dropped, never held."""
    held, start = bytearray(), None
    async for chunk in receive_stream:
        position = 0
        while True:
            end = chunk.find(b"\n", position)
            piece = chunk[position:] if end < 0 else chunk[position:end]
            if start is None:
                if len(held) + len(piece) > MESSAGE_BYTES:
                    start = bytes(held[:START_BYTES]) + piece[: max(0, START_BYTES - len(held))]
                    held.clear()
                else:
                    held += piece
            if end < 0:
                break
            yield (None, start) if start is not None else (bytes(held), None)
            held.clear()
            start = None
            position = end + 1


@asynccontextmanager
async def capped_stdio_client(server: stdio.StdioServerParameters):
    """``mcp.client.stdio.stdio_client`` with each line read to the cap.

    The process start and the shutdown (close stdin, wait, kill the tree,
    all bounded) are the SDK's own functions; only the reader differs."""
    command = await stdio._get_executable_command(server.command)
    process = await stdio._create_platform_compatible_process(
        command=command,
        args=server.args,
        env=stdio.get_default_environment() | (server.env or {}),
        errlog=sys.stderr,
        cwd=server.cwd,
    )
    read_stream_writer, read_stream = anyio.create_memory_object_stream(0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream(0)
    writer_done = anyio.Event()

    async def stdout_reader() -> None:
        try:
            async with read_stream_writer:
                try:
                    async for line, start in capped_lines(process.stdout):
                        if start is not None:
                            try:
                                line = past_the_cap(start)
                            except UnreadableAnswer as error:
                                logger.warning("MCP server %r: %s", server.command, error)
                                return  # its caller cannot be told: the session ends
                            if line is None:
                                continue  # a notification or a request: dropped
                        text = line.decode(server.encoding, server.encoding_error_handler)
                        await read_stream_writer.send(stdio._parse_line(text))
                finally:
                    await stdio._drain_stdout(process)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            pass  # the session or the pipe is gone: it sees the stream end

    async def stdin_writer() -> None:
        try:
            async with write_stream_reader:
                async for session_message in write_stream_reader:
                    json_text = session_message.message.model_dump_json(
                        by_alias=True, exclude_unset=True
                    )
                    data = (json_text + "\n").encode(server.encoding, server.encoding_error_handler)
                    await process.stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_stream_writer.aclose()
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(stdio._WRITER_FLUSH_TIMEOUT):
            await writer_done.wait()
        await stdio._stop_server_process(process)
        await stdio._aclose_all(read_stream, write_stream, read_stream_writer, write_stream_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(stdout_reader)
        tasks.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await shutdown()
            tasks.cancel_scope.cancel()


class CappedJsonBodies(httpx2.AsyncBaseTransport):
    """An HTTP transport whose JSON bodies are read to the cap; a body past
    it is replaced by its stand-in, answering the request that was sent."""

    def __init__(self, transport: httpx2.AsyncBaseTransport):
        self._transport = transport

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._transport.handle_async_request(request)
        if not response.headers.get("content-type", "").lower().startswith("application/json"):
            return response  # an event stream: the SDK caps each event
        headers = [(k, v) for k, v in response.headers.raw if k.lower() != b"content-length"]
        return httpx2.Response(
            response.status_code,
            headers=headers,
            stream=_CappedBody(response.stream, _request_id(request)),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._transport.aclose()


def _request_id(request: httpx2.Request):
    try:
        return json.loads(request.content).get("id")
    except (ValueError, AttributeError, httpx2.RequestNotRead):
        return None


class _CappedBody(httpx2.AsyncByteStream):
    def __init__(self, stream, request_id):
        self._stream = stream
        self._request_id = request_id

    async def __aiter__(self):
        held = bytearray()
        async for chunk in self._stream:
            if len(held) + len(chunk) > MESSAGE_BYTES:
                held += chunk[: max(0, START_BYTES - len(held))]
                await self._stream.aclose()  # the rest is never read
                try:
                    yield past_the_cap(bytes(held), self._request_id) or b""
                except UnreadableAnswer:
                    yield b""  # the SDK answers the request: not JSON-RPC
                return
            held += chunk
        yield bytes(held)

    async def aclose(self) -> None:
        await self._stream.aclose()
