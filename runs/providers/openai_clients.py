"""The process's connections to the configured chat-completions endpoint:
``openai.OpenAI`` clients over pools of about a hundred connections, as many
in all as the worker has slots, sharing one TLS context (G15).

A run's thread holds a connection for its whole model call, 20-60 s for a
reasoning model. Left to the SDK, one client's pool stops at 1,000
connections, so a worker with 2,000 slots held 1,000 calls and the rest of
its runs waited for a connection (946 of 2,000 threads, in a stack dump of
the bench's steady state); and one pool of N connections costs every
request a walk over all N (``ground.connection_pools``). Here the
connections are ``max(NRLLM_WORKER_CONCURRENCY, 100)``, split into pools of
about 100, and each call takes the least busy pool: a worker with N slots
holds N calls open at once, each request costing what it does among a
hundred. The SDK's client objects are light; the TLS context (the CA bundle
loaded, ~10 ms and ~1 MB) is built once for all of them.

The clients are built on first use, per configuration, and kept per
process: a forked work horse keeps a set its parent built but never sent a
request with (no connection open yet), and builds its own if the parent
used it, never sharing its parent's sockets.
"""

import os
import threading

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from ground.connection_pools import CONNECTIONS_PER_POOL, LeastBusy, pool_sizes


class ModelClients:
    """``openai.OpenAI`` clients, one per pool of ``pool_sizes(connections)``,
    all on one TLS context; ``post`` sends through the least busy one. Their
    pools are locked and they keep no state of a request, so every run and
    thread of the process shares them."""

    def __init__(self, *, base_url, api_key, read_timeout, connect_timeout, connections):
        import httpx
        import openai

        # httpx's own default context (certifi's CAs, or SSL_CERT_FILE /
        # SSL_CERT_DIR), once for every pool rather than once a client.
        tls = httpx.create_ssl_context()
        self.sizes = pool_sizes(connections)
        self.clients = [
            openai.OpenAI(
                base_url=base_url,
                api_key=api_key,
                # The run row decides retries, never the SDK.
                max_retries=0,
                timeout=openai.Timeout(read_timeout, connect=connect_timeout),
                # The SDK's client (its redirects, the environment's
                # proxies) with the pool's size, every connection kept
                # between calls: a slot's next call finds one open.
                http_client=openai.DefaultHttpxClient(
                    verify=tls,
                    limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
                ),
            )
            for size in self.sizes
        ]
        self.timeout = self.clients[0].timeout
        self._least_busy = LeastBusy(len(self.clients))

    def post(self, path: str, **kwargs):
        """The SDK's ``post`` through the least busy pool's client."""
        with self._least_busy.taken() as index:
            return self.clients[index].post(path, **kwargs)


def model_connections() -> int:
    """Connections the process holds to the model at most: one per slot of
    a concurrent worker (``NRLLM_WORKER_CONCURRENCY``), and never fewer than
    a pool's (a web process's request threads, a one-run worker's)."""
    return max(settings.NRLLM_WORKER_CONCURRENCY, CONNECTIONS_PER_POOL)


#: Configuration → (clients, the process that first sent a request with them).
_clients: dict[tuple, tuple] = {}
_clients_lock = threading.Lock()
#: Clients a forked child inherited in use: kept referenced, never closed or
#: collected here, since closing one would take a lock of its pool that a
#: thread of the parent may have held at the fork.
_inherited: list = []


def _configuration() -> tuple:
    return (
        settings.NRLLM_OPENAI_BASE_URL,
        settings.NRLLM_OPENAI_API_KEY,
        settings.NRLLM_OPENAI_READ_TIMEOUT_SECONDS,
        settings.NRLLM_OPENAI_CONNECT_TIMEOUT_SECONDS,
        model_connections(),
    )


def _new_clients(key: tuple) -> ModelClients:
    base_url, api_key, read_timeout, connect_timeout, connections = key
    return ModelClients(
        base_url=base_url,
        api_key=api_key,
        read_timeout=read_timeout,
        connect_timeout=connect_timeout,
        connections=connections,
    )


def shared_clients() -> ModelClients:
    """The process's clients for the configured endpoint, key, timeouts and
    slots, built on first use.

    A forked work horse keeps clients its parent built but never sent a
    request with (no connection open yet: the TLS context and the SDK's
    modules are what it saves). Clients another process used are never this
    process's: they are set aside (``_inherited``) and new ones built, so a
    child never shares its parent's sockets, whether or not the fork ran
    Python's at-fork hooks.
    """
    key = _configuration()
    entry = _clients.get(key)
    if entry is None or entry[1] != os.getpid():
        with _clients_lock:
            entry = _clients.get(key)
            if entry is None:
                entry = (_new_clients(key), None)
            elif entry[1] not in (None, os.getpid()):
                _inherited.append(entry[0])
                entry = (_new_clients(key), None)
            # Sending a request is near: from here on its pools are this process's.
            entry = _clients[key] = (entry[0], os.getpid())
    return entry[0]


def built_clients() -> None:
    """Build the configured clients, and load what their first request
    needs, without sending anything: work horses forked afterwards inherit
    them (``runs.workers.preload.load_for_runs``)."""
    from runs.providers import openai_failures  # noqa: F401  (a failed call's mapping)

    key = _configuration()
    with _clients_lock:
        if key not in _clients:
            _clients[key] = (_new_clients(key), None)


def _after_fork() -> None:
    # The lock may have been held by a thread the child does not have. (The
    # clients the parent used are set aside by ``shared_clients`` itself.)
    global _clients_lock
    _clients_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


@receiver(setting_changed)
def _forget_clients(setting, **kwargs):
    # Tests change the endpoint (and the slots) per test: the old clients go.
    if setting.startswith("NRLLM_OPENAI_") or setting == "NRLLM_WORKER_CONCURRENCY":
        with _clients_lock:
            _clients.clear()
