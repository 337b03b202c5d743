"""A failure's reason comes first; the request's long URL never pushes it off the line (issue 26)."""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions as gexc

from controller.adapters import compute, tpu
from controller.adapters.gcs import GcsStore
from controller.core import errors

URL = ("https://storage.googleapis.com/storage/v1/b/a-rather-long-bucket-name/o?prefix=jobs%2Fsome-job%2F"
       "&projection=noAcl&prettyPrint=false")


class _Failing:
    """A storage client whose listing fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def list_blobs(self, *args: object, **kwargs: object) -> list[object]:
        raise self.error


@pytest.mark.parametrize(("error", "kind", "first"), [
    (gexc.ServiceUnavailable(f"GET {URL}: Service Unavailable"), errors.TransientError, "503 Service Unavailable"),
    (gexc.Forbidden(f"GET {URL}: caller does not have storage.objects.list access"), errors.RequestError,
     "403 caller does not have storage.objects.list access"),
    (gexc.RetryError("Timeout of 120.0s exceeded", gexc.ServiceUnavailable(f"GET {URL}: Service Unavailable")),
     errors.TransientError, "Timeout of 120.0s exceeded, last exception: 503 Service Unavailable"),
])
def test_a_storage_failure_says_its_reason_first_and_no_url(error, kind, first):
    with pytest.raises(kind) as raised:
        GcsStore(_Failing(error)).list("b", "jobs/")
    said = str(raised.value)
    assert said == f"{first} (gs://b/jobs/*)"
    assert "https://" not in said


def test_a_connection_error_keeps_its_cause_and_drops_the_path():
    error = requests.exceptions.ConnectionError(
        "HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: /storage/v1/b/x/o?prefix=jobs%2F "
        "(Caused by NewConnectionError('Connection refused'))")
    with pytest.raises(errors.TransientError) as raised:
        GcsStore(_Failing(error)).list("x", "jobs/")
    assert str(raised.value).startswith("HTTPConnectionPool(host='127.0.0.1', port=9): (Caused by NewConnectionError")
    assert "/storage/v1" not in str(raised.value)


@pytest.mark.parametrize("adapter", [compute, tpu])
def test_compute_and_tpu_errors_say_the_reason_without_the_request(adapter):
    url = "https://compute.googleapis.com/compute/v1/projects/p/zones/us-central1-a/instances/some-instance"
    said = adapter.translate(gexc.BadRequest(f"POST {url}: Invalid value for field 'resource.machineType'"),
                             "us-central1-a")
    assert isinstance(said, errors.RequestError)
    assert str(said) == "Invalid value for field 'resource.machineType'"
    gone = adapter.translate(gexc.NotFound(f"GET {url}: The resource was not found"), "us-central1-a")
    assert str(gone) == "The resource was not found"


def test_words_after_a_method_name_are_kept():
    from controller.adapters.reasons import reason

    said = reason(RuntimeError("403 missing permission to GET buckets: storage.buckets.get denied"))
    assert said == "403 missing permission to GET buckets: storage.buckets.get denied"
    url = reason(RuntimeError("403 GET https://storage.googleapis.com/storage/v1/b/x/o?a=b: denied"))
    assert url == "403 denied"
    local = reason(RuntimeError("503 POST http://127.0.0.1:4443/upload/storage/v1/b/x/o: busy"))
    assert local == "503 busy"
    path = reason(RuntimeError("404 GET /compute/v1/projects/p/zones/z/instances/i: not found"))
    assert path == "404 not found"
