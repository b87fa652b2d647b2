"""A redis-server of a test's own (``own_redis``), which the test may stop,
start again on the same port (empty: nothing is persisted), stall, or
demote to a replica, without touching the other tests' Redis;
``settings.REDIS_URL`` points at it, and workers the test starts get it as
their ``REDIS_URL``."""

import contextlib
import shutil
import subprocess

import port_for
import pytest
import redis

from tests.helpers import free_port, wait_until
from tests.processes import paused


class RedisServer:
    def __init__(self):
        self.port = port_for.select_random()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._servers: list[subprocess.Popen] = []

    def start(self) -> None:
        command = [shutil.which("redis-server"), "--port", str(self.port)]
        command += ["--save", "", "--appendonly", "no"]
        self._servers.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))
        wait_until(self.answers, what="redis-server to start")

    def stop(self) -> None:
        self._servers[-1].terminate()
        self._servers[-1].wait(timeout=30)

    @contextlib.contextmanager
    def stalled(self):
        """The server stopped (SIGSTOP) while the block runs, continued
        after: it takes connections and answers nothing, as a paused host
        or a network that drops packets does; what it was sent is answered
        once it goes on, its data kept."""
        with paused(self._servers[-1]):
            yield

    @contextlib.contextmanager
    def demoted(self):
        """The server a replica while the block runs, as a failover makes
        of the old master: of a master that is not there, so it keeps its
        data and answers reads, refuses every write (READONLY) and ends a
        blocked command (UNBLOCKED); a master again after."""
        client = redis.Redis(port=self.port)
        client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        try:
            yield
        finally:
            client.execute_command("REPLICAOF", "NO", "ONE")

    def answers(self) -> bool:
        try:
            return redis.Redis(port=self.port, socket_connect_timeout=1).ping()
        except redis.exceptions.ConnectionError:
            return False

    def close(self) -> None:
        for server in self._servers:
            if server.poll() is None:
                server.kill()
                server.wait(timeout=30)


@pytest.fixture
def own_redis(settings):
    server = RedisServer()
    server.start()
    settings.REDIS_URL = server.url
    yield server
    server.close()
