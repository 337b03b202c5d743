"""The QuotaReader port on google-cloud-compute's ``RegionsClient`` (REST): ``regions.get``'s
``quotas[]`` (metric, limit, usage). Read by the CLI before a submit, never by the controller:
retried for ``_TIMEOUT`` in all, so that a slow answer only costs the estimate its column."""

from __future__ import annotations

import requests
from google.api_core import exceptions as gexc

from controller.adapters.compute import RETRY, translate
from controller.adapters.lean import lean

lean("google.cloud.compute_v1")
from google.cloud.compute_v1.services.regions import RegionsClient  # noqa: E402

from controller.core.quotas import QuotaUse  # noqa: E402

_LIBRARY = (gexc.GoogleAPIError, requests.exceptions.RequestException)
_TIMEOUT = 10.0
_RETRY = RETRY.with_timeout(_TIMEOUT)


class ComputeQuotas:
    def __init__(self, client: RegionsClient) -> None:
        self.client = client

    def region_quotas(self, project: str, region: str) -> dict[str, QuotaUse]:
        try:
            found = self.client.get(project=project, region=region, retry=_RETRY, timeout=_TIMEOUT)
        except _LIBRARY as e:
            raise translate(e, region) from e
        return {q.metric: QuotaUse(limit=q.limit, usage=q.usage) for q in found.quotas if q.metric}
