"""A library error's reason, said first and short.

google-api-core writes an HTTP error as ``403 GET https://storage.googleapis.com/storage/v1/b/
BUCKET/o/jobs%2F...?projection=noAcl&prettyPrint=false: caller does not have storage.objects.get
access``: a terminal or a status row cut that line in the URL, before the reason. ``reason``
drops each ``METHOD URL: `` and puts a connection error's URL path last, so that the line a
user reads begins with why.
"""

from __future__ import annotations

import re

# The request as google-api-core writes it: a method, then an absolute URL or a path (never words).
_REQUEST = re.compile(r"\b(?:GET|POST|PUT|PATCH|DELETE|HEAD) (?:https?://[^\s/:]+(?::\d+)?|(?=/))\S*?: ")
_POOL = re.compile(r"(?P<pool>\w+ConnectionPool\(host='[^']*', port=\d+\)): Max retries exceeded with url: \S+ ")


def reason(error: BaseException) -> str:
    """``str(error)`` with the request's method and URL dropped (a retry's last exception's too)."""
    text = _REQUEST.sub("", str(error))
    return _POOL.sub(r"\g<pool>: ", text).strip()


def message(error: BaseException) -> str:
    """A GoogleAPICallError's ``message`` (no status code) with its method and URL dropped."""
    return _REQUEST.sub("", str(getattr(error, "message", error))).strip()


def said(what: str, error: BaseException) -> str:
    """The reason first, then what was being read or written: ``503 Service Unavailable (gs://b/jobs/*)``."""
    return f"{reason(error)} ({what})"
