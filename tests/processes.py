"""The processes tests start and watch: a worker whose output goes to a
file and tells its progress, one paused while a server crashes, the CPU a
process has used."""

import contextlib
import os
import signal
import subprocess
import tempfile

from tests.helpers import wait_until
from tests.preloaded import PreloadedPopen


def cpu_seconds(process) -> float | None:
    """The CPU time ``process`` has used so far; None once it has exited."""
    import psutil

    try:
        times = psutil.Process(process.pid).cpu_times()
    except psutil.NoSuchProcess:
        return None
    return times.user + times.system


def voluntary_context_switches(process) -> int:
    """How often the threads of ``process`` alive now have gone to sleep:
    every wait counts, for I/O, a lock or the GIL, and a thread waiting for
    the GIL sleeps again each switch interval while it is not its turn.
    Summed over ``/proc/PID/task``, since a thread's count is its own; a
    thread that ended takes its count with it."""
    switches = 0
    for task in os.listdir(f"/proc/{process.pid}/task"):
        try:
            with open(f"/proc/{process.pid}/task/{task}/status") as status:
                for line in status:
                    if line.startswith("voluntary_ctxt_switches:"):
                        switches += int(line.split()[1])
        except FileNotFoundError:
            pass  # the thread ended as it was read
    return switches


@contextlib.contextmanager
def paused(process):
    """``process`` and its children (a work horse) stopped (SIGSTOP) while
    the block runs, and continued (SIGCONT) however it ends. What the worker
    was waiting on (a model's answer) then lasts as long as the block — a
    server's crash and recovery, a snapshot — however long that takes, and
    the wait itself need only outlast the test's look at the database."""
    import psutil

    tree = psutil.Process(process.pid)
    members = [tree, *tree.children(recursive=True)]
    for member in members:
        member.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for member in members:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.send_signal(signal.SIGCONT)


class WorkerProcess(PreloadedPopen):
    """A worker whose output goes to a file, never to a pipe (forked from the
    preloaded interpreter where it can be: ``tests/preloaded.py``). Nobody reads a
    long-lived worker's pipe while it runs, and a pipe holds 64 KiB, about 40
    runs of INFO lines: the worker's next log line would then block it for
    good, with its runs still queued (the soak's survivors did, on a slow
    host). ``communicate`` waits and returns what it wrote, as with a pipe."""

    def __init__(self, command, **options):
        self.output_file = tempfile.TemporaryFile()
        super().__init__(command, stdout=self.output_file, stderr=subprocess.STDOUT, **options)

    def progress(self) -> tuple:
        """What it has done so far, as seen from outside: the processes of
        its tree (a work horse forked, a stdio MCP server started, either
        ended) and how much it has written."""
        import psutil

        try:
            tree = psutil.Process(self.pid)
            pids = tuple(sorted(child.pid for child in tree.children(recursive=True)))
        except psutil.NoSuchProcess:
            pids = None
        written = None if self.output_file.closed else os.fstat(self.output_file.fileno()).st_size
        return pids, written

    def ended(self, timeout: float) -> bytes:
        """Wait for it to exit and return what it wrote. It fails only after
        ``timeout`` seconds with no progress: a worker's start, a work
        horse's and a stdio MCP server's take seconds each on a loaded host."""
        wait_until(
            lambda: self.poll() is not None,
            timeout=timeout,
            interval=0.1,
            what=f"{' '.join(map(str, self.args[2:]))} to exit",
            progress=self.progress,
        )
        return self.communicate()[0]

    def written(self) -> str:
        """What it has written so far, while it runs. Read at an offset: the
        file's own offset is the process's too, and must not move."""
        if self.output_file.closed:
            return self.output.decode()
        size = os.fstat(self.output_file.fileno()).st_size
        return os.pread(self.output_file.fileno(), size, 0).decode(errors="replace")

    def communicate(self, input=None, timeout=None):
        self.wait(timeout=timeout)
        if not self.output_file.closed:
            self.output_file.seek(0)
            self.output = self.output_file.read()
            self.output_file.close()
        return (self.output.decode() if self.text_mode else self.output), None
