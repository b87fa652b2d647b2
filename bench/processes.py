"""What the bench reads of worker processes in ``/proc``: CPU time, PSS,
their children (work horses), and how fast the host runs Python now; and
of the whole host, its busy CPU time."""

import os
import time

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, list[str]]:
    """``/proc/PID/stat``: the command, and the fields after it (the state
    first; a command may hold spaces and parentheses, so split after its
    last one)."""
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    return text[text.index("(") + 1 : text.rindex(")")], text.rpartition(")")[2].split()


def _cpu_ticks(fields: list[str]) -> int:
    """User and system ticks, and those of the children reaped."""
    return sum(int(value) for value in fields[11:15])


def cpu_seconds(pid: int) -> float:
    """User and system time of ``pid`` and of the children it has reaped."""
    return _cpu_ticks(_stat(pid)[1]) / _CLOCK_TICKS


def system_cpu_seconds(pid: int) -> float:
    """System (kernel) time of ``pid`` and of the children it has reaped:
    with many threads, what their waking one another costs shows here."""
    fields = _stat(pid)[1]
    return (int(fields[12]) + int(fields[14])) / _CLOCK_TICKS


def parent_of(pid: int) -> int | None:
    try:
        return int(_stat(pid)[1][1])
    except OSError:
        return None


def pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass  # a horse that exited between the listing and the read
    return 0


def family(workers: set[int]) -> set[int]:
    """The worker processes and their live children (work horses)."""
    family = set(workers)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and parent_of(int(entry)) in workers:
            family.add(int(entry))
    return family


def host_loop_milliseconds() -> float:
    """How fast this host runs Python now: a fixed loop's time (the best of
    three). A shared host's speed changes from minute to minute, and the
    runs' CPU and throughput change with it; this says how fast it was."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for number in range(2_000_000):
            total += number
        best = min(best, time.perf_counter() - started)
    return best * 1000


def idle_cpu_seconds(pids: set[int]) -> float:
    """The workers' CPU time once it stops growing: their start-up (which
    goes on after they register) is not the runs' cost."""
    previous, quiet = sum(cpu_seconds(pid) for pid in pids), 0
    while quiet < 2:  # two half-seconds in a row with (almost) nothing done
        time.sleep(0.5)
        now = sum(cpu_seconds(pid) for pid in pids)
        quiet = quiet + 1 if now - previous < 0.05 else 0
        previous = now
    return previous


#: ``/proc/stat``'s CPU fields the host was busy in: user, nice, system, irq,
#: softirq. Idle and iowait are waiting; steal is time the hypervisor gave
#: another guest, not this host's work; guest and guest_nice are already
#: counted in user and nice.
_BUSY_FIELDS = (0, 1, 2, 5, 6)
_STEAL_FIELD = 7


def host_cpu_seconds() -> tuple[float, float]:
    """The whole host's busy CPU time since boot, every process's (the
    database's, Redis's, the model server's, the bench's own), and the time
    stolen from it by the hypervisor, both summed over its CPUs."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    busy = sum(fields[index] for index in _BUSY_FIELDS)
    steal = fields[_STEAL_FIELD] if len(fields) > _STEAL_FIELD else 0
    return busy / _CLOCK_TICKS, steal / _CLOCK_TICKS


def cpu_seconds_by_kind(kinds: dict[str, set[int]]) -> dict[str, float]:
    """The host's processes' CPU time (their own and their reaped
    children's), summed by kind: each of ``kinds`` (a name and its pids,
    their live children included), and every other process by its command
    (``postgres``, ``redis-server``…; host-wide: every PostgreSQL on the host
    is ``postgres``). What a window's host CPU went to: a PostgreSQL backend
    that exited is in its postmaster's reaped time. A process that exits is
    reaped whole by its parent: its CPU from before the window moves into
    the parent's kind, and out of its own, which goes below zero."""
    kind_of = {pid: kind for kind, pids in kinds.items() for pid in pids}
    totals = dict.fromkeys(kinds, 0.0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            command, fields = _stat(int(entry))
        except OSError:
            continue  # exited between the listing and the read
        if command.startswith("kworker/"):
            command = "kworker"  # named after its current work queue, which changes
        kind = kind_of.get(int(entry)) or kind_of.get(int(fields[1])) or command
        seconds = _cpu_ticks(fields) / _CLOCK_TICKS
        totals[kind] = totals.get(kind, 0.0) + seconds
    return totals
