"""The buckets the CLI names besides a job's own: what it says when RESPAWN_BUCKET names a bucket
that does not exist (a typo, or a terminal that never sourced the local cloud's exports): the bucket,
the variable, where its value came from (the environment alone, or the local cloud's local.env), and
the fix (listing jobs/ in such a bucket is Google's 404, which said alone reads as a bare
``gs://BUCKET/jobs/*``); and the checkpoints bucket ``respawn deploy`` makes beside the control
bucket, where ``respawn run`` puts a job's checkpoints when it is given no ``--checkpoint``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from controller.core.names import CHECKPOINTS_SUFFIX, checkpoints_bucket, default_checkpoint  # noqa: F401 - named here too

VARIABLE = "RESPAWN_BUCKET"


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
