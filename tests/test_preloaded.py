"""``tests/preloaded.py``: a ``manage.py`` process forked from the preloaded
interpreter is the process the test asked for (its arguments, environment,
standard streams, exit status and signals); one whose environment a
preloaded library might have read starts as usual; and no library that
reads a setting as it is imported can be preloaded."""

import os
import signal
import subprocess
import sys

from django.conf import settings

from tests.helpers import ROOT, wait_until
from tests.preloaded import PRELOAD, PreloadedPopen

#: What the child reports: its standard streams; a variable of the
#: request's, its arguments, its parent; then what it read from its standard
#: input, on its standard error.
REPORT = (
    "import os, sys\n"
    "streams = (sys.stdin, sys.stdout, sys.stderr)\n"
    "print([(s.name, s.encoding, s.errors, s.line_buffering, s.write_through,"
    " type(s.buffer).__name__) for s in streams])\n"
    "print(os.environ['NRLLM_PROBE'], sys.argv[1], os.getppid())\n"
    "print(repr(sys.stdin.read()), file=sys.stderr)\n"
    "sys.exit(3)"
)


def _start(script: str, **variables) -> PreloadedPopen:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "nrllm_ops.settings",
        "DATABASE_URL": "sqlite:///:memory:",
        "SECRET_KEY": "tests-only-secret-key",
        **variables,
    }
    return PreloadedPopen(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_forked_process_is_the_one_asked_for_and_one_a_library_may_have_read_for_is_not(
    tmp_path,
):
    forked = _start(REPORT, NRLLM_PROBE="forked")
    output, errors = forked.communicate("from\r\nstdin", timeout=60)
    *_, streams, report = output.splitlines()
    probe, command, parent = report.split()
    assert (probe, command, forked.returncode) == ("forked", "shell", 3)
    assert errors.strip() == repr("from\r\nstdin")
    assert int(parent) != os.getpid()  # the server's child, not the test's

    # A variable a library reads as it is imported: started as usual, with
    # the same standard streams.
    started = _start(REPORT, NRLLM_PROBE="started", PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    output, _ = started.communicate("", timeout=60)
    *_, fresh_streams, report = output.splitlines()
    assert report.split()[0::2] == ["started", str(os.getpid())]
    assert started.returncode == 3
    assert streams == fresh_streams

    # Its pid is the process's own: a signal reaches it, its status says so.
    sleeping = _start("import time; print('up', flush=True); time.sleep(120)", NRLLM_PROBE="-")
    wait_until(lambda: sleeping.stdout.readline() == "up\n", timeout=60, what="the child")
    os.kill(sleeping.pid, signal.SIGKILL)
    sleeping.communicate(timeout=60)
    assert sleeping.returncode == -signal.SIGKILL


#: What a child reports of the SDKs its server imported for later
#: (``DEFERRED``): which it has, having imported modules of theirs that are
#: not the SDKs' (``rqworker-pool`` imports ``multiprocessing.connection``),
#: whether the module that one's import made came with it, whether such a
#: module is the server's, and its parent; then, once five
#: threads imported modules of the SDKs at the same moment: which it has,
#: the modules of theirs that are not the server's, whether a package's
#: resources are found, whether a module loaded by its own spec is the one
#: it was, the warnings one of their modules raises (no more than in a fresh
#: process), and an answer validated by a model pydantic builds at its first
#: use (from its module's namespace, looked up in sys.modules); at its exit,
#: what multiprocessing's exit function runs.
DEFERRED_REPORT = """
import importlib.resources, importlib.util, os, sys, threading
SDKS = {"openai", "mcp", "mcp_types", "pydantic"}
deferred = sys.meta_path[0]
import shlex, multiprocessing.connection
held = "multiprocessing.util" in sys.modules  # connection's import made it
from multiprocessing import util
servers = util is deferred.modules["multiprocessing.util"]
# Run at exit by multiprocessing's exit function, registered as util came back.
util.Finalize(None, print, args=("finalized at exit",), exitpriority=0)
print(sorted(SDKS & set(sys.modules)), held, servers, os.getppid())
names = ["openai", "mcp", "mcp_types.version", "mcp.client.stdio", "openai.types.chat"]
barrier = threading.Barrier(len(names))
def load(name):
    barrier.wait()
    __import__(name)
sys.setswitchinterval(1e-6)  # the threads' imports interleave as much as they can
threads = [threading.Thread(target=load, args=(name,)) for name in names]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
sys.setswitchinterval(0.005)
copies = [name for name, made in deferred.modules.items() if sys.modules.get(name) is not made]
from openai.types.chat import ChatCompletion
answer = ChatCompletion.model_validate(
    {"id": "c1", "choices": [], "created": 1, "model": "m", "object": "chat.completion"}
)
typed = importlib.resources.files("openai").joinpath("py.typed").is_file()
# What an import racing another thread's does with a module put back while
# it asked the finders (one no import asked for here): it loads it by the
# spec the module carries.
client = sys.modules["openai._client"]
by_spec = importlib.util.module_from_spec(client.__spec__)
client.__spec__.loader.exec_module(by_spec)
import warnings
with warnings.catch_warnings(record=True) as warned:  # from a module of theirs
    warnings.simplefilter("always")
    warnings.warn_explicit("w", UserWarning, "f", 1, module_globals=vars(client))
warned = [warning.category.__name__ for warning in warned]
print(sorted(SDKS & set(sys.modules)), copies, typed, by_spec is client, warned, answer.id)
"""


def test_the_sdks_the_server_imported_are_a_childs_only_once_it_imports_them():
    # Three children: threads racing to put the modules back race differently.
    children = [_start(DEFERRED_REPORT, NRLLM_PROBE="-") for _ in range(3)]
    for child in children:
        output, errors = child.communicate("", timeout=60)
        assert child.returncode == 0, errors[-2000:]
        started, imported, at_exit = output.splitlines()[-3:]
        sdks, held, servers, parent = started.rsplit(" ", 3)
        # As in a fresh process: none until a run uses one, whatever else it
        # imported, and what that import made with it.
        assert (sdks, held, servers) == ("[]", "True", "True")
        assert int(parent) != os.getpid()  # forked from the server that imported them
        sdks = "['mcp', 'mcp_types', 'openai', 'pydantic']"
        assert imported == f"{sdks} [] True True ['UserWarning'] c1"
        assert at_exit == "finalized at exit"


def test_a_library_that_reads_a_setting_as_it_is_imported_is_refused_at_the_servers_start(
    tmp_path,
):
    # django_rq reads RQ_SHOW_ADMIN_LINK as it is imported.
    assert "django_rq" not in PRELOAD
    serve = (
        "import sys, tests.preloaded as preloaded\n"
        "preloaded.PRELOAD += ('django_rq',)\n"
        "preloaded.serve(sys.argv[1])"
    )
    for configured in ({}, {"DJANGO_SETTINGS_MODULE": "tests.settings"}):
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        server = subprocess.run(
            [sys.executable, "-c", serve, str(tmp_path / "socket")],
            cwd=ROOT,
            env={**env, **configured},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert server.returncode != 0
        assert "settings" in server.stderr.splitlines()[-1], server.stderr[-2000:]


def test_the_server_preloads_nothing_a_workers_start_does_not_import(queue, worker_env):
    """What a forked worker has imported is what a fresh one imports: no
    module more (a lookup one registers, a warning filter) to hide that
    production's worker lacks it."""
    fresh = subprocess.run(
        [sys.executable, "-X", "importtime", "manage.py", "rqworker", "--burst"]
        + [settings.NRLLM_QUEUE_NAME],
        cwd=ROOT,
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    logged = [
        line.rsplit("|", 1)[1].strip()
        for line in fresh.stderr.splitlines()
        if line.startswith("import time:")
    ]
    # A package is in sys.modules before its modules, logged or not.
    imported = {name.rsplit(".", depth)[0] for name in logged for depth in range(4)}
    probe = (
        "import importlib, sys, tests.preloaded as preloaded\n"
        "own = set(sys.modules)\n"
        "for name in preloaded.PRELOAD:\n"
        "    importlib.import_module(name)\n"
        "print(*sorted(set(sys.modules) - own))"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    preloaded = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert preloaded.returncode == 0, preloaded.stderr[-2000:]
    # Made, not imported: Cython's runtime modules (by the extensions) and
    # multiprocessing's name for ``__main__``.
    more = {
        name
        for name in set(preloaded.stdout.split()) - imported
        if not name.startswith(("_cython_", "cython_runtime", "__mp_main__"))
    }
    assert more == set()
