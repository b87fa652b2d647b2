"""The peer figure: the same 10-step no-op workload on DBOS Transact.

Run with the interpreter of the bench's own DBOS virtualenv (``make bench``
makes it from ``bench/requirements-dbos.txt``; DBOS is not a dependency of
the app), against a database on the same PostgreSQL server:

    python bench/dbos_peer.py SYSTEM_DATABASE_URL WORKFLOWS

Prints one JSON object: steps per second over ``WORKFLOWS`` sequential
workflows of ten durable no-op steps each.
"""

import json
import sys
import time

from dbos import DBOS, DBOSConfig

STEPS_PER_WORKFLOW = 10


@DBOS.step()
def noop_step() -> None:
    return None


@DBOS.workflow()
def ten_noop_steps() -> int:
    for _ in range(STEPS_PER_WORKFLOW):
        noop_step()
    return STEPS_PER_WORKFLOW


def main(database_url: str, workflows: int) -> dict:
    config: DBOSConfig = {"name": "nrllm-bench-peer", "system_database_url": database_url}
    DBOS(config=config)
    DBOS.launch()
    try:
        ten_noop_steps()  # warm-up: connections, prepared plans
        started = time.perf_counter()
        steps = sum(ten_noop_steps() for _ in range(workflows))
        elapsed = time.perf_counter() - started
    finally:
        DBOS.destroy()
    return {
        "dbos_version": _version(),
        "workflows": workflows,
        "steps": steps,
        "steps_per_second": steps / elapsed,
    }


def _version() -> str:
    from importlib.metadata import version

    return version("dbos")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
