"""The project's own small error hierarchy.

Adapters translate library errors into these (``raise ... from e``) so that the core
never imports ``google.api_core``. The executor decides what each one means: a
transient error is retried by the platform, a terminal one is recorded and absorbed.
"""

from __future__ import annotations


class RespawnError(Exception):
    """Base of every error the controller raises on purpose."""


class TransientError(RespawnError):
    """Worth retrying later: 5xx, timeouts, rate limits."""


class NotFound(RespawnError):
    """The object or instance does not exist (HTTP 404)."""


class NoSuchBucket(NotFound):
    """A listing of a bucket that does not exist (a 404 on objects.list: the bucket, not an object)."""

    def __init__(self, bucket: str, what: str | None = None) -> None:
        super().__init__(f"{what or f'gs://{bucket}'}: bucket gs://{bucket} does not exist")
        self.bucket = bucket


class AlreadyExists(RespawnError):
    """An insert named something that already exists (HTTP 409)."""


class TooLarge(RespawnError):
    """An object is larger than the caller's limit; it was not downloaded."""


class PreconditionFailed(RespawnError):
    """A generation precondition did not hold: another writer got there first (HTTP 412)."""


class CapacityError(RespawnError):
    """The zone has no capacity for this shape right now (stockout)."""

    def __init__(self, zone: str, reason: str) -> None:
        super().__init__(f"{reason} in {zone}")
        self.zone = zone
        self.reason = reason


class QuotaError(RespawnError):
    """A quota (CPUs, GPUs, IPs...) would be exceeded."""

    def __init__(self, zone: str, reason: str) -> None:
        super().__init__(f"{reason} in {zone}")
        self.zone = zone
        self.reason = reason


class OperationPending(RespawnError):
    """Compute accepted the request, but its operation had not finished by the wait's deadline.

    Not a success: the operation may still fail (a late stockout). The next pass sends
    the same request again under the same request id, and Compute answers with the
    original operation, whose outcome is then read.
    """


class RequestError(RespawnError):
    """The request itself is wrong (bad image, permission denied...): retrying will not help."""


class NoticeRefused(RequestError):
    """Compute refused ``scheduling.preemptionNoticeDuration`` (a Preview field: a project not
    enrolled answers 400 naming it). The controller inserts without a notice for the rest of the run."""

    def __init__(self, zone: str, message: str) -> None:
        super().__init__(f"{message} in {zone}")
        self.zone = zone


class ConfigError(RespawnError):
    """The controller's own configuration is missing or wrong."""


class Unreachable(TransientError):
    """No connection could be made to an endpoint at all (refused, no such host, no answer to the
    connect): at a terminal, said at once instead of retried for minutes. ``str()``: one line
    naming the endpoint, the variable that set it, and what to do."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(message)
        self.endpoint = endpoint
