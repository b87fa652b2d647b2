"""The threads that run tool calls off a run's thread, kept between calls
(``tools.deadline._ToolThreads``, G15): an idle one keeps nothing of the
call it served, and a call whose thread the process could not start is
never run later (the kernel refuses the thread, in a process of its own)."""

import gc
import subprocess
import sys
import threading
import weakref

from tests.helpers import ROOT
from tools.deadline import call_within


class _Answer:
    """Stands for what a tool returned (or the run state its call closes over)."""


def test_an_idle_tool_thread_keeps_nothing_of_the_call_it_served():
    answers = []

    def run():
        answer = _Answer()
        answers.append(weakref.ref(answer))
        assert call_within(5, "probe", lambda: answer) is answer

    # Off the main thread, as a ConcurrentWorker's run is: the call goes to a tool thread.
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    gc.collect()
    holders = [type(r).__name__ for r in gc.get_referrers(answers[0]())] if answers[0]() else []
    assert answers[0]() is None, f"still referenced by {holders}"


def test_an_idle_tool_thread_keeps_nothing_of_an_error_its_call_raised():
    errors = []

    def run():
        class Failed(Exception):
            pass

        def call():
            error = Failed("the tool failed")
            errors.append(weakref.ref(error))
            raise error

        try:
            call_within(5, "probe", call)
        except Failed:
            pass

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    gc.collect()
    assert errors[0]() is None


#: In a process of its own: its address space is capped just above what it
#: uses, and the tool's thread asks for a stack past the cap, so the kernel
#: refuses the thread (``can't start new thread``), as it does a process
#: out of memory or threads.
_REFUSED_THREAD = """
import resource, threading
import django
django.setup()
from tools.deadline import call_within

with open("/proc/self/status") as status:
    used = next(int(line.split()[1]) for line in status if line.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 2**20, resource.RLIM_INFINITY))
written, outcomes = threading.Event(), {}

def write():
    written.set()
    return "written"

def first_run():
    threading.stack_size(512 * 2**20)  # past the cap: no thread for the tool
    try:
        outcomes["write"] = call_within(5, "write", write)
    except RuntimeError as error:
        outcomes["write"] = error
    finally:
        threading.stack_size(0)

def second_run():
    outcomes["read"] = call_within(5, "read", lambda: "read")

for run in (first_run, second_run):
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
print(type(outcomes["write"]).__name__, outcomes["read"], written.is_set())
"""


def test_a_call_whose_thread_could_not_start_never_runs_later():
    """The process cannot start the tool's thread: the run hears an error
    (a write's is a write in doubt), and the call never runs afterwards —
    not even in the thread the next call starts."""
    done = subprocess.run(
        [sys.executable, "-c", _REFUSED_THREAD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["RuntimeError", "read", "False"], done.stdout
