"""JSON log lines (``LOG_FORMAT=json``) carrying the fields state changes log:
``run_id``, ``lease_token``, ``sequence``, ``action``."""

import json
import logging

FIELDS = ("run_id", "lease_token", "sequence", "kind", "action", "status", "reason", "decision")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            if hasattr(record, name):
                line[name] = getattr(record, name)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)
