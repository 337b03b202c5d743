"""The Webhook port on ``requests``: a Slack-compatible incoming webhook, one JSON POST.

Bounded: ``timeout`` seconds to connect and as many for each read (5 by default; a server that
drips its answer's headers can hold a post longer: the hosts a spec may name are an allowlist,
``RESPAWN_ALLOWED_WEBHOOK_HOSTS``), at most 200 bytes of an answer read, no retry here, no redirect followed (``requests`` would turn a redirected POST into a
GET and drop the body). Errors: 429 (Slack's rate limit), 5xx, timeouts and connection failures
are ``TransientError``; any other answer that is not 2xx (400 ``invalid_payload``, 403
``invalid_token``, 404 ``no_service``, 410 ``channel_is_archived``), a URL that is not http(s)
and a body that is not JSON are ``RequestError``: retrying will not help.

A webhook URL is a secret (whoever has it may post to the channel): messages name its scheme
and host only, and the ``requests`` exception, whose text holds the path, is not chained.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import urlsplit

import requests

from controller.core import errors

TIMEOUT = 5.0  # seconds to connect, and again to read the answer


def where(url: str) -> str:
    """The URL without its secret path and query: ``https://hooks.slack.com``."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}{f':{parts.port}' if parts.port else ''}"


def check(url: str, body: Mapping[str, object]) -> bytes:
    """The body as JSON bytes; ``RequestError`` for a URL that is not http(s) or a body that is
    not JSON (NaN included, as requests refuses it)."""
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise errors.RequestError(f"not an http(s) webhook URL: {where(url)}")
    try:
        return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as e:
        raise errors.RequestError(f"webhook body is not JSON: {e}") from None


class HttpWebhook:
    def __init__(self, session: requests.Session | None = None, *, timeout: float = TIMEOUT) -> None:
        self.session = session or requests.Session()
        self.timeout = timeout

    def post(self, url: str, body: Mapping[str, object]) -> None:
        data = check(url, body)
        try:
            # Streamed: the answer's body is read only as far as an error message needs (a
            # server that sends megabytes, or drips them, does not hold the pass for them).
            response = self.session.post(url, data=data, headers={"Content-Type": "application/json"},
                                         timeout=(self.timeout, self.timeout), allow_redirects=False, stream=True)
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as e:
            raise errors.TransientError(f"webhook {where(url)}: {type(e).__name__}") from None
        except requests.exceptions.RequestException as e:  # an invalid URL, too many headers...
            raise errors.RequestError(f"webhook {where(url)}: {type(e).__name__}") from None
        status = response.status_code
        try:
            head = b"" if 200 <= status < 300 else response.raw.read(200, decode_content=True)
        except Exception:  # noqa: BLE001 - the answer's text is only for the message
            head = b""
        finally:
            response.close()
        if 200 <= status < 300:
            return
        reason = f"webhook {where(url)} answered {status}: {head.decode('utf-8', 'replace').strip()}"
        if status == 429 or status >= 500:
            raise errors.TransientError(reason)
        raise errors.RequestError(reason)
