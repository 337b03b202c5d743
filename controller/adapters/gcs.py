"""The BlobStore port on google-cloud-storage.

Every compare-and-swap is a generation precondition. google-cloud-storage 3.x retries
conditional uploads by itself, so a write whose first try succeeded can answer 412 on
the retry: on 412 the object is read back, and our own bytes there mean success.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from google.api_core import exceptions as gexc
from google.cloud import storage

from controller.adapters.reasons import said
from controller.core import errors
from controller.core.ports import Blob, BlobInfo

_TRANSIENT = (gexc.TooManyRequests, gexc.InternalServerError, gexc.BadGateway, gexc.ServiceUnavailable,
              gexc.GatewayTimeout, gexc.DeadlineExceeded)


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Library errors in, the project's own errors out: the reason first, then ``what`` (never the request's URL)."""
    try:
        yield
    except gexc.NotFound as e:
        raise errors.NotFound(what) from e
    except gexc.PreconditionFailed as e:
        raise errors.PreconditionFailed(what) from e
    except gexc.Conflict as e:
        raise errors.AlreadyExists(what) from e
    except _TRANSIENT as e:
        raise errors.TransientError(said(what, e)) from e
    except gexc.RetryError as e:  # the library's own retries ran out on transient errors
        raise errors.TransientError(said(what, e)) from e
    except gexc.GoogleAPICallError as e:
        raise errors.RequestError(said(what, e)) from e
    except (ConnectionError, OSError) as e:  # requests' connection errors derive from OSError
        raise errors.TransientError(said(what, e)) from e


class GcsStore:
    def __init__(self, client: storage.Client, page_size: int = 1000) -> None:
        self.client = client
        self.page_size = page_size

    def read(self, bucket: str, name: str, *, limit: int | None = None) -> Blob:
        where = f"gs://{bucket}/{name}"
        for _ in range(3):  # the object may be replaced between its metadata and its bytes
            with translated(where):
                blob = self.client.bucket(bucket).get_blob(name)
                if blob is None:
                    raise errors.NotFound(where)
                if limit is not None and int(blob.size or 0) > limit:
                    raise errors.TooLarge(f"{where}: {blob.size} bytes, over {limit}")
                try:
                    data = blob.download_as_bytes(if_generation_match=blob.generation)
                # Replaced since its metadata was read: 412 (ifGenerationMatch), or 404 on
                # Google, whose download names the generation read (mediaLink). Read again.
                except (gexc.PreconditionFailed, gexc.NotFound):
                    continue
                return Blob(_info(blob), data)
        raise errors.TransientError(f"{where} kept changing while being read")

    def read_listed(self, info: BlobInfo) -> bytes:
        # One media request pinned by ifGenerationMatch: 412 once the object was replaced.
        where = f"gs://{info.bucket}/{info.name}#{info.generation}"
        try:
            with translated(where):
                return self.client.bucket(info.bucket).blob(info.name).download_as_bytes(
                    if_generation_match=info.generation)
        except errors.PreconditionFailed as e:
            raise errors.NotFound(f"{where}: replaced since it was listed") from e

    def stat(self, bucket: str, name: str) -> BlobInfo:
        where = f"gs://{bucket}/{name}"
        with translated(where):
            blob = self.client.bucket(bucket).get_blob(name)
        if blob is None:
            raise errors.NotFound(where)
        return _info(blob)

    def list(self, bucket: str, prefix: str) -> list[BlobInfo]:
        where = f"gs://{bucket}/{prefix}*"
        try:
            with translated(where):
                return [_info(b) for b in self.client.list_blobs(bucket, prefix=prefix, page_size=self.page_size)]
        except errors.NotFound as e:  # objects.list answers 404 for the bucket alone: no prefix is "not found"
            raise errors.NoSuchBucket(bucket, where) from e

    def write(self, bucket: str, name: str, data: bytes, *, if_generation_match: int | None = None,
              metadata: Mapping[str, str] | None = None) -> BlobInfo:
        where = f"gs://{bucket}/{name}"
        blob = self.client.bucket(bucket).blob(name)
        if metadata is not None:
            blob.metadata = dict(metadata)  # sent with the bytes: one multipart upload
        try:
            with translated(where):
                blob.upload_from_string(data, if_generation_match=if_generation_match)
        except errors.PreconditionFailed:
            if if_generation_match is None:
                raise
            mine = self._ours(bucket, name, data)
            if mine is None:
                raise
            return mine
        return _info(blob)

    def delete(self, bucket: str, name: str, *, if_generation_match: int | None = None) -> None:
        with translated(f"gs://{bucket}/{name}"):
            self.client.bucket(bucket).blob(name).delete(if_generation_match=if_generation_match)

    def _ours(self, bucket: str, name: str, data: bytes) -> BlobInfo | None:
        """After a 412: is the object there now the one this very write put there?"""
        try:
            current = self.read(bucket, name)
        except errors.NotFound:
            return None
        return current.info if current.data == data else None


def _info(blob: storage.Blob) -> BlobInfo:
    # The custom metadata from the resource as listed (objects.list's default projection, noAcl,
    # returns it; no ``fields`` is asked for): ``Blob.metadata`` deep-copies it for each object, and
    # a listing holds tens of thousands.
    metadata = blob._properties.get("metadata")  # noqa: SLF001
    return BlobInfo(blob.bucket.name, blob.name, int(blob.generation), blob.updated, int(blob.size or 0),
                    dict(metadata) if isinstance(metadata, dict) and metadata else None)
