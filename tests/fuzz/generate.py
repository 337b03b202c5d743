"""Hostile bucket objects, generated and mutated from valid ones, reproducible by (seed, kind, index).

Three kinds, each a ``Case`` naming the object key it is written to:
- ``spec``: job specs, valid documents mutated (wrong types, unknown fields and typos,
  deep nesting, huge, negative and non-finite numbers, overflowing durations, unicode
  and control characters, hostile names, huge strings) and rendered as YAML, JSON,
  YAML with aliases, raw text mutations, invalid YAML, empty documents;
- ``record``: what a VM writes (exit record, heartbeat, preemption marker): garbage,
  non-finite numbers, ``[`` x 100000, wrong types, huge bodies, and valid ones;
- ``status``: ``status.json``, garbage or a valid one with fields mutated.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from typing import Any

import yaml

from controller.core import names
from tests.harness import CKPT_BUCKET

FUZZED = "fuzzed"  # the job a spec case is written for (unless its name is the mutation)
VICTIM = "victim"  # a running job whose records and status are fuzzed
HEALTHY = "healthy"  # the job that must be handled normally whatever else is in the bucket


@dataclass(frozen=True)
class Case:
    kind: str  # spec | record | status
    index: int
    key: str  # object name in the bucket
    body: bytes
    what: str  # a few words on how it was made
    setup: bool = False  # launch VICTIM (and for specs, an earlier valid spec) before the measured pass
    victim: int = 0  # which of VICTIM_DOCS the victim runs

    @property
    def job(self) -> str:
        ref = names.parse_object_name(self.key)
        return ref.job if ref else ""


def rng_for(seed: int, kind: str, index: int) -> random.Random:
    return random.Random(f"{seed}:{kind}:{index}")


# -- valid starting points -----------------------------------------------------------------

def valid_docs() -> list[dict[str, Any]]:
    return [
        {"zones": ["us-central1-a"], "machine_type": "n1-standard-8", "command": "python train.py"},
        {
            "zones": ["us-central1-a", "us-central1-b"],
            "machine_type": "g2-standard-8",
            "command": "python train.py",
            "checkpoint": {"uri": f"gs://{CKPT_BUCKET}/run"},
            "policy": {"backoff": {"initial": "30s", "max": "5m"}},
        },
        {
            "name": FUZZED,
            "zones": ["us-central1-a", "us-central1-b", "us-central1-c"],
            "machine_type": "n1-standard-8",
            "accelerators": {"type": "nvidia-tesla-t4", "count": 1},
            "provisioning": "spot",
            "boot_disk": {"image_family": "common-cu124-debian-11", "image_project": "deeplearning-platform-release",
                          "size_gb": 200, "type": "pd-balanced"},
            "service_account": {"scopes": ["https://www.googleapis.com/auth/cloud-platform"]},
            "network": {"network": "global/networks/default", "external_ip": True, "tags": ["training"]},
            "labels": {"team": "nlp"},
            "code": "gs://my-training-bucket/code/llm.tar.gz",
            "command": ["python", "train.py", "--config", "configs/ft.yaml"],
            "env": {"WANDB_MODE": "offline"},
            "nodes": 2,
            "checkpoint": {"uri": "gs://my-training-bucket/checkpoints/llm", "format": "auto"},
            "heartbeat_interval": "60s",
            "policy": {"max_restarts": 100, "max_failures": 5, "max_runtime": "7d", "max_instance_age": "24h",
                       "idle_timeout": "30m", "startup_grace": "15m", "backoff": {"initial": "30s", "max": "30m"},
                       "zone_cooldown": "10m", "crash_loop_failures": 3, "termination_action": "stop"},
        },
        {"zones": ["europe-west4-a"], "machine_type": "a3-highgpu-8g", "nodes": 2, "command": "torchrun train.py",
         "provisioning": "standard", "boot_disk": {"image": "projects/debian-cloud/global/images/family/debian-12"}},
        # Issue 22: a TPU slice (queued), a provisioning list with its fallback, notifications.
        {"zones": ["us-central2-b", "europe-west4-a"], "command": "python train.py",
         "tpu": {"type": "v5litepod-16", "runtime_version": "tpu-ubuntu2204-base", "queued": True},
         "provisioning": ["spot", "standard"], "placement": "ordered",
         "checkpoint": {"uri": f"gs://{CKPT_BUCKET}/tpu"},
         "policy": {"maintenance_timeout": "30m", "fallback": {"wait": "20m", "stockouts": 2, "step_up_after": "6h"}},
         "notify": {"topic": "projects/respawn-proj/topics/respawn-events",
                    "webhook": "https://hooks.slack.com/services/T000/B000/XXXX"}},
        {"zones": ["us-central1-a", "us-central1-b"], "machine_type": "g2-standard-8", "command": "python train.py",
         "provisioning": ["spot", "standard", "flex-start"], "placement": "capacity",
         "policy": {"max_run_duration": "3d", "fallback": {"wait": "30m", "stockouts": 3, "step_up_after": "2h"}},
         "notify": {"webhook": "https://hooks.slack.com/services/T000/B000/YYYY"}},
    ]


HEALTHY_DOC = valid_docs()[1]
VICTIM_DOCS = [
    valid_docs()[0],
    {"zones": ["us-central1-a", "us-central1-b"], "machine_type": "n1-standard-8", "nodes": 3, "command": "x",
     "accelerators": {"type": "nvidia-tesla-t4", "count": 1}, "checkpoint": {"uri": f"gs://{CKPT_BUCKET}/run"}},
    {"zones": ["us-central1-a"], "machine_type": "n1-standard-8", "command": "x", "heartbeat_interval": "1s",
     "policy": {"max_runtime": "3650d", "max_instance_age": "3650d", "idle_timeout": "3650d", "startup_grace": "3650d",
                "zone_cooldown": "3650d", "backoff": {"initial": "3650d", "max": "3650d"}, "max_restarts": 0,
                "max_failures": 0, "crash_loop_failures": 1, "termination_action": "delete"}},
]

# -- hostile values --------------------------------------------------------------------------

HOSTILE_NAMES = [
    "../../etc/passwd", "a" * 300, "Bad Name", "x;rm -rf /", "$(reboot)", "`id`", "-rf", "", " ", "é", "\u202eevil",
    "null", "true", "0", "a/b", "a\nb", "a\x00b", "\U0001f600", "respawn-managed", "RESPAWN_JOB", "x" * 64,
]
HUGE_STRINGS = ["x" * 100_000, "\u00e9" * 50_000, "'" * 40_000, "\\" * 70_000, "a\n" * 40_000]
NUMBERS = [0, -1, 1, 2**31, 2**63, 2**64 + 1, 10**30, 10**300, -(10**300), 1.5, -0.0, 1e308, -1e308,
           float("inf"), float("-inf"), float("nan"), 1e-320]
DURATIONS = ["99999999999999d", "1e300", ".inf", "-5m", "0s", "1h30m", "3650d", "3651d", "1.5h", "7x", "9" * 80,
             "1d" * 30, " 90 s ", "\u0669\u0660m", "soon", "P1D", "00:30:00"]
TEXTS = ["", " ", "\t", "\x00", "\x1b[31m", "\u2028", "\ufeff", "\ud7ff", "\U0010ffff", "é", "\u202e", "${HOME}",
         "$(id)", "'; DROP TABLE", "%s%n", "{{7*7}}", "<script>", "gs://", "gs://b/../../x", "gs://UPPER/x"]
ENV_NAMES = ["RESUME_FROM", "NODE_RANK", "NODES", "MASTER_ADDR", "GCE_METADATA_HOST", "GCE_METADATA_IP",
             "STORAGE_EMULATOR_HOST", "RESPAWN_JOB", "RESPAWN_", "PATH", "LD_PRELOAD", "1BAD", "A-B", "a b", ""]


def hostile_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if roll < 0.22:
        return rng.choice(NUMBERS)
    if roll < 0.34:
        return rng.choice(DURATIONS)
    if roll < 0.50:
        return rng.choice(TEXTS + HOSTILE_NAMES)
    if roll < 0.56:
        return rng.choice(HUGE_STRINGS)
    if roll < 0.64:
        return rng.choice([None, True, False, [], {}, "", [None], {"": None}])
    if roll < 0.72:
        return _nested(rng, rng.choice([5, 40, 200]))
    if roll < 0.80 and depth < 3:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randint(1, 4))]
    if roll < 0.88 and depth < 3:
        return {_key(rng): hostile_value(rng, depth + 1) for _ in range(rng.randint(1, 4))}
    if roll < 0.94:
        return {rng.choice(ENV_NAMES): "x"}
    return rng.choice(["us-central1-a", "n1-standard-8", "a3-highgpu-8g", "nvidia-l4", "gs://b/p", "spot", "default",
                       "123-compute@developer.gserviceaccount.com", "other-proj", "elsewhere-proj"])


def _nested(rng: random.Random, depth: int) -> Any:
    value: Any = rng.choice(["x", 1, None])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def _key(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.5:
        return rng.choice(_ALL_FIELDS)
    if roll < 0.8:
        return _typo(rng, rng.choice(_ALL_FIELDS))
    return rng.choice(HOSTILE_NAMES + [1, 0, True])


_TOP = ["name", "project", "zones", "machine_type", "accelerators", "provisioning", "boot_disk", "service_account",
        "network", "labels", "command", "code", "env", "nodes", "checkpoint", "heartbeat_interval", "policy",
        "tpu", "notify", "placement"]
_NESTED = {
    "tpu": ["type", "runtime_version", "queued"],
    "notify": ["topic", "webhook"],
    "accelerators": ["type", "count"],
    "boot_disk": ["image", "image_family", "image_project", "size_gb", "type"],
    "service_account": ["email", "scopes"],
    "network": ["network", "subnetwork", "external_ip", "tags"],
    "checkpoint": ["uri", "format"],
    "policy": ["max_restarts", "max_failures", "max_runtime", "max_instance_age", "idle_timeout", "startup_grace",
               "backoff", "zone_cooldown", "crash_loop_failures", "termination_action", "fallback",
               "maintenance_timeout", "max_run_duration"],
    "fallback": ["wait", "stockouts", "step_up_after"],
}
# Issue 22's fields, made hostile by _mutate_issue22: TPU blocks, provisioning lists, fallbacks, notify.
TPU_TYPES = ["v4-8", "v5litepod-16", "v6e-256", "v5p-8192", "v4-0", "v4-", "-8", "V4-8", "v4-8 ", "v99-8", "v4-8/../x",
             "v5litepod-1e9", "v4-99999999999999999999", "tpu7x-8", ""]
RUNTIMES = ["tpu-ubuntu2204-base", "v2-alpha-tpuv5-lite", "", " ", "../x", "a" * 300, "tpu-vm-tf-2.16.0-pjrt\n",
            "$(id)"]
MODELS = ["spot", "standard", "flex-start", "SPOT", "preemptible", "flex_start", "", None, 1, "on-demand"]
WEBHOOKS = [
    "https://hooks.slack.com/services/T000/B000/XXXX", "http://hooks.slack.com/services/x", "https://evil.example/x",
    "https://hooks.slack.com.evil.example/x", "https://evil.example/hooks.slack.com", "https://user:pw@hooks.slack.com/x",
    "https://hooks.slack.com:8443/x", "https://localhost/x", "http://127.0.0.1:8080/x", "http://[::1]/x",
    "http://169.254.169.254/computeMetadata/v1/", "http://metadata.google.internal/x", "file:///etc/passwd",
    "gopher://hooks.slack.com/x", "javascript:alert(1)", "https://", "https:///x", "//hooks.slack.com/x",
    "hooks.slack.com/x", "https://hooks.slack.com/x\r\nX-Injected: 1", "https://hooks.slack.com/x#frag",
    "https://HOOKS.SLACK.COM/x", "https://hooks.slack.com./x", "https://xn--hoks-slack-9db.com/x",
    "https://hooks.slack.com/" + "a" * 10_000, "https://10.0.0.1/x", "https://[::ffff:127.0.0.1]/x", "", " ",
]
TOPICS = ["projects/respawn-proj/topics/respawn-events", "projects/elsewhere-proj/topics/x", "projects/respawn-proj/topics/",
          "projects//topics/x", "topics/x", "projects/respawn-proj/topics/" + "t" * 300, "projects/respawn-proj/topics/goog-x",
          "projects/respawn-proj/topics/a b", "projects/respawn-proj/subscriptions/x", ""]

_ALL_FIELDS = _TOP + [f for fs in _NESTED.values() for f in fs]


def _typo(rng: random.Random, word: str) -> str:
    if not word:
        return "x"
    i = rng.randrange(len(word))
    op = rng.randrange(4)
    if op == 0:
        return word[:i] + word[i + 1:] or "x"
    if op == 1:
        return word[:i] + rng.choice("abcdefghijklmnopqrstuvwxyz_-") + word[i:]
    if op == 2:
        return word.upper()
    return word[:i] + word[i:].replace("_", "-", 1)


# -- spec cases ---------------------------------------------------------------------------------

def spec_case(seed: int, index: int) -> Case:
    rng = rng_for(seed, "spec", index)
    doc = copy.deepcopy(rng.choice(valid_docs()))
    job = FUZZED
    steps = []
    for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 5])):
        steps.append(_mutate_doc(rng, doc))
    if rng.random() < 0.04:
        job = rng.choice(HOSTILE_NAMES[:8] + ["Fuzzed", "fuzzed-", "9fuzz", "f" * 51])
        steps.append(f"job name {job!r}")
    body, how = _render(rng, doc)
    steps.append(how)
    key = f"{names.JOBS_PREFIX}{job}/{names.SPEC}"
    return Case("spec", index, key, body, "; ".join(steps), setup=rng.random() < 0.15)


def _mutate_issue22(rng: random.Random, doc: dict[str, Any]) -> str:
    """A TPU block, a provisioning list with its fallback, or notification settings, made hostile
    (or valid-looking where the hostility is in how they combine)."""
    what = rng.randrange(5)
    if what == 0:
        tpu = doc["tpu"] = doc["tpu"] if isinstance(doc.get("tpu"), dict) else {}
        tpu["type"] = rng.choice(TPU_TYPES + [hostile_value(rng)])
        if rng.random() < 0.6:
            tpu["runtime_version"] = rng.choice(RUNTIMES + [hostile_value(rng)])
        if rng.random() < 0.5:
            tpu["queued"] = rng.choice([True, False, "yes", 1, None, hostile_value(rng)])
        if rng.random() < 0.3:
            doc["nodes"] = rng.choice([1, 2, 0, 64])  # a TPU with nodes, or a GPU shape beside it
        if rng.random() < 0.3:
            doc["accelerators"] = {"type": "nvidia-l4", "count": 1}
        return "tpu block"
    if what == 1:
        size = rng.choice([0, 1, 2, 3, 4, 8])
        models = [rng.choice(MODELS) for _ in range(size)]
        doc["provisioning"] = rng.choice([models, models[0] if models else "", ",".join(map(str, models)),
                                          {"spot": True}, ["spot", "spot"], ["spot", "standard", "flex-start"]])
        return "provisioning list"
    if what == 2:
        policy = doc["policy"] = doc["policy"] if isinstance(doc.get("policy"), dict) else {}
        fallback: dict[str, Any] = {}
        for key in rng.sample(["wait", "stockouts", "step_up_after", _key(rng)], rng.randint(0, 4)):
            fallback[key] = rng.choice(DURATIONS + NUMBERS + [None, "6h", 3, 0, -1, hostile_value(rng)])
        policy["fallback"] = rng.choice([fallback, fallback, None, [], "30m", hostile_value(rng)])
        if rng.random() < 0.3:
            policy[rng.choice(["max_run_duration", "maintenance_timeout"])] = rng.choice(DURATIONS + NUMBERS)
        return "policy.fallback"
    if what == 3:
        notify: dict[str, Any] = {}
        if rng.random() < 0.8:
            notify["webhook"] = rng.choice(WEBHOOKS + [hostile_value(rng)])
        if rng.random() < 0.5:
            notify["topic"] = rng.choice(TOPICS + [hostile_value(rng)])
        if rng.random() < 0.1:
            notify[_key(rng)] = hostile_value(rng)
        doc["notify"] = rng.choice([notify, notify, notify, None, [], rng.choice(WEBHOOKS), hostile_value(rng)])
        return "notify"
    doc["placement"] = rng.choice(["ordered", "capacity", "Capacity", "", None, "random", 1, hostile_value(rng)])
    return "placement"


def _mutate_doc(rng: random.Random, doc: dict[str, Any]) -> str:
    if rng.random() < 0.3:
        return _mutate_issue22(rng, doc)
    op = rng.randrange(9)
    field = rng.choice(_TOP)
    if op == 0:
        doc[field] = hostile_value(rng)
        return f"{field} = hostile"
    if op == 1 and field in _NESTED:
        inner = doc.get(field)
        if not isinstance(inner, dict):
            inner = doc[field] = {}
        sub = rng.choice(_NESTED[field])
        inner[sub] = hostile_value(rng)
        return f"{field}.{sub} = hostile"
    if op == 2:
        doc.pop(field, None)
        return f"drop {field}"
    if op == 3:
        typo = _typo(rng, field)
        if field in doc:
            doc[typo] = doc.pop(field)
        else:
            doc[typo] = hostile_value(rng)
        return f"typo {typo!r}"
    if op == 4:
        doc.setdefault("policy", {})
        if isinstance(doc["policy"], dict):
            name = rng.choice(["max_runtime", "max_instance_age", "idle_timeout", "startup_grace", "zone_cooldown"])
            doc["policy"][name] = rng.choice(DURATIONS + NUMBERS)
            return f"policy.{name} duration"
    if op == 5:
        env = doc.setdefault("env", {})
        if isinstance(env, dict):
            env[rng.choice(ENV_NAMES)] = rng.choice(TEXTS + HUGE_STRINGS[:2] + ["ok"])
            return "env"
    if op == 6:
        doc[_key(rng)] = hostile_value(rng)
        return "unknown field"
    if op == 7:
        doc["machine_type"] = rng.choice(["a3-highgpu-8g", "a2-megagpu-16g", "g2-standard-96", "a4x-highgpu-4g"])
        doc["accelerators"] = {"type": "nvidia-h100-80gb", "count": rng.choice([1, 8, 16])}
        doc["nodes"] = rng.choice([1, 2, 8, 64])
        return "built-in GPUs"
    doc[rng.choice(["project", "service_account"])] = rng.choice(
        ["elsewhere-proj", {"email": "default"}, {"email": "123-compute@developer.gserviceaccount.com"},
         {"email": "root@evil-proj.iam.gserviceaccount.com"}, "respawn-proj", {"email": None}])
    return "project or account"


def _render(rng: random.Random, doc: dict[str, Any]) -> tuple[bytes, str]:
    roll = rng.random()
    if roll < 0.45:
        return _dump(doc, rng), "yaml"
    if roll < 0.63:
        try:
            return json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass"), "json"
        except (TypeError, ValueError):
            return _dump(doc, rng), "yaml"
    if roll < 0.80:
        return _text_mutation(rng, _dump(doc, rng)), "yaml text mutated"
    return _special(rng)


def _dump(doc: Any, rng: random.Random) -> bytes:
    try:
        text = yaml.safe_dump(doc, default_flow_style=rng.random() < 0.3, allow_unicode=rng.random() < 0.5, width=80)
    except (yaml.YAMLError, ValueError):
        text = repr(doc)
    return text.encode("utf-8", "surrogatepass")


def _text_mutation(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randrange(len(data) + 1)
        if op == 0:
            data[pos:pos] = bytes([rng.randrange(256)])
        elif op == 1 and data:
            del data[pos:pos + rng.randint(1, 8)]
        elif op == 2:
            data[pos:pos] = rng.choice([b"\t", b"\x00", b": ", b"- ", b"&a ", b"*a", b"*b", b"!!python/object:os.system ",
                                        b"[", b"{", b"'", b'"', b"\n---\n", b"<<: *a\n", b"\xef\xbb\xbf", b"\xff"])
        elif op == 3:
            data = data[:pos]
        elif op == 4:
            lines = bytes(data).split(b"\n")
            i = rng.randrange(len(lines))
            lines.insert(i, lines[i])  # a key given twice
            data = bytearray(b"\n".join(lines))
        elif op == 5:
            data = bytearray(bytes(data).replace(b"  ", b"\t", 1))
        else:
            data[pos:pos] = b"\n" + b" " * rng.randrange(12) + b"x: &a [*a]\n"
    return bytes(data)


def _laughs(levels: int, width: int) -> bytes:
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return ("\n".join(lines) + "\nzones: [us-central1-a]\nmachine_type: n1-standard-8\ncommand: x\n").encode()


def _special(rng: random.Random) -> tuple[bytes, str]:
    specials: list[tuple[bytes, str]] = [
        (b"", "empty"), (b"\n\n", "blank"), (b"null", "null"), (b"~", "tilde"), (b"[]", "empty list"),
        (b"--- \n...\n", "empty document"), (b"42", "scalar"), (b'"just a string"', "string"),
        (b"[" * 100_000, "[ x 100000"), (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "deep json"),
        (b"- " * 60_000 + b"x", "deep block sequence"), (_laughs(10, 10), "billion laughs"),
        (_laughs(4, 10), "small laughs"), (b"a: &a [*a]\nb: &b {c: *b}\n", "alias cycles"),
        (b"x: " + b"y" * (300 * 1024), "over 256 KiB"), (b"x: " + b"y" * (250 * 1024), "just under 256 KiB"),
        (b"zones: [" + b"a," * 60_000 + b"]", "many elements"), (b"nodes: " + b"9" * 5000, "5000 digits"),
        (b"zones: !!set {a, b}\n", "set"), (b"a: !!python/object/apply:os.system [id]\n", "python tag"),
        (b"a: !!binary AAAA\n", "binary"), (b"a: !!timestamp 2001-13-45\n", "bad timestamp"),
        (b"---\na: 1\n---\nb: 2\n", "two documents"), (b"\xff\xfe" + "zones: [a]".encode("utf-16-le"), "utf-16"),
        (b"\xef\xbb\xbfzones: [us-central1-a]\nmachine_type: n1-standard-8\ncommand: x\n", "bom"),
        (b"\x80\x81\x82", "invalid utf-8"), (b"zones: [us-central1-a\n", "unclosed"), (b"{a: 1, a: 2}", "duplicate"),
        (b"? [1, 2]\n: 3\n", "complex key"), (b"{1: 2, null: 3, true: 4, 1.5: 5}", "non-string keys"),
        (b"%YAML 9.9\n---\na: 1\n", "bad directive"), (b"a: *undefined\n", "undefined alias"),
        (b"a: 1\n\tb: 2\n", "tab"), (bytes(range(256)), "all bytes"),
        (json.dumps({"zones": ["us-central1-a"], "machine_type": "n1-standard-8", "command": "x",
                     "nodes": 1e999, "policy": {"max_runtime": float("nan")}}).encode(), "json infinity"),
    ]
    return rng.choice(specials)


# -- VM record cases ---------------------------------------------------------------------------

def record_body(rng: random.Random) -> tuple[bytes, str]:
    roll = rng.random()
    if roll < 0.25:
        return rng.choice([
            (b"", "empty"), (b"garbage", "garbage"), (b"null", "null"), (b"[]", "list"), (b"{}", "empty object"),
            (b'{"attempt": 1e999}', "attempt 1e999"), (b'{"attempt": Infinity}', "Infinity"), (b"Infinity", "bare Infinity"),
            (b"NaN", "NaN"), (b"[" * 100_000, "[ x 100000"), (b'{"a":' * 100_000, "{ x 100000"),
            (b"\xff\xfe\x00", "bad utf-8"), (b'{"attempt": 1, "attempt": "x"}', "duplicate key"),
            (b"x" * (2 * 1024 * 1024), "2 MiB"), (b'{"attempt": 1, "exit_code": 0' + b" " * 100_000 + b"}", "padded"),
            (b"\xef\xbb\xbf{\"attempt\": 1, \"exit_code\": 0}", "bom"), (json.dumps({"attempt": 1}).encode("utf-16"), "utf-16"),
            (b'{"attempt": 1, "exit_code": 0, "instance": "' + b"\\ud800" + b'"}', "lone surrogate"),
            (b'{"attempt": 10000000000000000000000000000000000000000, "exit_code": 0}', "huge attempt"),
            (b'{"attempt": -1, "exit_code": 0}', "negative attempt"), (b'{"attempt": 1.5}', "fractional"),
            (b'{"attempt": true, "exit_code": false}', "booleans"), (b'{"attempt": "1", "exit_code": "0"}', "strings"),
            (b'{"attempt": [1], "exit_code": {"a": 1}}', "containers"), (b'{"attempt": 1, "exit_code": 1e999}', "exit 1e999"),
            (b'{"attempt": 1, "exit_code": -1e999}', "exit -1e999"), (b'{"attempt": 1, "exit_code": NaN}', "exit NaN"),
            (b'{"attempt": 1, "exit_code": 18446744073709551616}', "exit 2**64"),
        ])
    body: dict[str, Any] = {"attempt": 1, "instance": f"{VICTIM}-1", "exit_code": 0, "reason": "preempted", "node": 0}
    for field in rng.sample(sorted(body) + ["token", "at", _key(rng)], rng.randint(1, 3)):
        body[field] = rng.choice([hostile_value(rng), *NUMBERS, 1, 2, 0, None])
    try:
        return json.dumps(body).encode("utf-8", "surrogatepass"), "fields mutated"
    except (TypeError, ValueError):
        return repr(body).encode("utf-8", "surrogatepass"), "fields mutated (repr)"


def record_case(seed: int, index: int) -> Case:
    rng = rng_for(seed, "record", index)
    kind = rng.choice(["exit", "heartbeat", "marker"])
    job = VICTIM if rng.random() < 0.85 else rng.choice(["ghost", HEALTHY + "x", "Bad", "a" * 80, ".."])
    key = names.marker_key(job) if kind == "marker" else f"{names.JOBS_PREFIX}{job}/{kind}"
    body, how = record_body(rng)
    victim = rng.randrange(len(VICTIM_DOCS))
    return Case("record", index, key, body, f"{kind} for {job!r} (victim {victim}): {how}", setup=True, victim=victim)


# -- status.json cases --------------------------------------------------------------------------

def status_case(seed: int, index: int, template: dict[str, Any]) -> Case:
    """``template``: a real status.json of a running job, as a dict, to mutate."""
    rng = rng_for(seed, "status", index)
    key = names.status_key(VICTIM if rng.random() < 0.9 else rng.choice(["ghost", "Bad"]))
    victim = 0 if rng.random() < 0.6 else rng.randrange(len(VICTIM_DOCS))
    if rng.random() < 0.3:
        body, how = record_body(rng)
        return Case("status", index, key, body, f"garbage: {how}", setup=rng.random() < 0.7, victim=victim)
    status = copy.deepcopy(template)
    steps = []
    for _ in range(rng.randint(1, 4)):
        field = rng.choice(sorted(status) + ["history.0", "zone_cooldowns", "instance_ids", "unknown"])
        if field == "history.0" and isinstance(status.get("history"), list) and status["history"]:
            entry = status["history"][0]
            if isinstance(entry, dict):
                entry[rng.choice(sorted(entry))] = hostile_value(rng)
        elif field == "zone_cooldowns":
            status[field] = {rng.choice(["us-central1-a", "zz", ""]): rng.choice(["2026-01-01T00:00:00Z", 1e999, "x", None])}
        elif field == "instance_ids":
            status[field] = {rng.choice([f"{VICTIM}-1", "x"]): hostile_value(rng)}
        else:
            status[field] = rng.choice([hostile_value(rng), *_STATUS_VALUES.get(field, [])])
        steps.append(field)
    try:
        body = json.dumps(status).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        body = repr(status).encode("utf-8", "surrogatepass")
    return Case("status", index, key, body, "mutated " + ", ".join(steps), setup=rng.random() < 0.8, victim=victim)


_STATUS_VALUES: dict[str, list[Any]] = {
    "phase": ["PENDING", "PROVISIONING", "RUNNING", "RECOVERING", "SUCCEEDED", "FAILED", "CANCELLED", "running", "EXPLODED"],
    "attempt": [0, 1, 2, 999_999, 10**7, -1, 2**63],
    "project": ["respawn-proj", "elsewhere-proj", "", "../x"],
    "zone": ["us-central1-a", "us-central1-z", "europe-west4-a", "", "../../x"],
    "instances": [[f"{VICTIM}-1"], [f"{VICTIM}-2"], [], ["healthy-1"], ["x" * 100], [f"{VICTIM}-1"] * 1000],
    "inserted": [True, False],
    "placement": [0, 10**6, -1],
    "not_before": ["2026-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "yesterday"],
    "created_at": ["9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"],
    "started_at": ["9999-12-31T23:59:59+14:00", "0001-01-01T00:00:00-12:00"],
    "attempt_started_at": ["9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"],
    "history": [[], [{"at": "2026-01-01T00:00:00Z", "event": "x"}] * 5000],
    "resume_from": [{"uri": "gs://b/p", "step": 10**30}, {"uri": ""}, "gs://b/p"],
    "restarts": [10**9, -5], "failures": [10**9, -5], "stalled_failures": [10**9],
}
