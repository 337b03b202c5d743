"""The Compute adapter imports two service clients, not google-cloud-compute's hundred,
and the package still answers everything it is asked afterwards; google-cloud-compute-v1beta
(the preemption notice's inserts) is imported at the first such insert, one client of it."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import controller.adapters.google  # what a function's first tick imports
loaded = [m for m in sys.modules if m.startswith("google.cloud.compute_v1.services.")]
assert not [m for m in loaded if ".instances" not in m and ".zone_operations" not in m], loaded
from google.cloud import compute_v1
from google.cloud.compute_v1 import Instance, AcceleratorTypesClient  # the package's own names: its __init__ runs now
from controller.adapters import compute
assert compute_v1.Instance is Instance is compute.compute_v1.Instance
assert compute_v1.InstancesClient is compute.InstancesClient and AcceleratorTypesClient.__name__ == "AcceleratorTypesClient"
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


def test_the_compute_adapter_imports_only_its_two_clients():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_beta_client_is_imported_alone_and_only_when_asked_for():
    done = subprocess.run([sys.executable, "-c", BETA], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
