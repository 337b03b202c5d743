"""``respawn doctor``'s reads on Google's APIs (controller.cli.doctor.Apis).

Service Usage v1 (v1beta1 for Cloud TPU's quota metrics), Cloud Resource Manager v3, IAM v1 (roles
too), Cloud Functions v2, Cloud Run v2 (a function's service policy), Cloud Scheduler v1,
Logging v2 (``projects.sinks.get``), Pub/Sub v1 (``projects.topics.get``/``getIamPolicy``) and
Artifact Registry v1 (a spec's image: its repository, policy, tag or version)
through google-api-python-client, whose requests are built from the same discovery documents
the local cloud's stand-ins serve (localcloud/apis.py); Cloud Storage and Compute through their
own client libraries, as the rest of respawn. Each endpoint may be the local cloud's
(``Settings.*_endpoint``); there, no Google credentials are used. Every call is given
``timeout`` seconds. A resource that does not exist is ``errors.NotFound``; so is a project
Resource Manager answers 403 for (it says the same for one that does not exist).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from controller.core import errors
from controller.core.ports import BlobStore
from controller.core.quotas import QuotaUse
from controller.service import lastpass
from controller.service.config import Settings

CLOUD = "https://www.googleapis.com/auth/cloud-platform"


class GoogleApis:
    def __init__(self, config: Settings, timeout: float = 20.0) -> None:
        self.config = config
        self.timeout = timeout
        _import_clients()

    @property
    def local(self) -> bool:
        """Pointed at the local cloud (its Compute server): no Google credentials needed."""
        return bool(self.config.compute_endpoint)

    # -- credentials ---------------------------------------------------------------------------------
    def whoami(self) -> str:
        import google.auth
        from google.auth import exceptions as auth_errors

        try:
            credentials, project = google.auth.default(scopes=[CLOUD])
        except auth_errors.DefaultCredentialsError:
            token = self.config.access_token_file
            if self.local and token is not None and token.is_file():
                return f"the local cloud's access token ({token}; gcloud's CLOUDSDK_AUTH_ACCESS_TOKEN_FILE)"
            raise
        who = (getattr(credentials, "service_account_email", None) or getattr(credentials, "account", None)
               or getattr(credentials, "signer_email", None))
        kind = type(credentials).__module__.replace("google.", "") + "." + type(credentials).__name__
        return f"{who or 'application default credentials'} ({kind}{', project ' + project if project else ''})"

    # -- Resource Manager, Service Usage, IAM, Functions, Scheduler -----------------------------------
    def project(self, project: str) -> Mapping[str, Any]:
        with self._api("cloudresourcemanager", "v3", self.config.resourcemanager_endpoint, f"projects/{project}",
                       denied_is_missing=True) as api:
            return api.projects().get(name=f"projects/{project}").execute(num_retries=1)

    def project_policy(self, project: str) -> Sequence[Mapping[str, Any]]:
        with self._api("cloudresourcemanager", "v3", self.config.resourcemanager_endpoint,
                       f"projects/{project}") as api:
            policy = api.projects().getIamPolicy(resource=f"projects/{project}",
                                                 body={"options": {"requestedPolicyVersion": 3}}).execute(num_retries=1)
        return policy.get("bindings") or []

    def services(self, project: str, names: Sequence[str]) -> Mapping[str, str]:
        with self._api("serviceusage", "v1", self.config.serviceusage_endpoint, f"projects/{project}") as api:
            found = api.services().batchGet(parent=f"projects/{project}",
                                            names=[f"projects/{project}/services/{n}" for n in names]
                                            ).execute(num_retries=1)
        return {(s.get("config") or {}).get("name") or s.get("name", "").rsplit("/", 1)[-1]: s.get("state", "")
                for s in found.get("services") or []}

    def account(self, email: str) -> Mapping[str, Any]:
        with self._api("iam", "v1", self.config.iam_endpoint, email) as api:
            return api.projects().serviceAccounts().get(name=f"projects/-/serviceAccounts/{email}").execute(num_retries=1)

    def account_policy(self, email: str) -> Sequence[Mapping[str, Any]]:
        with self._api("iam", "v1", self.config.iam_endpoint, email) as api:
            policy = api.projects().serviceAccounts().getIamPolicy(
                resource=f"projects/-/serviceAccounts/{email}", options_requestedPolicyVersion=3).execute(num_retries=1)
        return policy.get("bindings") or []

    def role(self, name: str) -> Mapping[str, Any]:
        """IAM's Role: ``roles.get`` for a predefined one (``roles/X``), ``projects.roles.get`` or
        ``organizations.roles.get`` for a custom one; its ``includedPermissions`` are what it grants."""
        with self._api("iam", "v1", self.config.iam_endpoint, name) as api:
            if name.startswith("projects/"):
                request = api.projects().roles().get(name=name)
            elif name.startswith("organizations/"):
                request = api.organizations().roles().get(name=name)
            else:
                request = api.roles().get(name=name)
            return request.execute(num_retries=1)

    def service_policy(self, service: str) -> Sequence[Mapping[str, Any]]:
        """The allow policy of a gen2 function's Cloud Run service (``projects/P/locations/R/services/S``,
        its ``serviceConfig.service``): where ``gcloud functions add-invoker-policy-binding`` puts
        ``roles/run.invoker``. Cloud Run Admin v2 ``services.getIamPolicy``; the local cloud answers it
        at its Functions stand-in, whose functions these services are."""
        with self._api("run", "v2", self.config.functions_endpoint, service) as api:
            policy = api.projects().locations().services().getIamPolicy(
                resource=service, options_requestedPolicyVersion=3).execute(num_retries=1)
        return policy.get("bindings") or []

    def tpu_quotas(self, project: str) -> Sequence[Mapping[str, Any]]:
        """Cloud TPU's quota metrics and their limits in ``project`` (Service Usage v1beta1
        ``services.consumerQuotaMetrics.list`` of tpu.googleapis.com, every page; BASIC view: limits,
        no usage)."""
        parent, found, token = f"projects/{project}/services/tpu.googleapis.com", [], None
        with self._api("serviceusage", "v1beta1", self.config.serviceusage_endpoint, parent) as api:
            while True:
                page = api.services().consumerQuotaMetrics().list(parent=parent, view="BASIC",
                                                                  pageToken=token).execute(num_retries=1)
                found += page.get("metrics") or []
                token = page.get("nextPageToken")
                if not token:
                    return found

    def function(self, project: str, region: str, name: str) -> Mapping[str, Any]:
        full = f"projects/{project}/locations/{region}/functions/{name}"
        with self._api("cloudfunctions", "v2", self.config.functions_endpoint, full) as api:
            return api.projects().locations().functions().get(name=full).execute(num_retries=1)

    def scheduler_job(self, project: str, region: str, name: str) -> Mapping[str, Any]:
        full = f"projects/{project}/locations/{region}/jobs/{name}"
        with self._api("cloudscheduler", "v1", self.config.scheduler_endpoint, full) as api:
            return api.projects().locations().jobs().get(name=full).execute(num_retries=1)

    # -- the audit path: Logging v2 (the sink), Pub/Sub v1 (its topic and the topic's policy) --------
    def sink(self, project: str, name: str) -> Mapping[str, Any]:
        full = f"projects/{project}/sinks/{name}"
        with self._api("logging", "v2", self.config.logging_endpoint, full) as api:
            return api.projects().sinks().get(sinkName=full).execute(num_retries=1)

    def log_metrics(self, project: str) -> Mapping[str, Mapping[str, Any]]:
        """Every log-based metric of ``project`` by name (``projects.metrics.list``, every page)."""
        parent, found, token = f"projects/{project}", {}, None
        with self._api("logging", "v2", self.config.logging_endpoint, f"{parent}/metrics") as api:
            while True:
                page = api.projects().metrics().list(parent=parent, pageToken=token).execute(num_retries=1)
                found.update({m["name"].rpartition("/")[2]: m for m in page.get("metrics") or []})
                token = page.get("nextPageToken")
                if not token:
                    return found

    def topic(self, project: str, name: str) -> Mapping[str, Any]:
        full = f"projects/{project}/topics/{name}"
        with self._api("pubsub", "v1", self.config.pubsub_endpoint, full) as api:
            return api.projects().topics().get(topic=full).execute(num_retries=1)

    def topic_policy(self, project: str, name: str) -> Sequence[Mapping[str, Any]]:
        full = f"projects/{project}/topics/{name}"
        with self._api("pubsub", "v1", self.config.pubsub_endpoint, full) as api:
            policy = api.projects().topics().getIamPolicy(resource=full, options_requestedPolicyVersion=3
                                                          ).execute(num_retries=1)
        return policy.get("bindings") or []

    # -- Artifact Registry v1: a spec's image ---------------------------------------------------------
    def repository(self, name: str) -> Mapping[str, Any]:
        """``projects/P/locations/L/repositories/R``; a 403 is NotFound too (Google's "or it may not exist")."""
        with self._api("artifactregistry", "v1", self.config.artifactregistry_endpoint, name,
                       denied_is_missing=True) as api:
            return api.projects().locations().repositories().get(name=name).execute(num_retries=1)

    def repository_policy(self, name: str) -> Sequence[Mapping[str, Any]]:
        with self._api("artifactregistry", "v1", self.config.artifactregistry_endpoint, name) as api:
            policy = api.projects().locations().repositories().getIamPolicy(
                resource=name, options_requestedPolicyVersion=3).execute(num_retries=1)
        return policy.get("bindings") or []

    def image_tag(self, name: str) -> Mapping[str, Any]:
        """A Tag: ``<repository>/packages/<image, / escaped>/tags/<tag>``."""
        with self._api("artifactregistry", "v1", self.config.artifactregistry_endpoint, name,
                       denied_is_missing=True) as api:
            return api.projects().locations().repositories().packages().tags().get(name=name).execute(num_retries=1)

    def image_version(self, name: str) -> Mapping[str, Any]:
        """A Version: ``<repository>/packages/<image, / escaped>/versions/sha256:<digest>``."""
        with self._api("artifactregistry", "v1", self.config.artifactregistry_endpoint, name,
                       denied_is_missing=True) as api:
            return api.projects().locations().repositories().packages().versions().get(
                name=name).execute(num_retries=1)

    # -- Cloud Storage -------------------------------------------------------------------------------
    def bucket(self, bucket: str) -> Mapping[str, Any]:
        from controller.adapters.gcs import translated

        with translated(f"gs://{bucket}"):
            found = self._storage().get_bucket(bucket, timeout=self.timeout)
            return {"uniform": bool(found.iam_configuration.uniform_bucket_level_access_enabled)}

    def write_probe(self, bucket: str, name: str) -> None:
        from controller.adapters.gcs import translated

        blob = self._storage().bucket(bucket).blob(name)
        with translated(f"gs://{bucket}"):
            blob.upload_from_string(b"respawn doctor: written, then deleted\n", if_generation_match=0,
                                    timeout=self.timeout)
        with translated(f"gs://{bucket}/{name}"):
            blob.delete(timeout=self.timeout)

    def bucket_policy(self, bucket: str) -> Sequence[Mapping[str, Any]]:
        from controller.adapters.gcs import translated

        with translated(f"gs://{bucket}"):
            policy = self._storage().bucket(bucket).get_iam_policy(requested_policy_version=3, timeout=self.timeout)
        return [{**b, "members": sorted(b.get("members") or ())} for b in policy.bindings]

    def last_pass(self, bucket: str) -> lastpass.LastPass | None:
        return lastpass.read(self.store(), bucket)

    def store(self) -> BlobStore:
        from controller.adapters.gcs import GcsStore

        return GcsStore(self._storage())

    # -- Compute -------------------------------------------------------------------------------------
    def region_quotas(self, project: str, region: str) -> dict[str, QuotaUse]:
        from controller.adapters.google import quota_reader

        return quota_reader(self.config).region_quotas(project, region)

    def image(self, project: str, *, name: str | None = None, family: str | None = None) -> Mapping[str, Any]:
        from google.api_core import exceptions as gexc

        from controller.adapters.google import _client_args

        client = _images_client()(**_client_args(self.config))
        try:
            found = (client.get_from_family(project=project, family=family, timeout=self.timeout) if family
                     else client.get(project=project, image=name, timeout=self.timeout))
        except gexc.NotFound as e:
            raise errors.NotFound(f"projects/{project}/global/images/{'family/' + family if family else name}") from e
        except gexc.GoogleAPICallError as e:
            raise errors.RequestError(f"{e.code} {e.message}") from e
        return {"name": found.name, "family": found.family, "status": found.status}

    # -- plumbing ------------------------------------------------------------------------------------
    def _storage(self) -> Any:
        from google.cloud import storage

        return storage.Client(project=self.config.project or None)

    @contextlib.contextmanager
    def _api(self, name: str, version: str, endpoint: str | None, what: str,
             denied_is_missing: bool = False) -> Iterator[Any]:
        """A client of ``name`` ``version`` built from its discovery document, at ``endpoint`` if set
        (the local cloud: no credentials), errors translated."""
        import google_auth_httplib2
        import httplib2
        from googleapiclient import discovery
        from googleapiclient.errors import HttpError

        if endpoint:
            from google.auth.credentials import AnonymousCredentials

            credentials: Any = AnonymousCredentials()
        else:
            import google.auth

            credentials, _ = google.auth.default(scopes=[CLOUD])
        http = google_auth_httplib2.AuthorizedHttp(credentials, http=httplib2.Http(timeout=self.timeout))
        options = {"api_endpoint": endpoint.rstrip("/") + "/"} if endpoint else None
        api = discovery.build(name, version, http=http, static_discovery=True, cache_discovery=False,
                              client_options=options)
        try:
            yield api
        except HttpError as e:
            status = int(getattr(e.resp, "status", 0) or 0)
            said = f"{status} {e.reason or ''}".strip()
            if status == 404 or (status == 403 and denied_is_missing):
                raise errors.NotFound(f"{what}: {said}") from e
            if status in (429, 500, 502, 503, 504):
                raise errors.TransientError(f"{what}: {said}") from e
            raise errors.RequestError(f"{what}: {said}") from e
        except (socket.timeout, TimeoutError, OSError, httplib2.HttpLib2Error) as e:
            raise errors.TransientError(f"{what}: {type(e).__name__}: {e}") from e


def _images_client() -> Any:
    from controller.adapters.lean import lean

    lean("google.cloud.compute_v1")  # its __init__ imports every service client: ~1 s
    from google.cloud.compute_v1.services.images import ImagesClient

    return ImagesClient


def _import_clients() -> None:
    """Every client library the checks use, imported here, once, before the checks' threads start:
    two threads importing one package at once can each see it half initialized."""
    import google.auth  # noqa: F401
    import google_auth_httplib2  # noqa: F401
    import httplib2  # noqa: F401
    from google.cloud import storage  # noqa: F401
    from googleapiclient import discovery, errors as _  # noqa: F401

    from controller.adapters import gcs, google, quotas  # noqa: F401

    _images_client()
