"""An HTTPS proxy that answers for Google's hosts the local cloud serves itself (``HTTPS_PROXY``).

A client told ``HTTPS_PROXY=http://127.0.0.1:PORT`` asks it ``CONNECT us-central1-docker.pkg.dev:443``;
for a host ``serves(host)`` admits it answers ``200 Connection established``, then speaks TLS as
that host (a self-signed certificate for ``*.pkg.dev``, which the local VMs trust through
``SSL_CERT_FILE``/``CURL_CA_BUNDLE``) and passes the requests, as sent, to a local plain-HTTP
server, which reads the host from ``Host:``. Any other host is refused (502): nothing else is
reachable from the local cloud.

Why a proxy rather than registries.conf rewriting ``us-central1-docker.pkg.dev`` to
``127.0.0.1:PORT/...``: under such a rewrite podman 4.3 looks up credentials for the rewritten
location (``127.0.0.1:PORT/us-central1-docker.pkg.dev/...``), so an auth file keyed by the real host,
as a VM's agent writes it on Google, is never read (seen with ``podman --log-level=debug pull``:
"No credentials matching 127.0.0.1:PORT/us-central1-docker.pkg.dev/p/repo/bb found"). Through the
proxy the client sees Google's own names: the same auth file, the same realm, the same paths.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import selectors
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

_HEADER_LIMIT = 16 * 1024


def self_signed(folder: Path, names: tuple[str, ...] = ("*.pkg.dev",)) -> tuple[Path, Path]:
    """A certificate for ``names`` (and 127.0.0.1) and its key, written into ``folder``: (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localcloud")])
    now = _dt.datetime.now(_dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - _dt.timedelta(days=1))
            .not_valid_after(now + _dt.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([*(x509.DNSName(n) for n in names),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "proxy-cert.pem", folder / "proxy-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


class TlsProxy:
    """``CONNECT host:443`` for ``serves(host)``: TLS as that host, the bytes passed to ``upstream``."""

    def __init__(self, serves: Callable[[str], bool], upstream: Callable[[], tuple[str, int]],
                 cert: Path, key: Path, timeout: float = 300.0) -> None:
        self.serves, self.upstream, self.timeout = serves, upstream, timeout
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(cert, key)
        self.cert = cert
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """What ``HTTPS_PROXY`` takes."""
        assert self._listener is not None, "not started"
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def start(self) -> TlsProxy:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        threading.Thread(target=self._accept, name="tls-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            for sock in list(self._open):
                _close(sock)
            self._open.clear()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="tls-proxy-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        mine = [client]
        self._track(client)
        try:
            client.settimeout(30)
            if self._connect_host(client) is None:
                return
            tls = self._tls.wrap_socket(client, server_side=True)
            upstream = socket.create_connection(self.upstream(), timeout=30)
            mine += [tls, upstream]
            self._track(tls, upstream)
            _pipe(tls, upstream, self.timeout)
        except (OSError, ssl.SSLError, ValueError):
            pass  # the client went away, or spoke no TLS: its connection ends, nothing else does
        finally:
            for sock in mine:
                _close(sock)
            with self._lock:
                self._open.difference_update(mine)

    def _connect_host(self, client: socket.socket) -> str | None:
        """The host of a ``CONNECT host:443`` request (answered 200), None when refused (answered)."""
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk or len(head) > _HEADER_LIMIT:
                return None
            head += chunk
        method, target, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        host, _, port = target.rpartition(":")
        if method != "CONNECT" or port != "443" or not self.serves(host.lower()):
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return None
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        return host.lower()

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._open.update(socks)


def _pipe(tls: ssl.SSLSocket, plain: socket.socket, idle: float) -> None:
    """Bytes both ways until either side closes or ``idle`` seconds pass with none; one thread (an
    SSL socket is not to be read and written from two)."""
    with selectors.DefaultSelector() as sel:
        sel.register(tls, selectors.EVENT_READ)
        sel.register(plain, selectors.EVENT_READ)
        while True:
            ready = [key.fileobj for key, _ in sel.select(timeout=idle)] or ([tls] if tls.pending() else [])
            if not ready:
                return
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                (plain if sock is tls else tls).sendall(data)
                while sock is tls and tls.pending():  # decrypted bytes select() cannot see
                    plain.sendall(tls.recv(65536))


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
