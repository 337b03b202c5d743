"""Where checkpoints go: a local directory, or a gs:// prefix, behind one small interface.

Every ``put`` lands whole or not at all, as a Cloud Storage object does: the local store
writes a hidden temporary file beside the target and renames it (``os.replace``), so a
process killed mid-copy leaves no torn file under the checkpoint's name. That, and
``delete`` (of the ``<save>-unfinished`` object beside a save while it uploads), is what
lets the saver show respawn's finder a save only once everything in it is there.

gs:// uses the first of these that imports: ``google-cloud-storage`` (honours
``STORAGE_EMULATOR_HOST``), ``gcsfs`` through ``fsspec``, and else the Cloud Storage JSON
API over ``urllib`` with the VM's service-account token from the metadata server
(``GCE_METADATA_HOST`` honoured), so a VM with nothing but Python can still save.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Protocol, TypeVar

TIMEOUT_S = 60.0  # one request: a hung network never hangs a flush forever
RETRY_FOR_S = 120.0  # a request refused for a transient cause (408, 429, 5xx, the network) is retried this long
_T = TypeVar("_T")
_TEMPORARY = ".respawnkit-"  # a local copy under way (hidden and ".partial": never a checkpoint to the finder)


class Store(Protocol):
    """Objects under one prefix, named relative to it with ``/`` separators."""

    uri: str

    def put(self, local: str, name: str) -> None: ...
    def names(self, under: str = "") -> list[str]: ...
    def get(self, name: str, local: str) -> None: ...
    def delete(self, name: str) -> None: ...  # nothing there is no error


def open_store(uri: str) -> Store:
    """The store rooted at ``uri``: ``gs://bucket/prefix``, ``file:///path`` or a plain path."""
    if uri.startswith("gs://"):
        return _gcs(uri)
    return LocalStore(uri.removeprefix("file://"))


class LocalStore:
    """A directory standing in for a bucket prefix (tests, a shared filesystem, a gcsfuse mount)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.uri = self.root

    def put(self, local: str, name: str) -> None:
        target = os.path.join(self.root, *name.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=_TEMPORARY, suffix=".partial", dir=os.path.dirname(target))
        try:
            with os.fdopen(fd, "wb") as out, open(local, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
            os.replace(temporary, target)
        except BaseException:
            _remove(temporary)
            raise

    def names(self, under: str = "") -> list[str]:
        base = os.path.join(self.root, *under.split("/")) if under else self.root
        if os.path.isfile(base):
            return [under]
        found = []
        for folder, _, files in os.walk(base):
            for leaf in files:
                if not leaf.startswith(_TEMPORARY):  # a copy under way
                    found.append(os.path.relpath(os.path.join(folder, leaf), self.root).replace(os.sep, "/"))
        return sorted(found)

    def get(self, name: str, local: str) -> None:
        shutil.copyfile(os.path.join(self.root, *name.split("/")), local)

    def delete(self, name: str) -> None:
        _remove(os.path.join(self.root, *name.split("/")))


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _split(uri: str) -> tuple[str, str]:
    bucket, _, path = uri.removeprefix("gs://").partition("/")
    path = path.strip("/")
    return bucket, f"{path}/" if path else ""


def _gcs(uri: str) -> Store:
    try:
        from google.cloud import storage  # noqa: F401
    except ImportError:
        pass
    else:
        return _ClientStore(uri)
    try:
        import fsspec  # noqa: F401
        import gcsfs  # noqa: F401
    except ImportError:
        return _JsonApiStore(uri)
    return _FsspecStore(uri)


class _ClientStore:
    def __init__(self, uri: str) -> None:
        from google.cloud import storage

        self.uri = uri
        name, self.prefix = _split(uri)
        self.bucket = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT")).bucket(name)

    def put(self, local: str, name: str) -> None:
        self.bucket.blob(self.prefix + name).upload_from_filename(local, timeout=TIMEOUT_S)

    def names(self, under: str = "") -> list[str]:
        start = self.prefix + under
        return sorted(b.name[len(self.prefix):] for b in self.bucket.list_blobs(prefix=start, timeout=TIMEOUT_S)
                      if b.name == start or b.name.startswith(start.rstrip("/") + "/"))

    def get(self, name: str, local: str) -> None:
        self.bucket.blob(self.prefix + name).download_to_filename(local, timeout=TIMEOUT_S)

    def delete(self, name: str) -> None:
        from google.api_core.exceptions import NotFound

        try:
            self.bucket.blob(self.prefix + name).delete(timeout=TIMEOUT_S)  # its default retry covers 429 and 5xx
        except NotFound:
            pass


class _FsspecStore:
    def __init__(self, uri: str) -> None:
        import fsspec

        self.uri = uri
        self.root = uri.rstrip("/")
        self.fs = fsspec.filesystem("gs")

    def put(self, local: str, name: str) -> None:
        self.fs.put_file(local, f"{self.root}/{name}")

    def names(self, under: str = "") -> list[str]:
        path = f"{self.root}/{under}".rstrip("/")
        if self.fs.isfile(path):
            return [under]
        bare = self.root.removeprefix("gs://")
        return sorted(p.removeprefix("gs://")[len(bare) + 1:] for p in self.fs.find(path))

    def get(self, name: str, local: str) -> None:
        self.fs.get_file(f"{self.root}/{name}", local)

    def delete(self, name: str) -> None:
        try:
            self.fs.rm_file(f"{self.root}/{name}")
        except FileNotFoundError:
            pass


def _transient(error: BaseException) -> bool:
    if isinstance(error, urllib.error.HTTPError):
        return error.code in (408, 429) or 500 <= error.code < 600
    return isinstance(error, (urllib.error.URLError, ConnectionError, TimeoutError))


def _retrying(call: Callable[[], _T], retry_for: float, backoff: float) -> _T:
    """``call()``, again after a transient failure (exponential backoff with jitter) for up to ``retry_for`` s.
    Each try sends the whole request anew: an object's upload is idempotent (it replaces the object whole)."""
    end = time.monotonic() + retry_for
    while True:
        try:
            return call()
        except Exception as e:
            delay = random.uniform(backoff / 2, backoff)
            if not _transient(e) or time.monotonic() + delay > end:
                raise
            time.sleep(delay)
            backoff = min(backoff * 2, 30.0)


class _JsonApiStore:
    """The Cloud Storage JSON API with the standard library only. A request that fails for a transient cause
    (408, 429, 5xx, a connection error or timeout) is tried again, with backoff, for up to ``retry_for`` s."""

    retry_for = RETRY_FOR_S
    backoff = 1.0  # seconds before the first retry

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.bucket, self.prefix = _split(uri)
        host = os.environ.get("STORAGE_EMULATOR_HOST", "")
        self.emulated = bool(host)
        self.base = (host if "://" in host else f"http://{host}") if host else "https://storage.googleapis.com"

    def _token(self) -> dict[str, str]:
        if self.emulated:
            return {}
        host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
        request = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token",
                                         headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            return {"Authorization": f"Bearer {json.load(answer)['access_token']}"}

    def put(self, local: str, name: str) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": self.prefix + name})

        def send() -> None:
            with open(local, "rb") as body:
                request = urllib.request.Request(f"{self.base}/upload/storage/v1/b/{self.bucket}/o?{query}",
                                                 data=body, method="POST",
                                                 headers={**self._token(), "Content-Length": str(os.path.getsize(local))})
                urllib.request.urlopen(request, timeout=TIMEOUT_S).close()

        _retrying(send, self.retry_for, self.backoff)

    def names(self, under: str = "") -> list[str]:
        start, found, page = self.prefix + under, [], ""
        while True:
            query = urllib.parse.urlencode({"prefix": start, **({"pageToken": page} if page else {})})
            request = urllib.request.Request(f"{self.base}/storage/v1/b/{self.bucket}/o?{query}", headers=self._token())
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                listing = json.load(answer)
            found += [item["name"][len(self.prefix):] for item in listing.get("items", [])
                      if item["name"] == start or item["name"].startswith(start.rstrip("/") + "/")]
            if not (page := listing.get("nextPageToken", "")):
                return sorted(found)

    def get(self, name: str, local: str) -> None:
        quoted = urllib.parse.quote(self.prefix + name, safe="")
        request = urllib.request.Request(f"{self.base}/storage/v1/b/{self.bucket}/o/{quoted}?alt=media",
                                         headers=self._token())
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer, open(local, "wb") as out:
            shutil.copyfileobj(answer, out, 1 << 20)

    def delete(self, name: str) -> None:
        # GCS takes about one change a second to one object name: removing an object created a moment ago (a tiny
        # save's "-unfinished") may be a 429, retried like any transient refusal
        quoted = urllib.parse.quote(self.prefix + name, safe="")

        def send() -> None:
            request = urllib.request.Request(f"{self.base}/storage/v1/b/{self.bucket}/o/{quoted}", method="DELETE",
                                             headers=self._token())
            try:
                urllib.request.urlopen(request, timeout=TIMEOUT_S).close()
            except urllib.error.HTTPError as e:
                if e.code != 404:  # gone already: a retried delete whose first answer was lost
                    raise

        _retrying(send, self.retry_for, self.backoff)
