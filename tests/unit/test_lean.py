"""A pass that only lists imports none of google-cloud-compute; the first change imports two
of its service clients, not its hundred, and the package still answers everything it is asked
afterwards; google-cloud-compute-v1beta
(the preemption notice's inserts) is imported at the first such insert, one client of it."""

from __future__ import annotations

import os
import subprocess
import sys

CHECK = """
import sys
from controller.adapters.google import compute_gateway  # what a function's first pass imports
from controller.service.config import Settings
from localcloud.compute import ComputeServer

types = "google.cloud.compute_v1.types.compute"
with ComputeServer(run_vms=False) as srv:
    gateway = compute_gateway(Settings(bucket="b", project="p", compute_endpoint=srv.endpoint))
    assert gateway.list_managed(["p"]).instances == [] and gateway.list_managed(["p"], zones=["us-central1-a"]).instances == []
    assert types not in sys.modules, "a pass that only lists never builds google-cloud-compute's message types"
    gateway.instances  # the first change builds the clients
assert types in sys.modules
loaded = [m for m in sys.modules if m.startswith("google.cloud.compute_v1.services.")]
assert not [m for m in loaded if ".instances" not in m and ".zone_operations" not in m], loaded
from google.cloud import compute_v1
from google.cloud.compute_v1 import Instance, AcceleratorTypesClient  # the package's own names: its __init__ runs now
from controller.adapters import compute
assert compute_v1.Instance is Instance is compute.v1().Instance
assert compute_v1.InstancesClient is type(gateway.instances) and AcceleratorTypesClient.__name__ == "AcceleratorTypesClient"
assert not [m for m in sys.modules if m.startswith("google.cloud.compute_v1beta")]  # only at the first notice
print("ok")
"""

BETA = """
import sys
import controller.adapters.google
from controller.adapters import compute_beta  # the first insert that asks for a preemption notice
loaded = [m for m in sys.modules if m.startswith("google.cloud.compute_v1beta.services.")]
# its InstancesClient imports its zone operations client itself (for ExtendedOperation), as v1's does
assert loaded and not [m for m in loaded if ".instances" not in m and ".zone_operations" not in m], loaded
from google.cloud import compute_v1beta
from google.cloud.compute_v1beta import Scheduling, AcceleratorTypesClient  # the package's own names, as with v1
assert compute_v1beta.InstancesClient is compute_beta.InstancesClient and Scheduling.__name__ == "Scheduling"
print("ok")
"""


def test_a_listing_imports_no_compute_types_and_a_change_only_its_two_clients():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_beta_client_is_imported_alone_and_only_when_asked_for():
    done = subprocess.run([sys.executable, "-c", BETA], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


ENGINE = """
import sys
import main  # the deployed functions' entry points
from controller.service import bootstrap

bootstrap.engine()  # what a fresh instance builds before its first pass
assert "google.cloud.compute_v1.types.compute" not in sys.modules, "built before any change asked for it"
print("ok")
"""


def test_a_fresh_function_builds_its_engine_without_compute_types():
    """The capacity advisor's client too is built at the first launch that asks (bootstrap.LazyAdvisor)."""
    env = {**os.environ, "RESPAWN_BUCKET": "b", "RESPAWN_PROJECT": "p", "RESPAWN_COMPUTE_ENDPOINT": "http://127.0.0.1:9",
           "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9", "RESPAWN_LOG_FORMAT": "text"}
    done = subprocess.run([sys.executable, "-c", ENGINE], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


RACE = """
import sys, threading
from controller.adapters.lean import lean

barrier, seen = threading.Barrier(8), []

def first_change():  # what a pass's threads do when several change a VM at once (compute.v1)
    barrier.wait()
    lean("google.cloud.compute_v1")
    seen.append(sys.modules["google.cloud.compute_v1"])

threads = [threading.Thread(target=first_change) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
import google.cloud
assert len({id(m) for m in seen}) == 1 and seen[0] is google.cloud.compute_v1, len({id(m) for m in seen})
print("ok")
"""


def test_threads_that_register_a_package_at_once_register_it_once():
    done = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
