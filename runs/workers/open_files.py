"""What a concurrent worker's slots hold open at once, and the process's
open-files limit raised to it at start, or the worker refused.

Each slot of a ``ConcurrentWorker`` may hold, at once, a connection to the
model (``runs.providers.openai_clients``: one per slot), one to Redis (the
worker's pool holds one per slot, ``runs.workers.concurrent``), one its
tool call opens (the built-in HTTP tools) and one to each MCP server reached
over HTTP (``tools.mcp.pooled_http``: one per slot and server); the process
adds its database pool and its own files. A
process under the usual soft limit of 1,024 open files would refuse
connections past it (``EMFILE``) from about 300 slots on, each refusal a
failed call; so the worker raises its soft limit (to the hard limit, which
only the system may raise) when it is below what its slots need, and refuses to start,
naming both settings, when even the hard limit is too low.
"""

import resource

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tools.mcp.declaration import StreamableHttp
from tools.registry import get_registry

#: Files the process holds whatever its slots: its database pool aside, its
#: modules' files, its listening and pub/sub sockets, RQ's, stdio MCP
#: servers' pipes, the log file, a tool thread left behind past its limit.
FILES_BESIDE_THE_SLOTS = 64


def _http_mcp_servers() -> int:
    count = 0
    for toolset in get_registry().toolsets:
        try:
            count += isinstance(toolset.get_transport(), StreamableHttp)
        except Exception:  # noqa: BLE001  (its sessions fail on their own, with their reason)
            count += 1
    return count


def _database_pool_size() -> int:
    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    return pool.get("max_size", 0) if isinstance(pool, dict) else 0


def open_files_needed(slots: int) -> int:
    """The files a worker of ``slots`` runs in flight may hold open at once:
    per slot the model's connection and Redis's (both kept open between
    calls), one to each MCP server over HTTP, and one more that a tool's
    call opens (the built-in HTTP tools, a connection per call)."""
    per_slot = 3 + _http_mcp_servers()
    return slots * per_slot + _database_pool_size() + FILES_BESIDE_THE_SLOTS


def hold_open_files(slots: int) -> int:
    """Raise this process's soft open-files limit, when below what ``slots``
    runs in flight need, to its hard limit (the estimate is a floor: a tool
    left running past its limit holds its socket too); returns the soft
    limit now. Raises ``ImproperlyConfigured`` naming
    ``NRLLM_WORKER_CONCURRENCY`` and the open-files limit when the hard
    limit is below what they need, or the system refuses to raise it."""
    needed = open_files_needed(slots)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    refusal = (
        f"NRLLM_WORKER_CONCURRENCY={slots} needs up to {needed} open files (per run "
        "in flight a connection to the model, one to Redis, one a tool's call opens and "
        "one to each MCP server over HTTP, beside the database pool), past this "
        f"process's open-files limit (RLIMIT_NOFILE: {soft}, at most "
        f"{'unlimited' if hard == resource.RLIM_INFINITY else hard}): raise the limit "
        "(`ulimit -n`, systemd's LimitNOFILE=, docker's --ulimit nofile=) or lower "
        "NRLLM_WORKER_CONCURRENCY"
    )
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ImproperlyConfigured(refusal)
    raised = hard if hard != resource.RLIM_INFINITY else needed
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    except (ValueError, OSError):
        # An unlimited hard limit past the kernel's own (fs.nr_open).
        raise ImproperlyConfigured(f"{refusal}; raising it failed") from None
    return raised
