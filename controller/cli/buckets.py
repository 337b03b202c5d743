"""The buckets the CLI names besides a job's own: what it says when RESPAWN_BUCKET names a bucket
that does not exist (a typo, or a terminal that never sourced the local cloud's exports): the bucket,
the variable, where its value came from (the environment alone, or the local cloud's local.env), and
the fix (listing jobs/ in such a bucket is Google's 404, which said alone reads as a bare
``gs://BUCKET/jobs/*``); and the checkpoints bucket ``respawn deploy`` makes beside the control
bucket, where ``respawn run`` puts a job's checkpoints when it is given no ``--checkpoint``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

VARIABLE = "RESPAWN_BUCKET"
CHECKPOINTS_SUFFIX = "-checkpoints"
# Cloud Storage's bucket names (cloud.google.com/storage/docs/naming-buckets): 3 to 63 lowercase letters,
# digits, '-' and '_', starting and ending with a letter or digit. A name with dots may be longer, but
# "names containing dots require verification" of the domain they name: CONTROL-checkpoints is no domain.
_PLAIN_BUCKET = re.compile(r"[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]")
MAX_BUCKET = 63


def checkpoints_bucket(control: str) -> str:
    """The checkpoints bucket of the control bucket ``control``: ``CONTROL-checkpoints``, which
    ``respawn deploy`` (and ``respawn local up``) makes, the trainers' account may read and write, and
    the controller's may list. A bucket of its own, not a prefix of the control bucket: the trainers
    may neither list nor read that one (deploy/IAM.md). ValueError, saying why, where that name
    cannot be a bucket's."""
    name = f"{control}{CHECKPOINTS_SUFFIX}"
    if len(name) > MAX_BUCKET:
        raise ValueError(f"gs://{name} would be {len(name)} characters long, and a bucket name is at most "
                         f"{MAX_BUCKET} (a control bucket of at most {MAX_BUCKET - len(CHECKPOINTS_SUFFIX)} has one)")
    if "." in name:
        raise ValueError(f"gs://{name} has dots, and Cloud Storage makes a bucket with dots only for a domain "
                         "verified as yours")
    if not _PLAIN_BUCKET.fullmatch(name):
        raise ValueError(f"gs://{name} is not a Cloud Storage bucket name")
    return name


def default_checkpoint(control: str, job: str) -> str:
    """``respawn run``'s checkpoint prefix for ``job`` when given none: its name in the checkpoints
    bucket. ValueError as ``checkpoints_bucket``."""
    return f"gs://{checkpoints_bucket(control)}/{job}"


def exported(env_file: Path, variable: str = VARIABLE) -> str | None:
    """The value local.env (``respawn local up``'s exports) gives ``variable``; None without one."""
    try:
        text = env_file.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if len(words) == 2 and words[0] == "export" and words[1].startswith(f"{variable}="):
            return words[1].partition("=")[2]
    return None


def no_bucket(bucket: str, env_file: Path) -> str:
    """One line: which bucket is not there, the variable that names it and where it came from, the fix."""
    said = f"bucket gs://{bucket} does not exist: {VARIABLE}={bucket}"
    local = exported(env_file)
    if local is not None and local != bucket:
        return (f"{said} is set in your environment, while the local cloud's {env_file} says {local}: "
                f"`source {env_file}` (or set {VARIABLE} to your control bucket)")
    if local == bucket:
        return (f"{said} comes from {env_file}, but its local cloud does not serve it: is `respawn local up` "
                f"still running? Start it again, or set {VARIABLE} to your control bucket")
    return (f"{said} is set in your environment: set {VARIABLE} to your control bucket (`respawn doctor` names "
            "the one the deployed controller uses; `gcloud storage ls` lists the project's buckets)")
