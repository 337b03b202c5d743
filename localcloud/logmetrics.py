"""The local Cloud Logging's ``projects.metrics``: log-based metrics, create / get / list / update /
delete, as ``gcloud logging metrics ...`` calls them (``respawn deploy`` makes respawn's).

Bodies are checked against the ``LogMetric`` schema of the ``logging.v2`` discovery document by
the server (``LoggingServer._body``); here, the rules the document and Google's log-based metrics
pages state on top of it, each refused 400 INVALID_ARGUMENT:

- a name of at most 100 characters of ``A-Z a-z 0-9 _ - . , + ! * ' ( ) % /``;
- a ``filter`` the server can evaluate (the same subset as ``entries.list``);
- ``metricDescriptor.metricKind`` DELTA (log-based metrics are deltas); ``valueType`` INT64 or
  BOOL for a counter, DISTRIBUTION for a distribution, which needs a ``valueExtractor`` and
  ``bucketOptions``; a counter has neither;
- extractors are ``EXTRACT(field)`` or ``REGEXP_EXTRACT(field, "regex")`` of a LogEntry field, and
  every ``labelExtractors`` key is a label of ``metricDescriptor.labels`` (at most 10 labels).

``update`` (PUT) of a metric that does not exist creates it (gcloud's ``update`` looks it up first
for that reason). The descriptor comes back with its ``name`` and ``type``
(``logging.googleapis.com/user/NAME``), as Google fills them in. Nothing counts entries here: the
metrics are kept to be read back (``metrics(project)``), and their filters can be evaluated
against stored entries by a test (``localcloud.filters``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

METRIC_NAME_RE = re.compile(r"[A-Za-z0-9_\-.,+!*'()%/]{1,100}")
EXTRACTOR_RE = re.compile(r'(EXTRACT\(([\w.@/"-]+)\)|REGEXP_EXTRACT\(([\w.@/"-]+), *"(?:[^"\\]|\\.)*"\))')
EXTRACTABLE = ("jsonPayload.", "labels.", "resource.labels.", "textPayload", "protoPayload.", "httpRequest.",
               "severity", "logName", "operation.", "sourceLocation.", "trace", "spanId")
MAX_LABELS = 10
METRIC_FIELDS = ("description", "filter", "metricDescriptor", "valueExtractor", "labelExtractors", "bucketOptions",
                 "disabled", "bucketName", "version")


class LogMetrics:
    """Mixed into ``LoggingServer``: its ``_projects_metrics_*`` methods answer the routes."""

    _lock: threading.Lock
    _metrics: dict[str, dict[str, dict[str, Any]]]  # project -> name -> LogMetric
    metric_error: Callable[[int, str], Exception]  # the server's own error (code, message): its JSON answer
    check_filter: Callable[[str], object]  # the server's query parser: raises its 400 for a filter it cannot evaluate

    def metrics(self, project: str) -> dict[str, dict[str, Any]]:
        """Every log-based metric of ``project``, by name, as ``metrics.get`` answers each."""
        with self._lock:
            return {name: dict(m) for name, m in sorted(self._metrics.get(project, {}).items())}

    def _projects_metrics_create(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        metric = self._checked(p["projectsId"], body.get("name") or "", body)
        with self._lock:
            if metric["name"] in self._metrics.get(p["projectsId"], {}):
                raise self.metric_error(409, f"Metric {metric['name']} already exists")
            self._metrics.setdefault(p["projectsId"], {})[metric["name"]] = metric
            return dict(metric)

    def _projects_metrics_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        with self._lock:
            found = self._metrics.get(p["projectsId"], {}).get(p["metricsId"])
            if found is None:
                raise self.metric_error(404, f"Metric {p['metricsId']} does not exist")
            return dict(found)

    def _projects_metrics_list(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        found = list(self.metrics(p["projectsId"]).values())
        return {"metrics": found} if found else {}

    def _projects_metrics_update(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        name = p["metricsId"]
        if body.get("name") and body["name"] != name:
            raise self.metric_error(400, "The metric's name cannot be changed.")
        metric = self._checked(p["projectsId"], name, body)
        with self._lock:
            old = self._metrics.get(p["projectsId"], {}).get(name)
            if old is not None:
                metric["createTime"] = old["createTime"]
            self._metrics.setdefault(p["projectsId"], {})[name] = metric
            return dict(metric)

    def _projects_metrics_delete(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        with self._lock:
            if self._metrics.get(p["projectsId"], {}).pop(p["metricsId"], None) is None:
                raise self.metric_error(404, f"Metric {p['metricsId']} does not exist")
        return {}

    def _checked(self, project: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """The metric as stored (Google's fields filled in), or LoggingError 400 saying what is wrong."""
        if not METRIC_NAME_RE.fullmatch(name):
            raise self.metric_error(400, f"Invalid metric name {name!r}: at most 100 characters of letters, digits and "
                              "_-.,+!*'()%/.")
        if not body.get("filter"):
            raise self.metric_error(400, "A metric filter is required.")
        self.check_filter(body["filter"])  # 400 where the server cannot evaluate it
        descriptor = dict(body.get("metricDescriptor") or {"metricKind": "DELTA", "valueType": "INT64"})
        kind, value = descriptor.get("metricKind", "DELTA"), descriptor.get("valueType", "INT64")
        if kind != "DELTA":
            raise self.metric_error(400, f"Invalid metric kind {kind}: log-based metrics are DELTA.")
        distribution = value == "DISTRIBUTION"
        if value not in ("INT64", "BOOL", "DISTRIBUTION"):
            raise self.metric_error(400, f"Invalid value type {value}: INT64 or BOOL for a counter, DISTRIBUTION for a distribution.")
        if distribution and not (body.get("valueExtractor") and body.get("bucketOptions")):
            raise self.metric_error(400, "A distribution metric needs a valueExtractor and bucketOptions.")
        if not distribution and (body.get("valueExtractor") or body.get("bucketOptions")):
            raise self.metric_error(400, "A counter metric has no valueExtractor and no bucketOptions.")
        labels = [label.get("key") for label in descriptor.get("labels") or []]
        if len(labels) > MAX_LABELS:
            raise self.metric_error(400, f"At most {MAX_LABELS} labels per metric.")
        extractors = dict(body.get("labelExtractors") or {})
        if unknown := sorted(set(extractors) - set(labels)):
            raise self.metric_error(400, f"Label extractors for labels the descriptor does not have: {', '.join(unknown)}.")
        for text in [*extractors.values(), *([body["valueExtractor"]] if body.get("valueExtractor") else [])]:
            match = EXTRACTOR_RE.fullmatch(text)
            path = match and (match.group(2) or match.group(3))
            if not path or not path.startswith(EXTRACTABLE):
                raise self.metric_error(400, f"Invalid extractor {text!r}: EXTRACT(field) or REGEXP_EXTRACT(field, \"regex\").")
        now = _now()
        kept = {k: body[k] for k in METRIC_FIELDS if body.get(k) not in (None, "", [], {}, False)}
        return {**kept, "name": name, "createTime": now, "updateTime": now,
                "metricDescriptor": {**descriptor, "metricKind": kind, "valueType": value,
                                     "name": f"projects/{project}/metricDescriptors/logging.googleapis.com/user/{name}",
                                     "type": f"logging.googleapis.com/user/{name}"}}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
