"""What ``seed_demo`` prints of the runtime's log while it executes the
demo's runs: its summary tells each run's end, so the runtime's lines are
not printed, and the fault the demo injects is expected, not an error."""

import contextlib
import logging

from runs.models.faults import INJECTED


class _ToldByTheSummary(logging.Filter):
    """While the demo seeds: the project's log lines below ERROR are not
    printed (the summary says how each run ended, as its story meant), nor
    is the error of the fault the demo injects (the database's refusal
    names it, ``runs.models.faults.INJECTED``). Any other error is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return record.name.partition(".")[0] not in (
                "runs",
                "tools",
                "agents",
                "spend",
                "triggers",
            )
        try:
            message = record.getMessage()
        except Exception:
            return True  # a malformed record: logging's own handler reports it
        return INJECTED not in message


@contextlib.contextmanager
def told_by_the_summary(verbosity: int):
    """While the block runs, the handlers of the root logger print what
    ``_ToldByTheSummary`` lets through; at ``verbosity`` 2 or more, all."""
    handlers = [] if verbosity >= 2 else list(logging.getLogger().handlers)
    told = _ToldByTheSummary()
    for handler in handlers:
        handler.addFilter(told)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(told)
