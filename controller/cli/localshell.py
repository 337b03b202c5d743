"""Whether this shell points at the local cloud, asked by ``respawn deploy`` before anything else.

``respawn local up`` writes local.env (localcloud.stack.LocalCloud.env), which another terminal
sources: it points the clients (STORAGE_EMULATOR_HOST, RESPAWN_*_ENDPOINT) and gcloud
(CLOUDSDK_API_ENDPOINT_OVERRIDES_*, a dummy token) at servers on 127.0.0.1, and sets the local
project's settings (RESPAWN_TRAINER_SERVICE_ACCOUNT=respawn-trainer@respawn-local..., RESPAWN_BUCKET,
CLOUDSDK_CORE_PROJECT...). ``respawn deploy --project my-proj`` from that shell planned my-proj's roles
for the local project's trainer account, and its gcloud calls would have gone to the local cloud. Such a
deploy is refused in one line: what points at the local cloud, and the variables to unset (there is no
command that unsets them: a new shell, or the ``unset`` line). A deploy to the local cloud's own project,
on purpose, is left alone.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Mapping
from urllib.parse import urlsplit

# What local.env sets that is no address (LocalCloud.env): the local project's settings, and gcloud's.
SETTINGS = ("RESPAWN_BUCKET", "RESPAWN_PROJECT", "RESPAWN_REGION", "RESPAWN_TRAINER_SERVICE_ACCOUNT",
            "RESPAWN_VM_SCRIPTS", "RESPAWN_ALLOW_LOOPBACK_WEBHOOKS", "RESPAWN_NOTIFY_TOPIC", "RESPAWN_SHARDS",
            "RESPAWN_SHARD_TOPIC", "CLOUDSDK_CORE_PROJECT", "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE")
_ADDRESSED = ("RESPAWN_", "CLOUDSDK_API_ENDPOINT_OVERRIDES_")  # prefixes of the variables that may name a server


def host(value: str) -> str | None:
    """The host a URL (or a bare ``host:port``, as STORAGE_EMULATOR_HOST may be) names; None for another value."""
    try:
        return urlsplit(value if "://" in value else f"http://{value}").hostname
    except ValueError:
        return None


def on_this_machine(name: str | None) -> bool:
    """``name`` (a URL's host) is this machine: localhost (fully qualified too), 127.0.0.0/8, IPv6's
    loopback however written (an IPv4-mapped one included), or 0.0.0.0 / :: (a client connects to
    them here)."""
    if name is None:
        return False
    if name.rstrip(".") == "localhost":  # urlsplit's hostname is lowercased already
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def pointing(env: Mapping[str, str]) -> list[str]:
    """The variables of ``env`` that point a client or gcloud at a server on this machine, by name."""
    return sorted(key for key, value in env.items()
                  if (key == "STORAGE_EMULATOR_HOST" or key.startswith(_ADDRESSED)) and on_this_machine(host(value)))


def local_project(env: Mapping[str, str]) -> str | None:
    """The project the local cloud serves, as local.env says it (gcloud's project first)."""
    return env.get("CLOUDSDK_CORE_PROJECT") or env.get("RESPAWN_PROJECT") or None


def refusal(env: Mapping[str, str], project: str) -> str | None:
    """Why a deploy to ``project`` from a shell with ``env`` must not run, in one line with the fix; None
    when nothing points at the local cloud, or ``project`` is the local cloud's own."""
    found = pointing(env)
    local = local_project(env)
    if not found or project == local:
        return None
    hosts = "/".join(sorted({str(host(env[key])) for key in found}))
    said = f"respawn deploy --project {project} refused: this shell points at the local cloud"
    said += f" (project {local})" if local else ""
    verb = "points" if len(found) == 1 else "point"
    said += f": {', '.join(found)} {verb} at {hosts}, where the deploy's calls would go"
    trainer = env.get("RESPAWN_TRAINER_SERVICE_ACCOUNT", "")
    if trainer and not trainer.endswith(f"@{project}.iam.gserviceaccount.com"):
        said += f", and RESPAWN_TRAINER_SERVICE_ACCOUNT={trainer} would get {project}'s trainer roles"
    unset = sorted({*found, *(key for key in SETTINGS if key in env)})
    fix = shlex.join(["unset", *unset])
    return f"{said}. Deploy from a new shell (one that never sourced local.env), or first: {fix}"
