"""One page of the tick's ``instances.aggregatedList`` (500 VMs, Compute's page), as the controller
receives it: its bytes, and the CPU to parse it as the controller does (the adapter's ``Listing``
reads the JSON as it comes, then ``_instance`` per VM; before, the compute_v1 REST transport's
``json_format.Parse`` into proto-plus messages came first), with the memory the parse allocates at
its peak (tracemalloc). Three pages:

- ``inlined``: each VM's metadata holding the whole agent (startup.sh, shutdown.sh, common.sh
  inlined in both), as the controller launched VMs before issue 40; the whole response.
- ``bootstrap``: the metadata VMs carry now (the bootstraps, and where the agent lies), the whole
  response: what a server ignoring the field mask would send.
- ``fields``: the page after the partial response the adapter asks for (``AGGREGATED_FIELDS``),
  cut by the local Compute's own ``fields`` implementation.

Each VM is launched as the controller launches one (``launch.requests_for``, the adapter's
``instance_body``) and shaped as Compute returns it (``localcloud.gce.instance_resource``).

    python -m bench.listing [--vms 500] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from typing import Any

import yaml

from controller.adapters.compute import AGGREGATED_FIELDS, _instance, instance_body
from controller.core.launch import LaunchContext, requests_for
from controller.core.spec import parse_spec
from controller.core.state import JobStatus, Phase
from controller.service import vmscripts
from controller.service.bootstrap import launch_context
from controller.service.config import REPO_ROOT, Settings
from controller.adapters.compute import v1
from localcloud import fields, gce

PROJECT, BUCKET = "bench-proj", "bench-bucket"
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")
SPEC = {"zones": list(ZONES), "machine_type": "g2-standard-8", "command": "python train.py --config big.yaml",
        "checkpoint": {"uri": "gs://bench-ckpt/run"}, "env": {"WANDB_PROJECT": "bench", "HF_HOME": "/mnt/hf"}}


def page(vms: int, ctx: LaunchContext) -> dict[str, Any]:
    """An aggregated list page of ``vms`` running VMs, spread over ZONES."""
    urls = gce.Urls("https://compute.googleapis.com")
    items: dict[str, Any] = {}
    for n in range(vms):
        job, zone = f"job-{n:05d}", ZONES[n % len(ZONES)]
        spec = parse_spec(yaml.safe_dump(SPEC), job)
        status = JobStatus(phase=Phase.RUNNING, attempt=1 + n % 3, zone=zone, attempt_token=f"token-{n:05d}")
        (request,) = requests_for(job, spec, status, ctx)
        body = json.loads(v1().Instance.to_json(instance_body(request)))
        resource = {**gce.instance_resource(body, PROJECT, zone, urls), "status": "RUNNING"}
        items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(resource)
    return {"kind": "compute#instanceAggregatedList", "id": f"projects/{PROJECT}/aggregated/instances",
            "items": items, "selfLink": f"{urls.base}projects/{PROJECT}/aggregated/instances", "nextPageToken": "next"}


def parse(content: bytes) -> int:
    """What the controller does with one page (``compute.ComputeEngine._listed``): the JSON, then the adapter's read."""
    resp = json.loads(content)
    return sum(len([_instance(PROJECT, scope.removeprefix("zones/"), i) for i in scoped.get("instances", ())])
               for scope, scoped in resp.get("items", {}).items())


def measure(content: bytes, repeat: int) -> dict[str, float]:
    read = parse(content)
    cpu = []
    for _ in range(repeat):
        t0 = time.process_time()
        parse(content)
        cpu.append(time.process_time() - t0)
    tracemalloc.start()
    parse(content)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"bytes": len(content), "MiB": len(content) / 2**20, "parse_cpu_s": min(cpu), "parse_peak_MiB": peak / 2**20,
            "vms_read": read}


def pages(vms: int) -> dict[str, dict[str, Any]]:
    """The page as it was (the agent inlined), with the bootstrap, and with the adapter's field mask."""
    scripts = vmscripts.load(REPO_ROOT / "deploy" / "vm")
    agent = vmscripts.agent(REPO_ROOT / "deploy" / "vm")
    inlined = LaunchContext(BUCKET, PROJECT, *agent)  # before: the agent itself in every VM's metadata
    now = launch_context(Settings(bucket=BUCKET, project=PROJECT), scripts)
    whole = page(vms, now)
    return {"inlined": page(vms, inlined), "bootstrap": whole,
            "fields": fields.select(whole, fields.parse(AGGREGATED_FIELDS))}


def scenario(run: Any) -> dict[str, Any]:
    """``make bench``'s keys: ``listing_500_<page>_mib`` and ``_parse_cpu_s`` (8 VMs in a smoke run)."""
    vms = 8 if run.quick else 500
    out: dict[str, Any] = {"listing_vms": vms}
    for name, body in pages(vms).items():
        f = measure(json.dumps(body).encode(), 5)
        out[f"listing_{name}_mib"], out[f"listing_{name}_parse_cpu_s"] = round(f["MiB"], 3), round(f["parse_cpu_s"], 4)
    return out


def main(argv: list[str] | None = None) -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--vms", type=int, default=500)
    args.add_argument("--repeat", type=int, default=5, help="parses timed (the fastest is kept)")
    a = args.parse_args(argv)
    figures = {name: measure(json.dumps(body).encode(), a.repeat) for name, body in pages(a.vms).items()}
    print(f"one aggregatedList page of {a.vms} VMs (parse: the fastest of {a.repeat}, this machine)")
    print(f"{'page':<10} {'bytes':>12} {'MiB':>8} {'parse CPU s':>12} {'parse peak MiB':>15}")
    for name, f in figures.items():
        print(f"{name:<10} {f['bytes']:>12,} {f['MiB']:>8.2f} {f['parse_cpu_s']:>12.3f} {f['parse_peak_MiB']:>15.1f}")
    print(json.dumps({"vms": a.vms, **figures}, indent=None))


if __name__ == "__main__":
    main()
