"""localcloud/runlogs.py: a local function's controller log line (as controller.service.logs writes it
in text) becomes the LogEntry Cloud Run stores for the same line on Google (as StructuredLogHandler
writes it): what `respawn canary` reads of on_audit, read the same in both places."""

from __future__ import annotations

import io
import json
import logging
from datetime import datetime

from google.cloud.logging.handlers import StructuredLogHandler

from controller.service.logs import _TextFormatter
from localcloud.runlogs import FunctionLogs, entry


def logged(handler: logging.Handler, message: str, fields: dict) -> str:
    stream = io.StringIO()
    handler.setStream(stream)
    logger = logging.getLogger("controller.service.functions")
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 1, message, (), None, extra={"json_fields": fields})
    handler.handle(record)
    return stream.getvalue()


def test_a_controller_line_is_the_entry_cloud_run_makes_of_the_structured_one():
    fields = {"instance": "demo-1", "method": "compute.instances.preempted", "at": "2026-11-28T12:00:00+00:00",
              "job": "demo", "done": ["go demo-2"]}
    text_handler = logging.StreamHandler()
    text_handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    line = logged(text_handler, "audit event handled", fields)
    made = entry(line, "p-1", "us-central1", "respawn-on-audit")
    # (its first line, once per process, is the library's own diagnostic entry)
    structured = json.loads(logged(StructuredLogHandler(), "audit event handled", fields).splitlines()[-1])
    assert made["jsonPayload"] == {k: v for k, v in structured.items() if not k.startswith(("logging.googleapis",
                                                                                           "severity", "httpRequest"))}
    assert made["severity"] == structured["severity"] == "INFO"
    assert made["logName"] == "projects/p-1/logs/run.googleapis.com%2Fstdout"
    assert made["resource"]["type"] == "cloud_run_revision"
    assert made["resource"]["labels"]["service_name"] == "respawn-on-audit"
    when = datetime.fromisoformat(made["timestamp"].replace("Z", "+00:00"))
    assert made["timestamp"].endswith("Z") and abs((datetime.now().astimezone() - when).total_seconds()) < 5


def test_braces_in_the_message_stay_in_it_and_only_the_trailing_object_is_its_fields():
    made = entry("2026-11-28 12:00:00,250 WARNING controller.service.executor: kept {x} as {y} {\"job\": \"j\"}",
                 "p-1", "us-central1", "respawn-tick")
    assert made["jsonPayload"] == {"message": "kept {x} as {y}", "job": "j"} and made["severity"] == "WARNING"
    plain = entry("2026-11-28 12:00:00,250 INFO controller.service.engine: pass done", "p-1", "us-central1",
                  "respawn-tick")
    assert plain["jsonPayload"] == {"message": "pass done"}


def test_lines_that_are_not_the_controller_s_are_left_out():
    for line in ("Traceback (most recent call last):", "2026-11-28 12:00:00,250 INFO werkzeug: 127.0.0.1 POST /",
                 "INFO:functions_framework:serving"):
        assert entry(line, "p-1", "us-central1", "respawn-tick") is None


class Written:
    def __init__(self) -> None:
        self.entries: list[dict] = []

    def write(self, entries: list[dict]) -> None:
        self.entries += entries


def test_function_logs_follow_each_file_from_its_end_and_wait_for_a_line_s_end(tmp_path):
    old = "2026-11-28 12:00:00,000 INFO controller.service.functions: an earlier cloud's line\n"
    (tmp_path / "function-on_audit.log").write_text(old)
    sink = Written()
    follow = FunctionLogs(sink, tmp_path, "p-1", "us-central1")  # type: ignore[arg-type]
    with (tmp_path / "function-on_audit.log").open("a") as f:
        f.write("2026-11-28 12:00:01,000 INFO controller.service.functions: audit event handled {\"job\": \"j\"}\n"
                "2026-11-28 12:00:02,000 INFO controller.service.functions: half")
    (tmp_path / "function-tick.log").write_text("2026-11-28 12:00:03,000 INFO controller.service.engine: tick\n")
    follow.once()
    assert [(e["resource"]["labels"]["service_name"], e["jsonPayload"]["message"]) for e in sink.entries] == [
        ("respawn-tick", "tick"), ("respawn-on-audit", "audit event handled")]
    with (tmp_path / "function-on_audit.log").open("a") as f:
        f.write(" written\n")
    follow.once()
    assert sink.entries[-1]["jsonPayload"]["message"] == "half written" and len(sink.entries) == 3
