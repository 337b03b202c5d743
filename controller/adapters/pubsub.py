"""The Publisher port on google-cloud-pubsub (``pubsub_v1.PublisherClient``), for job notifications.

A notification must never hold a reconcile pass: one ``publish`` takes at most ``deadline``
seconds (10 by default), retries included, and every failure is a ``controller.core.errors`` type.
What the installed client does, read in its source (google-cloud-pubsub 2.44, google-api-core
2.44), and what is done about it here:

- ``publish`` only queues the message in a batch and returns a future; a commit thread sends
  the batch after ``BatchSettings.max_latency`` (0.01 s by default; set here explicitly) or at
  once when the batch is full. ``CloudPublisher.publish`` waits for the future: the message id,
  or the error. One message goes out in about 10 ms plus the request.
- The client's own retry for ``Publish`` is 600 s long with a 60 s timeout per request
  (``PublisherOptions.timeout = ConstantTimeout(60)``), so both are passed on every call. A
  numeric ``timeout`` becomes api-core's ``TimeToDeadlineTimeout``: one budget across all
  attempts, except that an attempt started with under 1 s left gets the *whole* timeout again.
  So the retry stops starting attempts 1.5 s before that budget ends (``_budget``), and the
  future is waited for ``deadline`` seconds as a backstop.
- The commit thread catches only ``GoogleAPIError`` and google-auth's ``TransportError``. With
  the REST transport a refused connection is a ``requests`` exception, which kills the thread
  and leaves the future unresolved forever; so ``requests`` errors are in the retry predicate
  and come out as api-core's ``RetryError``. A future still unresolved at the deadline is a
  ``TransientError`` (the message may yet go out: notifications are at least once).
- ``PUBSUB_EMULATOR_HOST`` (the Cloud SDK emulator, gRPC) is honoured by the client itself: it
  replaces ``client_options`` with the emulator's address, and the GAPIC client then opens an
  insecure gRPC channel (anonymous credentials when no transport is named). With the REST
  transport named as well it would hand that gRPC channel to the REST transport, which fails;
  so when the emulator is set it wins over ``endpoint`` and no transport is named.
- ``endpoint`` (``RESPAWN_PUBSUB_ENDPOINT``, the local cloud's ``localcloud.pubsub``): REST
  transport, ``client_options.api_endpoint`` with its ``http://`` scheme kept (the REST transport
  keeps a scheme it is given), anonymous credentials. Otherwise gRPC with the application
  default credentials, as in production.
- A topic name that is not ``projects/P/topics/T`` fails REST transcoding with a ``ValueError``
  before any request, and gRPC answers it 400: both are a ``RequestError`` here, raised before
  the client is asked, as is an empty message (Google refuses one with neither data nor
  attributes), an attribute that is not a string or breaks Google's limits, and one named like
  an argument of ``publish`` (``RESERVED_ATTRIBUTES``: attributes are passed as its keyword
  arguments, so ``timeout`` would silently become the timeout, ``data`` a TypeError).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
from collections.abc import Mapping
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.api_core import retry as retries
from google.auth import exceptions as auth_exceptions

from controller.core import errors

DEADLINE = 10.0  # seconds one publish may take, retries included
TOPIC_RE = re.compile(r"projects/[^/]+/topics/[A-Za-z][-A-Za-z0-9_.~+%]{2,254}")
MAX_MESSAGE_BYTES = 10 * 1000 * 1000  # Google's limit on a message (and on a publish request)
# PublisherClient.publish(topic, data, ordering_key, retry, timeout, **attributes): attributes so
# named would be taken for its own arguments.
RESERVED_ATTRIBUTES = frozenset({"topic", "data", "ordering_key", "retry", "timeout"})
_TRANSIENT = (gexc.TooManyRequests, gexc.InternalServerError, gexc.BadGateway, gexc.ServiceUnavailable,
              gexc.GatewayTimeout, gexc.DeadlineExceeded, gexc.Aborted, gexc.Unknown, gexc.Cancelled)
_RETRYABLE = _TRANSIENT + (requests.exceptions.RequestException, auth_exceptions.TransportError)


def check_message(topic: str, data: bytes, attributes: Mapping[str, str]) -> None:
    """``RequestError`` for what Google (or the client) would refuse before publishing."""
    if not TOPIC_RE.fullmatch(topic) or topic.rsplit("/", 1)[-1].lower().startswith("goog"):
        raise errors.RequestError(f"not a topic name (projects/PROJECT/topics/TOPIC): {topic!r}")
    if not isinstance(data, bytes):
        raise errors.RequestError(f"message data must be bytes, not {type(data).__name__}")
    if not data and not attributes:
        raise errors.RequestError("a message needs data or at least one attribute")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()):
        raise errors.RequestError("message attributes must be strings")
    # Google's limits: 100 attributes, keys up to 256 bytes and not "goog...", values up to 1024 bytes.
    if len(attributes) > 100:
        raise errors.RequestError(f"{len(attributes)} message attributes, over 100")
    for key, value in attributes.items():
        if not key or len(key.encode()) > 256 or key.lower().startswith("goog") or key in RESERVED_ATTRIBUTES:
            raise errors.RequestError(f"message attribute name not allowed: {key[:64]!r}")
        if len(value.encode()) > 1024:
            raise errors.RequestError(f"message attribute {key!r}: value over 1024 bytes")
    if len(data) + sum(len(k.encode()) + len(v.encode()) for k, v in attributes.items()) > MAX_MESSAGE_BYTES:
        raise errors.RequestError(f"message over {MAX_MESSAGE_BYTES} bytes")


def translate(e: BaseException, topic: str) -> errors.RespawnError:
    """A library error as one of the project's."""
    if isinstance(e, gexc.RetryError):  # the retry gave up on transient errors
        return errors.TransientError(f"publish to {topic}: {e.cause or e}")
    if isinstance(e, gexc.NotFound):
        return errors.NotFound(f"publish to {topic}: {e.message}")
    if isinstance(e, _TRANSIENT):
        return errors.TransientError(f"publish to {topic}: {e.message}")
    if isinstance(e, gexc.GoogleAPICallError):  # 400, 403 (PermissionDenied), 401...
        return errors.RequestError(f"publish to {topic}: {e.message}")
    if isinstance(e, (concurrent.futures.TimeoutError, TimeoutError)):
        return errors.TransientError(f"publish to {topic}: no answer within the deadline")
    if isinstance(e, (ValueError, TypeError)):  # MessageTooLargeError, a request REST cannot transcode
        return errors.RequestError(f"publish to {topic}: {e}")
    # PublishError (ids missing from an answer), google-auth and connection errors, anything else
    return errors.TransientError(f"publish to {topic}: {type(e).__name__}: {e}")


class CloudPublisher:
    """``publish`` returns the message id, or raises a ``RespawnError`` within ``deadline`` seconds."""

    def __init__(self, client: Any, *, deadline: float = DEADLINE) -> None:
        if deadline < 4:
            raise ValueError("deadline: at least 4 s (an attempt's timeout never starts under 1.5 s)")
        self.client = client
        self.deadline = deadline
        self._rpc_timeout, budget = _budget(deadline)
        self._retry = retries.Retry(predicate=retries.if_exception_type(*_RETRYABLE), initial=0.1, maximum=2.0,
                                    multiplier=2.0, timeout=budget)

    def publish(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> str:
        check_message(topic, data, attributes)
        try:
            future = self.client.publish(topic, data, retry=self._retry, timeout=self._rpc_timeout, **attributes)
            return str(future.result(timeout=self.deadline))
        except Exception as e:  # every path out is one of ours
            raise translate(e, topic) from e


def _budget(deadline: float) -> tuple[float, float]:
    """(the request timeout across attempts, how long new attempts may start)."""
    rpc = deadline - 1.5
    return rpc, rpc - 1.5


def cloud_publisher(endpoint: str | None = None, *, deadline: float = DEADLINE) -> CloudPublisher:
    """The Publisher port on a new ``PublisherClient``: at ``endpoint`` (the local cloud's REST
    stand-in, anonymous) when one is given and ``PUBSUB_EMULATOR_HOST`` is not set, else gRPC as
    the client builds it (the emulator, or Google with the application default credentials).
    Build it once and keep it: the client holds a channel and a commit thread."""
    from google.cloud import pubsub_v1  # imported when notifications are used, not on every cold start

    kwargs: dict[str, Any] = {}
    if endpoint and not os.environ.get("PUBSUB_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        kwargs.update(transport="rest", client_options={"api_endpoint": endpoint}, credentials=AnonymousCredentials())
    # One message goes out within 10 ms of being published; a batch fills only under a burst.
    batching = pubsub_v1.types.BatchSettings(max_latency=0.01, max_messages=100)
    try:
        client = pubsub_v1.PublisherClient(batch_settings=batching, **kwargs)
    except auth_exceptions.DefaultCredentialsError as e:
        raise errors.ConfigError(f"Pub/Sub: no credentials: {e}") from e
    return CloudPublisher(client, deadline=deadline)
