"""What a process carries: the OpenAI and MCP SDKs cost a worker tens of MB
each (the bench's worker peak RSS), so they are imported when a run first
uses them — a process whose runs use neither never loads them."""

from tests.helpers import manage, sqlite_env

SDKS = ("openai", "mcp", "mcp_types")

_RUN_ONE_SCRIPTED_RUN = f"""
import sys
from django.core import checks
from runs.runtime import enqueue

checks.run_checks()  # every check (URLs, admin, API views): more than a worker loads
run = enqueue({{"prompt": "p", "tools": ["search_notes"],
               "provider": {{"kind": "scripted", "turns": [{{"content": "done"}}]}}}})
run.refresh_from_db()
print(run.status, sorted({{name.split(".")[0] for name in sys.modules}} & set({SDKS!r})))
"""


def test_a_process_whose_runs_use_neither_sdk_never_imports_them(tmp_path, migrated):
    # The run executes in the process that enqueues it, as a worker's would.
    migrated(tmp_path / "db.sqlite3")
    env = sqlite_env(tmp_path / "db.sqlite3", NRLLM_EXECUTE_IN_CALLER="true")
    shell = manage("shell", "-c", _RUN_ONE_SCRIPTED_RUN, env=env)
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.split("\n")[-2] == "completed []"
