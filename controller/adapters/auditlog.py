"""The AuditLog port on google-cloud-logging (``Client.list_entries``, REST or gRPC as built).

One ``entries.list`` query per call (its pages followed up to ``limit`` entries), with the
filter ``controller.core.audit.list_filter`` writes. Logging allows 60 ``entries.list`` a
minute per project: one a tick is far within it, so a refusal is not retried here (the
next tick asks again; the feed's watermark did not move).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions

from controller.core import audit, errors

PAGE_SIZE = 1000  # Logging's largest page


class CloudAuditLog:
    def __init__(self, client: Any) -> None:
        self.client = client  # a google.cloud.logging.Client (controller.adapters.google.logging_client)

    def system_events(self, projects: Sequence[str], since: datetime, limit: int) -> list[Mapping[str, object]]:
        from google.cloud.logging import ASCENDING

        try:
            entries = self.client.list_entries(resource_names=[f"projects/{p}" for p in projects],
                                               filter_=audit.list_filter(projects, since), order_by=ASCENDING,
                                               page_size=min(PAGE_SIZE, limit), max_results=limit)
            return [entry.to_api_repr() for entry in entries]
        except (gexc.TooManyRequests, gexc.ServerError, gexc.RetryError, requests.RequestException,
                auth_exceptions.TransportError) as e:
            raise errors.TransientError(f"Cloud Logging entries.list: {e}") from e
        except gexc.GoogleAPICallError as e:  # 403 (no logging.logEntries.list), 400 (the API disabled)
            raise errors.ConfigError(f"Cloud Logging entries.list: {e.message}") from e
