"""The threads that run tool calls off a run's thread, kept between calls
(``tools.deadline._ToolThreads``, G15): an idle one keeps nothing of the
call it served, and a call whose thread the process could not start is
never run later (the fault is injected where the OS refuses a thread:
``Thread.start``)."""

import gc
import threading
import weakref

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


def test_a_call_whose_thread_could_not_start_never_runs_later(monkeypatch):
    """``Thread.start`` raises (``can't start new thread``: the process's
    thread or memory limit, thousands of runs in flight) after the call was
    queued: the caller hears an error, and the call must not run later."""
    from tools import deadline

    monkeypatch.setattr(deadline, "_tool_threads", deadline._ToolThreads())
    written = threading.Event()
    outcomes = {}
    real_start = threading.Thread.start

    def no_thread(self):
        if self.name.startswith("tool-"):
            raise RuntimeError("can't start new thread")
        return real_start(self)

    def write():
        written.set()
        return "written"

    def first_run():
        try:
            outcomes["write"] = call_within(5, "write", write)
        except RuntimeError as error:
            outcomes["write"] = error

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    thread = threading.Thread(target=first_run, name="run-1")
    real_start(thread)
    thread.join()
    monkeypatch.setattr(threading.Thread, "start", real_start)
    assert isinstance(outcomes["write"], RuntimeError)

    def second_run():
        outcomes["read"] = call_within(5, "read", lambda: "read")

    thread = threading.Thread(target=second_run, name="run-2")
    thread.start()
    thread.join()
    assert outcomes["read"] == "read"
    assert not written.is_set(), "the write its run was told failed ran afterwards"
