"""Structured logs: every line carries job, attempt, instance and action fields.

Code logs with ``extra={"json_fields": {...}}``, the convention of
google-cloud-logging's ``StructuredLogHandler``, which turns them into jsonPayload
fields when running as a Cloud Function. Elsewhere the same fields are appended to a
plain text line.
"""

from __future__ import annotations

import json
import logging
import sys

_configured = False


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "json_fields", None)
        if fields:
            line += " " + json.dumps({k: v for k, v in fields.items() if v is not None}, default=str)
        return line


def setup(cloud: bool, level: int = logging.INFO) -> None:
    """Install one handler on the ``controller`` logger (idempotent)."""
    global _configured
    if _configured:
        return
    if cloud:
        from google.cloud.logging.handlers import StructuredLogHandler

        handler: logging.Handler = StructuredLogHandler(stream=sys.stdout)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("controller")
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    _configured = True
