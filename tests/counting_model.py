"""A chat-completions server that counts its open connections and holds
every request until ``release_at`` of them wait at once (then answers each,
and every later one at once, with a final answer).

Asyncio in a thread of its own: thousands of connections cost it a
coroutine each, not a thread. A worker that cannot hold ``release_at``
model calls open at once never gets an answer: the test sees how many it
held (``most_waiting``), on an event, not a clock.
"""

import asyncio
import json
import threading

from tests.fake_openai import completion


class CountingModel:
    def __init__(self, release_at: int):
        self.release_at = release_at
        #: Connections open now, and the most at once.
        self.open = self.most_open = 0
        #: Requests waiting for the release now, and the most at once.
        self.waiting = self.most_waiting = 0
        self.answered = 0
        #: Set once ``release_at`` requests waited at once.
        self.released = threading.Event()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._release = asyncio.Event()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", 0, backlog=8192)
        )
        self._port = self._server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()
        # Stopped: the connections' coroutines end, then the loop closes.
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _connection(self, reader, writer) -> None:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                length = 0
                for line in head.split("\r\n"):
                    if line.startswith("content-length:"):
                        length = int(line.partition(":")[2])
                await reader.readexactly(length)
                await self._wait_for_the_release()
                body = json.dumps(completion("held and answered")).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                self.answered += 1
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client closed it, or the server stops
        finally:
            self.open -= 1
            writer.close()

    async def _wait_for_the_release(self) -> None:
        self.waiting += 1
        self.most_waiting = max(self.most_waiting, self.waiting)
        if self.waiting >= self.release_at:
            self._release.set()
            self.released.set()
        try:
            await self._release.wait()
        finally:
            self.waiting -= 1

    def stop(self) -> None:
        def close():
            self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(close)
        self._thread.join(10)
