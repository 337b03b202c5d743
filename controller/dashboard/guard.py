"""Who may talk to the dashboard: it can cancel jobs, and any web page the user visits can send
requests to 127.0.0.1.

- **Binding**: loopback by default; any other address only when asked for explicitly
  (``--allow-remote``), with a warning (``bind_warning``).
- **DNS rebinding**: a hostile name that resolves to 127.0.0.1 reaches the server with its own
  name in the Host header. Every request, reads included, must name the address the server
  is bound to (or ``localhost`` at its port). A remote bind (``--allow-remote``) accepts a Host
  that is an IP literal, ``localhost``, or a name given with ``--allowed-host``: never another
  name, which is what a rebinding page sends.
- **CSRF**: a POST must carry the server's token in the ``X-Respawn-Token`` header (a random
  token made when the server starts and written only into its own pages; a form another site
  posts cannot set a header without a CORS preflight this server never grants), and an
  ``Origin`` header, where sent, must be the server's own.
- **Cross-site reads**: ``/api/*`` and a job's ``timeline.png`` refuse a request whose
  ``Sec-Fetch-Site`` says another site's page sent it (an ``<img>`` there would spend a Cloud
  Logging read or tell which jobs exist).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

TOKEN_HEADER = "X-Respawn-Token"


class BindRefused(Exception):
    """An address the dashboard will not bind without ``--allow-remote``."""


def loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_warning(host: str, allow_remote: bool) -> str | None:
    """None for a loopback address; for another, the warning to print, or BindRefused without
    ``allow_remote``."""
    if loopback(host):
        return None
    if not allow_remote:
        raise BindRefused(f"--host {host} is not a loopback address: whoever reaches it can cancel and resubmit "
                          "jobs; pass --allow-remote as well to bind it anyway")
    return (f"the dashboard listens on {host}: whoever can reach that address can see every job and cancel or "
            "resubmit them (nothing but the network guards it)")


@dataclass
class Guard:
    """The checks for one server: its token, and the Host names it answers to once bound."""

    remote: bool = False
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    hosts: set[str] = field(default_factory=set)
    names: frozenset[str] = frozenset()  # remote only: the names (``--allowed-host``) it answers to besides IPs

    def bound(self, host: str, port: int) -> None:
        """The address the server got (``port`` 0 asks for a free one: the one it got)."""
        shown = f"[{host}]" if ":" in host else host
        self.hosts = {f"{shown}:{port}".lower(), f"localhost:{port}", f"127.0.0.1:{port}"}

    def read_problem(self, headers: Mapping[str, str]) -> str | None:
        """Why a request may not even read (a foreign Host); None when it may."""
        host = (headers.get("Host") or "").lower()
        if host in self.hosts or (self.remote and self._remote_ok(host)):
            return None
        if self.remote:
            return (f"Host {host or '(none)'} is not this dashboard's address: pass --allowed-host NAME to "
                    "answer to a name other than an IP address or localhost")
        return f"Host {host or '(none)'} is not this dashboard's address"

    def _remote_ok(self, host: str) -> bool:
        name = host
        if host.startswith("["):  # [v6]:port
            name = host[1:].split("]", 1)[0]
        elif host.count(":") == 1:
            name, port = host.split(":")
            if not port.isdigit():
                return False
        if not name:
            return False
        if name == "localhost" or name in {n.lower().rstrip(".") for n in self.names}:
            return True
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return False

    def fetch_problem(self, headers: Mapping[str, str]) -> str | None:
        """Why a request for data (JSON, a job's logs, its timeline) is refused: another site's page
        asked for it (``Sec-Fetch-Site`` ``cross-site`` or ``same-site``: an ``<img>`` that would
        spend a Logging read, or probe which jobs exist). A browser that sends no such header, or
        a scraper, may."""
        site = (headers.get("Sec-Fetch-Site") or "").lower()
        if site in ("cross-site", "same-site"):
            return f"a request from another site ({site}) is refused: open the dashboard itself"
        return None

    def write_problem(self, headers: Mapping[str, str]) -> str | None:
        """Why a POST is refused (a foreign Host or Origin, no or a wrong token); None when it may go on."""
        if problem := self.read_problem(headers):
            return problem
        origin = headers.get("Origin")
        if origin is not None and origin.lower() != f"http://{(headers.get('Host') or '').lower()}":
            return f"Origin {origin} is not this dashboard"
        sent = headers.get(TOKEN_HEADER) or ""
        if not hmac.compare_digest(sent.encode(), self.token.encode()):
            return "missing or wrong token: reload the page"
        return None
