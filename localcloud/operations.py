"""Compute Engine's zone and region operations, as the local Compute server answers them
(``zoneOperations``/``regionOperations`` get, wait, list, delete): a mixin of
``localcloud.compute.ComputeServer``, whose state (``_ops``, ``_lock``, ``_done``, ``urls``) it reads."""

from __future__ import annotations

from typing import Any

from localcloud import gce


class OperationsApi:
    _ops: dict[tuple[str, str], dict[str, Any]]

    def _zoneOperations_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            return self._op(self.urls.zone(p["project"], p["zone"]), p["operation"])

    def _regionOperations_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            return self._op(self.urls.region(p["project"], p["region"]), p["operation"])

    def _zoneOperations_wait(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        return self._wait(self.urls.zone(p["project"], p["zone"]), p["operation"])

    def _regionOperations_wait(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        return self._wait(self.urls.region(p["project"], p["region"]), p["operation"])

    def _zoneOperations_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        return self._list_ops(self.urls.zone(p["project"], p["zone"]), q)

    def _regionOperations_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        return self._list_ops(self.urls.region(p["project"], p["region"]), q)

    def _zoneOperations_delete(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            scope = self.urls.zone(p["project"], p["zone"])
            self._op(scope, p["operation"])
            del self._ops[(scope, p["operation"])]
        return {}

    def _wait(self, scope: str, name: str) -> dict[str, Any]:
        """Returns when the operation is DONE, or after two minutes at most (as Google's does)."""
        with self._done:
            op = self._op(scope, name)
            self._done.wait_for(lambda: op["status"] == "DONE", timeout=120)
            return op

    def _list_ops(self, scope: str, q: Any) -> dict[str, Any]:
        with self._lock:
            ops = [op for (s, _), op in self._ops.items() if s == scope]
        page, token = gce.page(gce.filtered(ops, q.get("filter")), q)
        out = {"kind": "compute#operationList", "id": scope, "items": page, "selfLink": f"{scope}/operations"}
        return {**out, "nextPageToken": token} if token else out
