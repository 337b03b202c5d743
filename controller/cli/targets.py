"""What ``respawn deploy`` is pointed at, checked before any step runs: the project id, the
region and the bucket name, each problem said with its fix.

``respawn deploy --dry-run --project MY_PROJ --region uscentral`` printed a whole plan that
every real run would refuse at its first gcloud command. Google's rules: a project id is 6 to 30
lowercase letters, digits or hyphens, starts with a letter and does not end with a hyphen (or an
old domain-scoped ``example.com:id``); a region is a word or two, hyphens, a number
(``us-central1``, ``northamerica-northeast1``); a bucket is named without ``gs://``.
"""

from __future__ import annotations

import difflib
import re

from controller.cli.joblogs import PROJECT_RE

# Compute Engine's regions (cloud.google.com/compute/docs/regions-zones), for "did you mean".
REGIONS = (
    "africa-south1", "asia-east1", "asia-east2", "asia-northeast1", "asia-northeast2", "asia-northeast3",
    "asia-south1", "asia-south2", "asia-southeast1", "asia-southeast2", "australia-southeast1",
    "australia-southeast2", "europe-central2", "europe-north1", "europe-north2", "europe-southwest1",
    "europe-west1", "europe-west2", "europe-west3", "europe-west4", "europe-west6", "europe-west8",
    "europe-west9", "europe-west10", "europe-west12", "me-central1", "me-central2", "me-west1",
    "northamerica-northeast1", "northamerica-northeast2", "northamerica-south1", "southamerica-east1",
    "southamerica-west1", "us-central1", "us-east1", "us-east4", "us-east5", "us-south1", "us-west1",
    "us-west2", "us-west3", "us-west4",
)
_REGION_RE = re.compile(r"[a-z]+(?:-[a-z]+)+[0-9]{1,2}")
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")


def problems(project: str, region: str, bucket: str) -> list[str]:
    """One line per thing wrong, each naming the fix; none when all three are well formed."""
    return [p for p in (project_problem(project), region_problem(region), bucket_problem(bucket)) if p]


def project_problem(project: str) -> str | None:
    if PROJECT_RE.fullmatch(project):
        return None
    hint = project.lower().replace("_", "-").strip("-")
    fix = f" (perhaps --project {hint})" if PROJECT_RE.fullmatch(hint) else ""
    return (f"--project {project!r} is not a project id: 6 to 30 lowercase letters, digits or hyphens, starting "
            f"with a letter, not ending with a hyphen{fix}; `gcloud projects list` shows yours")


def region_problem(region: str) -> str | None:
    """A region not shaped like one (refused); one shaped right but unknown is ``region_note``'s."""
    if region in REGIONS or _REGION_RE.fullmatch(region):
        return None
    near = _nearest(region)
    mean = f": did you mean --region {near}?" if near else ""
    return (f"--region {region!r} is not a Compute Engine region{mean} (a region is like us-central1; "
            "`gcloud compute regions list` shows them)")


def region_note(region: str) -> str | None:
    """A well-formed region respawn does not know: perhaps newer than its list, perhaps a typo."""
    if region in REGIONS or not _REGION_RE.fullmatch(region):
        return None
    near = _nearest(region)
    mean = f"did you mean --region {near}? " if near else ""
    return (f"--region {region!r} is not among the regions respawn knows: {mean}(deploying anyway: gcloud "
            "refuses a region that does not exist)")


def _nearest(region: str) -> str | None:
    near = difflib.get_close_matches(region.lower(), REGIONS, n=1, cutoff=0.6)
    return near[0] if near else None


def bucket_problem(bucket: str) -> str | None:
    if bucket.startswith("gs://"):
        name = bucket.removeprefix("gs://").rstrip("/")
        return f"--bucket {bucket!r}: drop gs://, a bucket is named by its name alone: --bucket {name} (refused as given)"
    if not _BUCKET_RE.fullmatch(bucket):
        return (f"--bucket {bucket!r} is not a Cloud Storage bucket name: 3 to 222 lowercase letters, digits, "
                "hyphens, underscores or dots, starting and ending with a letter or digit")
    return None
