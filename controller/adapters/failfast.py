"""At a terminal, a connection that cannot be made is said at once, not retried for minutes.

The Google clients retry a refused connection as transient (google-cloud-storage for up to
120 s, Compute's ``RETRY`` for 60 s): right for a Cloud Function, whose next pass comes
anyway, wrong for ``respawn status`` typed at a local cloud that was stopped, which sat
silent for almost two minutes and then printed the library's 400-character error. The CLI
turns ``enable()`` on for the command it runs; the sessions the adapters build then mount
``adapter()``, which bounds every connect to ``CONNECT_TIMEOUT`` seconds and raises
``errors.Unreachable`` (which no retry predicate takes for transient) when no connection
could be made at all: refused, no such host, or no answer to the connect. Errors after a
connection was made (a reset, a 5xx, a read timeout) are left to the clients' retries.

The CLI also bounds a command's total time (controller/cli/deadline.py): each request sent
records its endpoint and answer (``last()``), so that the one line said when the bound is
reached names them; once ``stop_at`` has passed, no request is sent any more (a thread still
retrying gets ``errors.Unreachable``, which no retry predicate takes for transient).

Light on purpose: the CLI imports it for every command; ``requests`` is imported only when
an adapter is made.
"""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import urlsplit

from controller.core import errors

CONNECT_TIMEOUT = 5.0  # seconds a connect may take at a terminal
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
START = "is `respawn local up` still running? If not, start one and export the variables it prints"

_enabled = False
_stop_at: float | None = None  # time.monotonic() past which no request is sent
_last: dict[str, str] = {}  # the last request sent: its endpoint and what came of it


def enable(on: bool = True) -> None:
    """Clients built from now on fail fast (the CLI's command), or no longer (``on=False``)."""
    global _enabled
    _enabled = on
    if not on:
        stop_at(None)
    _last.clear()


def stop_at(when: float | None) -> None:
    """Past ``when`` (``time.monotonic()``), requests are refused before they are sent; None: never."""
    global _stop_at
    _stop_at = when


def last() -> tuple[str, str, str]:
    """(endpoint, the variable that set it or "", what came of its last request or "") of the last request sent."""
    endpoint = _last.get("endpoint", "")
    variable = (_variable_for(urlsplit(endpoint).netloc) or "") if endpoint else ""
    return endpoint, variable, _last.get("answer", "")


def enabled() -> bool:
    return _enabled


def adapter(size: int) -> Any:
    """A requests adapter with ``size`` kept-alive connections, failing fast as above."""
    import requests
    import requests.adapters
    from urllib3.exceptions import NewConnectionError

    class FailFast(requests.adapters.HTTPAdapter):
        def send(self, request: Any, stream: bool = False, timeout: Any = None, verify: Any = True,
                 cert: Any = None, proxies: Any = None) -> Any:
            parts = urlsplit(request.url)
            _last.update(endpoint=f"{parts.scheme}://{parts.netloc}", answer="no answer yet")
            if _stop_at is not None and time.monotonic() >= _stop_at:
                raise errors.Unreachable(_last["endpoint"], f"{_last['endpoint']}: the command's time is up")
            try:
                answer = super().send(request, stream=stream, timeout=_bounded(timeout), verify=verify, cert=cert,
                                    proxies=proxies)
                _last["answer"] = f"{answer.status_code} {answer.reason or ''}".strip()
                return answer
            except requests.exceptions.ReadTimeout:
                _last["answer"] = "no answer within the read timeout"
                raise
            except requests.exceptions.ConnectTimeout as e:
                raise unreachable(request.url, f"no answer to a connect within {CONNECT_TIMEOUT:.0f} s") from e
            except requests.exceptions.ConnectionError as e:
                reason = getattr(e.args[0], "reason", None) if e.args else None
                if not isinstance(reason, NewConnectionError):
                    raise  # the connection was made: a reset or a cut answer stays the retries' business
                said = str(reason).lower()
                why = ("no such host" if "resolve" in said or "name or service" in said else
                       "connection refused" if "refused" in said else "no connection")
                raise unreachable(request.url, why) from e

    return FailFast(pool_connections=size, pool_maxsize=size)


def _bounded(timeout: Any) -> Any:
    """``timeout`` with its connect part at most CONNECT_TIMEOUT (None, a number or a (connect, read) pair)."""
    if timeout is None:
        return (CONNECT_TIMEOUT, None)
    if isinstance(timeout, (int, float)):
        return (min(float(timeout), CONNECT_TIMEOUT), timeout)
    if isinstance(timeout, tuple) and len(timeout) == 2:
        connect, read = timeout
        return (CONNECT_TIMEOUT if connect is None else min(connect, CONNECT_TIMEOUT), read)
    return timeout  # urllib3's Timeout: as given


def unreachable(url: str, why: str) -> errors.Unreachable:
    """One line: the endpoint, the variable that pointed there (if one did), and what to do."""
    parts = urlsplit(url)
    endpoint = f"{parts.scheme}://{parts.netloc}"
    variable = _variable_for(parts.netloc)
    if (parts.hostname or "") in _LOCAL_HOSTS:
        named = f" ({variable})" if variable else ""
        return errors.Unreachable(endpoint, f"nothing answers at {endpoint}{named}: {START}")
    if variable:
        return errors.Unreachable(endpoint, f"cannot connect to {endpoint} ({why}; set by {variable}): "
                                            "check that variable and the network")
    return errors.Unreachable(endpoint, f"cannot connect to {endpoint} ({why}): check the network")


def _variable_for(netloc: str) -> str | None:
    """The environment variable whose endpoint is at ``netloc`` (the local cloud's exports)."""
    for key, value in sorted(os.environ.items()):
        if key == "STORAGE_EMULATOR_HOST" or (key.startswith("RESPAWN_") and key.endswith("_ENDPOINT")):
            where = value if "://" in value else f"http://{value}"
            if urlsplit(where).netloc == netloc:
                return key
    return None
