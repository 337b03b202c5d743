"""Who may talk to the dashboard: it can cancel jobs, any other account on this machine can reach
127.0.0.1, and any web page the user visits can send requests there.

- **Its key**: a random secret made when it starts (or read from ``--key-file``), in the address
  it prints (``?token=KEY``), as notebook servers do. Every request, pages, JSON, assets and
  ``/metrics`` alike, must carry it: in that query, in the cookie the first visit sets (HttpOnly,
  SameSite=Strict, Path=/, named for the port), or as ``Authorization: Bearer KEY`` (a scraper).
  Without it, a 403 that says how to get in, and nothing of the user's: not the POST token, which
  only the pages hold.
- **Binding**: loopback by default; any other address only when asked for explicitly
  (``--allow-remote``), with a warning (``bind_warning``).
- **DNS rebinding**: a hostile name that resolves to 127.0.0.1 reaches the server with its own
  name in the Host header. Every request, reads included, must name the address the server
  is bound to (or ``localhost`` at its port; on port 80, which a browser leaves out of Host,
  either alone), or a name given with ``--allowed-host`` (at any port or none: a reverse proxy's
  public name, passed on in Host). A remote bind (``--allow-remote``) also accepts a Host that
  is an IP literal or ``localhost``: never another name, which is what a rebinding page sends.
- **CSRF**: a POST must carry the server's token in the ``X-Respawn-Token`` header (a random
  token made when the server starts and written only into its own pages; a form another site
  posts cannot set a header without a CORS preflight this server never grants), and an
  ``Origin`` header, where sent, must be the server's own: the Host's host and port, over http
  or over https (an HTTPS proxy in front; ``same_origin``).
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
KEY_PARAM = "token"  # the query that carries the key: ?token=KEY, as notebook servers name it
NO_KEY = (f"this is respawn's dashboard: open the address `respawn dashboard` printed (it ends in ?{KEY_PARAM}=...), "
          "or send its key as Authorization: Bearer KEY")


def new_key() -> str:
    return secrets.token_urlsafe(32)


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
    return (f"the dashboard listens on {host}: whoever can reach that address and has its key (in the address "
            "printed) can see every job and cancel or resubmit them, and plain http shows the key to the network "
            "between: put an HTTPS proxy in front of it")


@dataclass
class Guard:
    """The checks for one server: its token, and the Host names it answers to once bound."""

    remote: bool = False
    token: str = field(default_factory=new_key)  # the POST token, written into its pages only
    key: str = field(default_factory=new_key)  # the secret every request carries (module docstring)
    hosts: set[str] = field(default_factory=set)
    names: frozenset[str] = frozenset()  # the names (``--allowed-host``) it answers to, at any port: a proxy's
    cookie: str = "respawn-dashboard"  # the key's cookie, named for the port once bound: two dashboards keep theirs

    def bound(self, host: str, port: int) -> None:
        """The address the server got (``port`` 0 asks for a free one: the one it got)."""
        self.cookie = f"respawn-dashboard-{port}"
        shown = (f"[{host}]" if ":" in host else host).lower()
        self.hosts = {f"{shown}:{port}", f"localhost:{port}", f"127.0.0.1:{port}"}
        if port == 80:  # a browser leaves http's default port out of Host
            self.hosts |= {shown, "localhost", "127.0.0.1"}

    def read_problem(self, headers: Mapping[str, str]) -> str | None:
        """Why a request may not even read (a foreign Host); None when it may."""
        host = (headers.get("Host") or "").lower()
        name = _name(host)
        if host in self.hosts or (name is not None and name in {n.lower().rstrip(".") for n in self.names}):
            return None
        if self.remote and name is not None and _literal(name):
            return None
        if self.remote:
            return (f"Host {host or '(none)'} is not this dashboard's address: pass --allowed-host NAME to "
                    "answer to a name other than an IP address or localhost")
        return f"Host {host or '(none)'} is not this dashboard's address (a reverse proxy's name: pass --allowed-host NAME)"

    def key_problem(self, headers: Mapping[str, str], cookies: Mapping[str, str],
                    query: Mapping[str, str]) -> str | None:
        """Why a request without the key is refused (``NO_KEY``); None when it carries it."""
        bearer = headers.get("Authorization") or ""
        sent = [query.get(KEY_PARAM), cookies.get(self.cookie),
                bearer[7:] if bearer[:7].lower() == "bearer " else None]
        if any(value and hmac.compare_digest(value.encode(), self.key.encode()) for value in sent):
            return None
        return NO_KEY

    def key_in_query(self, query: Mapping[str, str]) -> bool:
        """Whether the request came by the printed address (its cookie is then set)."""
        return hmac.compare_digest((query.get(KEY_PARAM) or "").encode(), self.key.encode())

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
        if origin is not None and not same_origin(origin, headers.get("Host") or ""):
            return f"Origin {origin} is not this dashboard"
        sent = headers.get(TOKEN_HEADER) or ""
        if not hmac.compare_digest(sent.encode(), self.token.encode()):
            return "missing or wrong token: reload the page"
        return None


def same_origin(origin: str, host: str) -> bool:
    """Whether a page at ``origin`` is one of this server's own, reached as ``host`` (the request's
    Host): the same host and port, a default port left out on either side, over http, or over https
    through a proxy that ends TLS in front of it (which need not say so: X-Forwarded-Proto may be
    absent). Only a page served at that very address has that origin, so https is no other site's."""
    scheme, sep, authority = origin.lower().partition("://")
    if not sep or scheme not in _DEFAULT_PORTS or not host:
        return False
    return _with_port(authority, _DEFAULT_PORTS[scheme]) == _with_port(host.lower(), _DEFAULT_PORTS[scheme])


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _with_port(authority: str, default: int) -> str:
    """``host:port``, the scheme's default port added where ``authority`` leaves it out."""
    bare = authority.endswith("]") or ":" not in authority  # [v6], or a name or v4 address alone
    return f"{authority}:{default}" if bare else authority


def _name(host: str) -> str | None:
    """The name or address of a Host header (``name``, ``name:port``, ``[v6]:port``); None when it is
    none (an empty name, a port that is not a number)."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name if name and (not rest or (rest[0] == ":" and rest[1:].isdigit())) else None
    if host.count(":") > 1:  # an IPv6 address without its brackets: no Host a browser sends
        return None
    name, sep, port = host.partition(":")
    if sep and not port.isdigit():
        return None
    return name.rstrip(".") or None


def _literal(name: str) -> bool:
    """An IP address or localhost: never what a DNS-rebinding page sends, which is its own name."""
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False
