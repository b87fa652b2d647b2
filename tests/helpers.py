"""Small builders and waiting helpers shared by the tests."""

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def scripted(*turns, tools=(), prompt="test prompt", max_iterations=None) -> dict:
    """A run request with the scripted provider playing ``turns``."""
    request = {
        "prompt": prompt,
        "tools": list(tools),
        "provider": {"kind": "scripted", "turns": list(turns)},
    }
    if max_iterations is not None:
        request["max_iterations"] = max_iterations
    return request


def call(name, **arguments) -> dict:
    """A scripted turn that calls one tool."""
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def answer(content="done", **extra) -> dict:
    return {"content": content, **extra}


def wait_until(predicate, *, timeout=20.0, interval=0.05, what="condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def collected(path) -> dict:
    """Every sample Prometheus' multiprocess directory ``path`` exposes:
    {(name, labels): value}."""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from prometheus_client.parser import text_string_to_metric_families

    from nrllm_ops import metrics_files

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(path))
    with metrics_files.reading_lock(path):
        text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def manage(*args: str, env: dict, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``manage.py *args`` in a process of its own with ``env``; its output as text."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
