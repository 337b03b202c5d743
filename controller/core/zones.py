"""Compute Engine's zones, so that a zone Google does not have (``us-central1-z``) is refused by
``respawn validate`` and ``submit`` with the zone meant, not found out by the controller as a
FAILED job whose every insert Google answered 404.

The table is Google's "Regions and zones" page (cloud.google.com/compute/docs/regions-zones, the
same list ``gcloud compute zones list`` prints) as it stood when this was written: each region
with its zone letters, most a, b, c; some not (us-central1 has a, b, c, f; us-east1 b, c, d;
europe-west1 b, c, d). us-central2 is not on that page: it is Cloud TPU's region for TPU v4
(cloud.google.com/tpu/docs/regions-zones lists us-central2-b), kept here because TPU jobs run there.

Google adds regions and zones. Only the CLI checks this table (the controller never refuses a spec
for it: Google's own answer is the last word there), and a zone added since is admitted by naming
it in RESPAWN_EXTRA_ZONES (comma-separated), which every refusal says.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

EXTRA_SETTING = "RESPAWN_EXTRA_ZONES"

REGIONS: dict[str, str] = {
    "africa-south1": "abc",
    "asia-east1": "abc", "asia-east2": "abc",
    "asia-northeast1": "abc", "asia-northeast2": "abc", "asia-northeast3": "abc",
    "asia-south1": "abc", "asia-south2": "abc",
    "asia-southeast1": "abc", "asia-southeast2": "abc",
    "australia-southeast1": "abc", "australia-southeast2": "abc",
    "europe-central2": "abc", "europe-north1": "abc", "europe-north2": "abc", "europe-southwest1": "abc",
    "europe-west1": "bcd", "europe-west2": "abc", "europe-west3": "abc", "europe-west4": "abc",
    "europe-west6": "abc", "europe-west8": "abc", "europe-west9": "abc", "europe-west10": "abc",
    "europe-west12": "abc",
    "me-central1": "abc", "me-central2": "abc", "me-west1": "abc",
    "northamerica-northeast1": "abc", "northamerica-northeast2": "abc", "northamerica-south1": "abc",
    "southamerica-east1": "abc", "southamerica-west1": "abc",
    "us-central1": "abcf", "us-central2": "b",
    "us-east1": "bcd", "us-east4": "abc", "us-east5": "abc",
    "us-south1": "abc",
    "us-west1": "abc", "us-west2": "abc", "us-west3": "abc", "us-west4": "abc",
}
ZONES: frozenset[str] = frozenset(f"{region}-{letter}" for region, letters in REGIONS.items() for letter in letters)


def problem(zone: str, extra: Iterable[str] = ()) -> str | None:
    """Why ``zone`` is no zone of Compute Engine's, with the zone perhaps meant and the way to
    admit one Google added since; None when it is one (or named in ``extra``)."""
    if zone in ZONES or zone in extra:
        return None
    region, _, letter = zone.rpartition("-")
    if region in REGIONS:
        near, there = region, f"{region} has zones {', '.join(REGIONS[region])}"
    else:
        close = difflib.get_close_matches(region, REGIONS, n=1, cutoff=0.75)
        near, there = (close[0] if close else None), f"there is no region {region}"
    mean = ""
    if near:
        letters = REGIONS[near]
        mean = f" did you mean {near}-{letter if letter in letters else letters[0]}?"
    return (f"{zone!r} is not a Compute Engine zone ({there});{mean} `gcloud compute zones list` shows them all; "
            f"a zone Google added after respawn's table ({__name__.replace('.', '/')}.py) is taken with "
            f"{EXTRA_SETTING}={zone}")


def problems(zones: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """One line per unknown zone of a spec's ``zones``, each named by its place: ``zones.0: ...``."""
    known = tuple(extra)
    return [f"zones.{i}: {said}" for i, zone in enumerate(zones) if (said := problem(zone, known))]
