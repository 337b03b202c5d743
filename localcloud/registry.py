"""Artifact Registry's Docker endpoint (``LOCATION-docker.pkg.dev``), served locally to real podman.

No image registry is reachable from these machines, so the local cloud serves the pull side of the
Docker Registry HTTP API V2 itself, as podman (containers/image) and docker use it:

- ``GET /v2/`` without a bearer token: 401 with ``WWW-Authenticate: Bearer realm=".../v2/token",
  service="..."``;
- ``GET /v2/token?service=&scope=repository:NAME:pull``: HTTP Basic ``oauth2accesstoken:<OAuth access
  token>``, how Google's registries take an access token (Container Registry's "Advanced authentication"
  page: user name ``oauth2accesstoken``, password the token, "such as Compute Engine instance metadata";
  Artifact Registry's Docker authentication page lists access tokens among its methods, and users log in
  to ``LOCATION-docker.pkg.dev`` so: GoogleCloudPlatform/aactl issue 233; docker-credential-gcr answers
  docker with that user name, newer releases with ``_dcgcr_X_Y_Z_token``); answered ``{"token",
  "access_token", "expires_in", "issued_at"}`` when the token's account may read every repository asked for;
- ``HEAD``/``GET /v2/NAME/manifests/<tag or digest>`` (``Content-Type`` and ``Docker-Content-Digest``)
  and ``GET /v2/NAME/blobs/<digest>``, with that bearer token.

Errors are the registry's JSON (``{"errors": [{"code", "message"}]}``) in Artifact
Registry's words, as users have quoted them:

- no credentials at the token endpoint: 403 DENIED ``Unauthenticated request. Unauthenticated requests
  do not have permission "artifactregistry.repositories.downloadArtifacts" on resource
  "projects/P/locations/L/repositories/R" (or it may not exist)`` (GoogleCloudPlatform/aactl issue 233,
  the 403 status in dagger/dagger issue 11667);
- an account without the permission: 403 DENIED ``Permission "artifactregistry.repositories.
  downloadArtifacts" denied on resource "projects/P/locations/L/repositories/R" (or it may not
  exist)`` (terraform-google-kubernetes-engine issue 1779, GoogleContainerTools/skaffold issue 6743:
  the token endpoint answers it); a repository that does not exist gets the same answer;
- a missing, unknown or expired bearer token on a manifest or blob: 401 UNAUTHORIZED ``not
  authenticated: No valid credential was supplied.`` (gitpod-io/gitpod issue 11454), with the challenge;
  an access token Google would not accept at the token endpoint: the same 401 (its wording there is
  not quoted anywhere we found);
- a tag or digest the image does not have: 404 MANIFEST_UNKNOWN ``Failed to fetch "TAG" from request
  "/v2/PROJECT/REPOSITORY/IMAGE/manifests/TAG".`` (as Google's registries answer it: Kubernetes
  tutorials quote it for gcr.io, served by Artifact Registry).

Who may pull follows IAM: ``artifactregistry.repositories.downloadArtifacts`` granted, without a
condition, by the repository's policy or the project's (``project_policy``), each role's permissions
read from ``permissions`` (the local IAM's). ``accounts`` maps an access token to the service
account it belongs to (the local metadata servers' tokens: ``localcloud.stack`` asks Compute and
Cloud TPU); ``allUsers`` on a repository lets anyone pull.

How names reach it: as on Google. A local VM gets ``environment()``: ``HTTPS_PROXY`` naming the
local cloud's proxy (``localcloud.proxy``), which answers ``CONNECT LOCATION-docker.pkg.dev:443``
for every location this registry knows, speaks TLS as that host with a certificate of its own and
passes the requests here, ``Host:`` intact; ``SSL_CERT_FILE`` (Go's crypto/x509 and OpenSSL read it:
podman verifies that certificate as it would Google's) and ``CURL_CA_BUNDLE`` (curl reads only that)
naming the certificate; and ``CONTAINERS_REGISTRIES_CONF``, a registries.conf with no search
registries and no rewrite. No rewrite because podman looks up credentials by the host it pulls from:
under a ``[[registry]] location = "127.0.0.1:PORT/..."`` rewrite podman 4.3 never read an auth file
keyed by ``us-central1-docker.pkg.dev``, which is what an agent writes on Google. Images are made
from a root filesystem tar with ``push_rootfs`` (``localcloud.oci``); the REST API over the same
repositories is ``localcloud.registry_api``.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flask import Flask, Response, request, send_file

from controller.adapters.memory_doctor import PREDEFINED
from controller.core import imageref
from controller.core.imageref import ArtifactImage
from localcloud import oci
from localcloud.http import Server
from localcloud.proxy import TlsProxy, self_signed

READ = "artifactregistry.repositories.downloadArtifacts"
MULTI_REGIONS = ("us", "europe", "asia")
# The regions the local cloud's Compute and Cloud TPU zones are in, and a few more users name.
REGIONS = ("us-central1", "us-central2", "us-east1", "us-east4", "us-east5", "us-south1", "us-west1", "us-west4",
           "europe-west1", "europe-west4", "asia-northeast1", "asia-southeast1")
LOCATIONS = MULTI_REGIONS + REGIONS
TOKEN_LIFETIME = 300  # seconds a registry token serves (clients trade the access token again after)
# The user names under which a Google registry takes an OAuth access token as the password.
_ACCESS_TOKEN_USER = re.compile(r"oauth2accesstoken|_dcgcr_[0-9_]+_token")
NO_CREDENTIAL = "not authenticated: No valid credential was supplied."
_PATH = re.compile(r"/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)")
_ACCEPTED = "application/json"

TokenLookup = Callable[[str], "str | None"]  # an OAuth access token -> its service account's e-mail


def predefined(role: str) -> frozenset[str]:
    """What the local IAM says a predefined role grants (controller.adapters.memory_doctor.PREDEFINED)."""
    return frozenset(PREDEFINED.get(role, ()))


@dataclass
class Stored:
    """One image (a package) of a repository: its manifests by digest, its tags, the blobs they name."""

    manifests: dict[str, tuple[str, bytes, str]] = field(default_factory=dict)  # digest -> (media type, body, time)
    tags: dict[str, str] = field(default_factory=dict)  # tag -> digest
    blobs: set[str] = field(default_factory=set)
    created: str = ""
    updated: str = ""


@dataclass
class Repository:
    project: str
    location: str
    repository: str
    created: str
    description: str = ""
    bindings: list[dict[str, Any]] = field(default_factory=list)  # its allow policy's
    etag: str = "BwYlocal"  # base64, as Google's (gcloud sends it back decoded and encoded again)
    images: dict[str, Stored] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/repositories/{self.repository}"


@dataclass(frozen=True)
class _Grant:
    """What a registry token carries: who traded for it, on which host, for which repositories."""

    member: str | None  # None: anonymous (a public repository)
    host: str
    names: frozenset[str]  # PROJECT/REPOSITORY/IMAGE paths it may pull
    expires: float


class RegistryError(Exception):
    def __init__(self, status: int, code: str, message: str, challenge: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.challenge = status, code, message, challenge


class Registry(Server):
    name = "registry"
    threads = 16

    def __init__(self, *, locations: Iterable[str] = LOCATIONS, accounts: TokenLookup = lambda token: None,
                 project_policy: Callable[[str], Sequence[Mapping[str, Any]]] = lambda project: (),
                 permissions: Callable[[str], Iterable[str]] = predefined, workdir: Path | None = None) -> None:
        self.locations = tuple(dict.fromkeys(locations))
        self.accounts, self.project_policy, self.permissions = accounts, project_policy, permissions
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="respawn-registry-")
        self.workdir = workdir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.blobs = oci.BlobStore(self.workdir / "blobs")
        self.lock = threading.RLock()  # held while repositories, images and tokens are read or changed
        self._push = threading.Lock()  # one push at a time: each may gzip tens of MiB
        self.repositories: dict[tuple[str, str, str], Repository] = {}
        self._tokens: dict[str, _Grant] = {}
        self.proxy: TlsProxy | None = None

    # -- what the local cloud and tests do --------------------------------------------------------
    def start(self) -> Registry:
        super().start()
        try:
            cert, key = self_signed(self.workdir / "tls")
            self.proxy = TlsProxy(lambda host: host in self.hosts, self._upstream, cert, key).start()
            self.registries_conf(self.workdir / "registries.conf")
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def hosts(self) -> tuple[str, ...]:
        """The hosts this registry answers for: ``LOCATION-docker.pkg.dev`` of each location."""
        return tuple(f"{where}-docker.pkg.dev" for where in self.locations)

    @property
    def conf_path(self) -> Path:
        """The registries.conf ``start`` wrote (``CONTAINERS_REGISTRIES_CONF``)."""
        return self.workdir / "registries.conf"

    def environment(self) -> dict[str, str]:
        """What a local VM needs for podman (and curl) to reach this registry as Google's: the proxy for
        HTTPS (loopback excepted: the local cloud's own servers are reached directly), its certificate
        as the one trusted, and the registries.conf."""
        assert self.proxy is not None, "not started"
        cert = str(self.proxy.cert)
        return {"HTTPS_PROXY": self.proxy.url, "NO_PROXY": "127.0.0.1,localhost", "SSL_CERT_FILE": cert,
                "CURL_CA_BUNDLE": cert, "CONTAINERS_REGISTRIES_CONF": str(self.conf_path)}

    def registries_conf(self, path: Path) -> Path:
        """Write podman's registries.conf for this registry at ``path``: no search registries (a short
        name is refused, never looked up elsewhere) and nothing rewritten or marked insecure, so that
        a host's own registries.conf cannot send a local VM's pulls anywhere else."""
        path.write_text("# The local cloud's VMs (localcloud.registry): Artifact Registry's hosts are reached through\n"
                        "# HTTPS_PROXY, their certificate verified against SSL_CERT_FILE; nothing else is reachable.\n"
                        "unqualified-search-registries = []\n")
        return path

    def create_repository(self, project: str, location: str, repository: str, description: str = "") -> Repository:
        """A Docker repository (there already is fine); its policy empty: the project's grants apply."""
        if location not in self.locations:
            raise ValueError(f"{location} is no location of the local registry ({', '.join(self.locations)})")
        with self.lock:
            key = (project, location, repository)
            if key not in self.repositories:
                self.repositories[key] = Repository(project, location, repository, _now(), description)
            return self.repositories[key]

    def push_rootfs(self, ref: str, rootfs_tar_path: str | Path, *, cmd: Sequence[str] | None = None,
                    env: Mapping[str, str] | Sequence[str] | None = None, workdir: str | None = None) -> str:
        """A single-layer image of the root filesystem tar, stored as ``ref``
        (``LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE[:TAG]``, ``latest`` when untagged; its
        repository made if absent). Returns the image's digest; the same tar and settings again
        change nothing."""
        target = _artifact(ref)
        if target.digest:
            raise ValueError(f"{ref}: push to a tag, not a digest")
        repo = self.create_repository(target.project, target.location, target.repository)
        with self._push:
            image = oci.from_rootfs(self.blobs, Path(rootfs_tar_path), cmd=cmd, env=env, workdir=workdir)
        with self.lock:
            stored = repo.images.setdefault(target.image, Stored(created=_now()))
            if image.digest not in stored.manifests:
                stored.manifests[image.digest] = (oci.MANIFEST, image.manifest, _now())
            stored.tags[target.tag or "latest"] = image.digest
            stored.blobs.update(image.blobs)
            stored.updated = _now()
        return image.digest

    def repository(self, project: str, location: str, repository: str) -> Repository | None:
        with self.lock:
            return self.repositories.get((project, location, repository))

    def set_policy(self, project: str, location: str, repository: str, bindings: list[dict[str, Any]]) -> str:
        """The repository's allow policy (what ``repositories.setIamPolicy`` sets); its new etag."""
        with self.lock:
            repo = self.repositories[(project, location, repository)]
            repo.bindings = [dict(b) for b in bindings]
            repo.etag = base64.b64encode(secrets.token_bytes(6)).decode()
            return repo.etag

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        super().stop()
        if self._tmp:
            self._tmp.cleanup()
            self._tmp = None

    def _upstream(self) -> tuple[str, int]:
        assert self._served is not None, "not started"
        return "127.0.0.1", self._served.port

    # -- IAM -------------------------------------------------------------------------------------------
    def may_read(self, member: str | None, repo: Repository) -> bool:
        """``member`` (``serviceAccount:E``; None: anonymous) holds downloadArtifacts on ``repo``
        through its policy or its project's. A conditioned binding is not evaluated: it grants nothing."""
        with self.lock:
            bindings = [*repo.bindings]
        bindings += list(self.project_policy(repo.project))
        for binding in bindings:
            members = binding.get("members") or ()
            if binding.get("condition") or not ("allUsers" in members or (member is not None and (
                    member in members or "allAuthenticatedUsers" in members))):
                continue
            if READ in set(self.permissions(str(binding.get("role", "")))):
                return True
        return False

    # -- the protocol ----------------------------------------------------------------------------------
    def _app(self) -> Flask:
        app = Flask(self.name)

        @app.route("/v2/", methods=["GET", "HEAD"])
        def ping() -> Response:
            return self._answer(self._ping)

        @app.route("/v2/token", methods=["GET"])
        def token() -> Response:
            return self._answer(lambda: self._token(request.args.getlist("scope")))

        @app.route("/v2/<path:rest>", methods=["GET", "HEAD"])
        def content(rest: str) -> Response:
            return self._answer(lambda: self._content(request.path))

        return app

    def _answer(self, handler: Callable[[], Response]) -> Response:
        try:
            response = handler()
        except RegistryError as e:
            body = json.dumps({"errors": [{"code": e.code, "message": e.message}]})
            response = Response(body if request.method != "HEAD" else "", status=e.status, mimetype=_ACCEPTED)
            if e.challenge:
                response.headers["WWW-Authenticate"] = e.challenge
        response.headers["Docker-Distribution-API-Version"] = "registry/2.0"
        return response

    def _host(self) -> str:
        """The registry host the request is for (``Host:``, as the proxy passes it on)."""
        host = request.host.lower().removesuffix(":443")
        if host not in self.hosts:
            raise RegistryError(404, "NAME_UNKNOWN", f"{host} is no Artifact Registry host of the local cloud: "
                                                     "it answers for LOCATION-docker.pkg.dev through its proxy")
        return host

    def _challenge(self, host: str, scope: str | None = None) -> str:
        said = f'Bearer realm="https://{host}/v2/token",service="{host}"'
        return said + (f',scope="{scope}"' if scope else "")

    def _ping(self) -> Response:
        host = self._host()
        if self._grant(host) is None:
            raise RegistryError(401, "UNAUTHORIZED", NO_CREDENTIAL, self._challenge(host))
        return Response("{}", mimetype=_ACCEPTED)

    def _token(self, scopes: list[str]) -> Response:
        host = self._host()
        member = self._basic_member()
        names = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            if kind == "repository" and name and "pull" in actions.split(","):
                self._check_read(member, _named(host, name))
                names.append(name)
        issued = secrets.token_urlsafe(24)
        with self.lock:
            now = time.monotonic()
            self._tokens = {t: g for t, g in self._tokens.items() if g.expires > now}
            self._tokens[issued] = _Grant(member, host, frozenset(names), now + TOKEN_LIFETIME)
        body = {"token": issued, "access_token": issued, "expires_in": TOKEN_LIFETIME,
                "issued_at": datetime.now(UTC).isoformat().replace("+00:00", "Z")}
        return Response(json.dumps(body), mimetype=_ACCEPTED)

    def _basic_member(self) -> str | None:
        """The member the request's Basic credentials stand for; None without credentials."""
        auth = request.authorization
        if auth is None or auth.type != "basic":
            return None
        email = self.accounts(auth.password or "") if _ACCESS_TOKEN_USER.fullmatch(auth.username or "") else None
        if not email:
            raise RegistryError(401, "UNAUTHORIZED", NO_CREDENTIAL)
        return email if ":" in email else f"serviceAccount:{email}"

    def _check_read(self, member: str | None, target: ArtifactImage) -> Repository:
        repo = self.repository(target.project, target.location, target.repository)
        if repo is None or not self.may_read(member, repo):
            resource = f'"{target.repository_name}" (or it may not exist)'
            raise RegistryError(403, "DENIED", f'Permission "{READ}" denied on resource {resource}' if member else
                                "Unauthenticated request. Unauthenticated requests do not have permission "
                                f'"{READ}" on resource {resource}')
        return repo

    def _grant(self, host: str) -> _Grant | None:
        kind, _, token = request.headers.get("Authorization", "").partition(" ")
        if kind.lower() != "bearer":
            return None
        with self.lock:
            grant = self._tokens.get(token.strip())
        return grant if grant is not None and grant.host == host and grant.expires > time.monotonic() else None

    def _content(self, path: str) -> Response:
        host = self._host()
        found = _PATH.fullmatch(path)
        if found is None:
            raise RegistryError(404, "NAME_UNKNOWN", f"{path} is no path of the registry API")
        name, kind, ref = found["name"], found["kind"], found["ref"]
        target = _named(host, name)
        grant = self._grant(host)
        if grant is None or name not in grant.names:  # none, or one for other repositories: ask for one for this
            scope = f"repository:{name}:pull"
            raise RegistryError(401, "UNAUTHORIZED", NO_CREDENTIAL, self._challenge(host, scope) + (
                ',error="insufficient_scope"' if grant is not None else ""))
        repo = self._check_read(grant.member, target)  # IAM again: a grant taken away counts at once
        with self.lock:
            stored = repo.images.get(target.image)
        if kind == "manifests":
            return self._manifest(stored, ref, path)
        return self._blob(stored, ref)

    def _manifest(self, stored: Stored | None, ref: str, path: str) -> Response:
        with self.lock:
            digest = None if stored is None else ref if ref.startswith("sha256:") else stored.tags.get(ref)
            entry = None if stored is None or digest is None else stored.manifests.get(digest)
        if entry is None or digest is None:
            raise RegistryError(404, "MANIFEST_UNKNOWN", f'Failed to fetch "{ref}" from request "{path}".')
        media_type, body, _ = entry
        response = Response(body if request.method != "HEAD" else b"", mimetype=media_type)
        response.headers["Docker-Content-Digest"] = digest
        response.headers["Content-Length"] = str(len(body))
        return response

    def _blob(self, stored: Stored | None, digest: str) -> Response:
        with self.lock:
            known = stored is not None and digest in stored.blobs
        if not known or not self.blobs.has(digest):
            raise RegistryError(404, "BLOB_UNKNOWN", f'Failed to fetch "{digest}".')
        path = self.blobs.path(digest)
        if request.method == "HEAD":
            response = Response(b"", mimetype="application/octet-stream")
            response.headers["Content-Length"] = str(path.stat().st_size)
        else:
            response = send_file(path, mimetype="application/octet-stream", conditional=False, etag=False)
        response.headers["Docker-Content-Digest"] = digest
        return response


def _artifact(ref: str) -> ArtifactImage:
    found = imageref.artifact(imageref.parse(ref))
    if found is None:
        raise ValueError(f"{ref}: not an Artifact Registry image (LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE)")
    return found


def _named(host: str, name: str) -> ArtifactImage:
    """The image a request names (``PROJECT/REPOSITORY/IMAGE`` on ``host``)."""
    try:
        return _artifact(f"{host}/{name}")
    except ValueError as e:
        raise RegistryError(404, "NAME_UNKNOWN", f"Repository {name!r}: {e}") from e


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
