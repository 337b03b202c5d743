"""Faults injected into a running local cloud from another terminal (``respawn local preempt``,
``maintenance``, ``crash``, ``stockout``, ``quota``).

``respawn local up`` prints the servers' endpoints to export (``RESPAWN_COMPUTE_ENDPOINT``,
``RESPAWN_TPU_ENDPOINT``); this module reads what they hold (``GET /_local/``: their
machines and zones) and injects a fault through their ``POST /_local/<fault>`` routes
(``localcloud.host.Host._fault_route``). A machine goes to the server that has it: an
instance to Compute Engine, a TPU node to Cloud TPU; a zone fault to every server that
has the zone. Nothing is sent to a server that does not say it is a local one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests

COMPUTE, TPU = "Compute Engine", "Cloud TPU"
START = "start one with `respawn local up` in another terminal and export the variables it prints"
SHOWN = 20  # instance names listed in an error at most


class FaultError(Exception):
    """Why a fault was not injected, in one line that says what to do."""


@dataclass(frozen=True)
class Server:
    """One local server: what it is, the variable that names it, and its endpoint (None: unset)."""

    label: str
    variable: str
    endpoint: str | None

    def inventory(self) -> dict[str, Any]:
        """Its faults, machines and zones; a FaultError when nothing local answers there."""
        url = f"{self.endpoint}/_local/"
        try:
            response = requests.get(url, timeout=10)
        except requests.RequestException as e:
            raise FaultError(f"no local cloud answers at {self.endpoint} ({self.variable}): is `respawn local up` "
                             f"still running? If not, {START} ({type(e).__name__})") from e
        try:
            found = response.json() if response.status_code == 200 else None
        except ValueError:
            found = None
        if not isinstance(found, dict) or not isinstance(found.get("machines"), list):
            raise FaultError(f"{self.endpoint} ({self.variable}) is not a local {self.label} server "
                             f"(GET /_local/ answered {response.status_code}): faults go to the local cloud only; "
                             f"{START}")
        return found

    def inject(self, fault: str, **args: Any) -> None:
        try:
            response = requests.post(f"{self.endpoint}/_local/{fault}", json=args, timeout=30)
        except requests.RequestException as e:
            raise FaultError(f"the local {self.label} server at {self.endpoint} stopped answering: {e}") from e
        if response.status_code != 200:
            try:
                why = response.json().get("error")
            except (ValueError, AttributeError):
                why = None
            raise FaultError(f"the local {self.label} refused {fault}: {why or f'HTTP {response.status_code}'}")


class Faults:
    def __init__(self, compute_endpoint: str | None, tpu_endpoint: str | None) -> None:
        self.servers = [Server(COMPUTE, "RESPAWN_COMPUTE_ENDPOINT", _bare(compute_endpoint)),
                        Server(TPU, "RESPAWN_TPU_ENDPOINT", _bare(tpu_endpoint))]

    def _reachable(self) -> list[tuple[Server, dict[str, Any]]]:
        """Every server whose variable is set, with what it holds; a FaultError if none is set."""
        servers = [s for s in self.servers if s.endpoint]
        if not servers:
            raise FaultError(f"{' and '.join(s.variable for s in self.servers)} are not set: no local cloud to "
                             f"inject a fault into; {START}")
        return [(s, s.inventory()) for s in servers]

    def machine(self, fault: str, name: str, **args: Any) -> str:
        """Inject ``fault`` into the instance or TPU node ``name``; the label of the server that has it."""
        reachable = self._reachable()
        # A TPU node goes to Cloud TPU, whatever else carries its name.
        for server, held in sorted(reachable, key=lambda r: r[0].label != TPU):
            if name in held["machines"]:
                if fault not in held.get("faults", ()):
                    raise FaultError(f"{name} is a {server.label} {'node' if server.label == TPU else 'instance'}, "
                                     f"and the local {server.label} has no {fault} fault: "
                                     f"it has {', '.join(f for f in _MACHINE_FAULTS if f in held.get('faults', ()))}")
                server.inject(fault, name=name, **args)
                return server.label
        machines = sorted({m for _, held in reachable for m in held["machines"]})
        if any(name in held.get("gone", ()) for _, held in reachable):
            raise FaultError(f"{name} is gone: Compute Engine deleted it (its job finished, or moved on to a later "
                             f"attempt); `respawn status` shows the instances there are now"
                             + (f": {_listed(machines)}" if machines else ""))
        unset = [s.variable for s in self.servers if not s.endpoint]
        there = f"it has {_listed(machines)}" if machines else \
            "it has none yet (submit a job, and wait for `respawn status` to show its instance)"
        missing = f"; {' and '.join(unset)} not set, so its server was not asked" if unset else ""
        raise FaultError(f"no instance or TPU node named {name!r} in the local cloud; {there}{missing}")

    def zone(self, fault: str, zone: str, on: bool) -> list[str]:
        """Turn ``fault`` (stockout, quota) on or off in ``zone`` on every server that has the zone;
        the labels of those servers."""
        reachable = self._reachable()
        having = [server for server, held in reachable if zone in held.get("zones", ())]
        if not having:
            zones = sorted({z for _, held in reachable for z in held.get("zones", ())})
            unset = [s.variable for s in self.servers if not s.endpoint]
            missing = f"; {' and '.join(unset)} not set, so its zones were not asked" if unset else ""
            raise FaultError(f"no zone {zone!r} in the local cloud; its zones are {', '.join(zones)}{missing}")
        for server in having:
            server.inject(fault, zone=zone, on=on)
        return [s.label for s in having]


_MACHINE_FAULTS = ("preempt", "maintenance", "crash", "host_error")


def _bare(endpoint: str | None) -> str | None:
    return endpoint.strip().rstrip("/") or None if endpoint else None


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
