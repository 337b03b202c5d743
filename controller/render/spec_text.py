"""A job's spec as respawn shows it to a person (the dashboard's job page and its JSON): the
user's own text, never a secret in it.

A spec's ``notify.webhook`` is a credential (whoever has the URL posts to the channel) that
respawn keeps out of ``status.json`` and every message (``controller.core.state.recorded_notify``),
and an ``env`` value whose name says it is one (``HF_TOKEN``, ``WANDB_API_KEY``,
``AWS_SECRET_ACCESS_KEY``) is one too. Each is replaced wherever the text has it (a webhook keeps
its scheme and host: which one, not its key), and so is any Slack webhook URL (in a comment, a
command). The text is shown only when it reads back as the spec with those values hidden;
otherwise (a value the text spells another way: an escape, a folded line; a secret too short to
replace safely in text) the spec is shown as respawn read it, written out again, its secrets
hidden. A spec that is not YAML respawn can read is not shown: it may hold a secret where no
field says so.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import yaml

from controller.core.spec import SpecError, load_document

REDACTED = "<redacted>"
# An env name's parts (split at "_") that say its value is a secret: HF_TOKEN, WANDB_API_KEY,
# AWS_SECRET_ACCESS_KEY, DB_PASSWORD; never TOKENIZERS_PARALLELISM.
SECRET_PARTS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "KEY", "APIKEY",
                          "AUTH"})
MIN_REPLACED = 8  # a secret this long is replaced wherever the text has it; a shorter one would garble the rest
_SLACK = re.compile(r"(https?://hooks\.slack\.com)/[^\s'\"|;,\]}]+")
_ORIGIN = re.compile(r"(https?://[^/?#\s]+)")
UNREADABLE = "(not shown: it is not YAML respawn can read, and may hold a secret)"
REWRITTEN = "# the spec as respawn read it, written out again with its secrets hidden\n"


def secret_env_name(name: str) -> bool:
    return any(part in SECRET_PARTS for part in name.upper().split("_"))


@functools.lru_cache(maxsize=64)  # each open job page polls its spec, which changes only at a submit
def shown(raw: bytes) -> str:
    """``raw`` as a person may see it: its text with every secret hidden (module docstring)."""
    try:
        doc = load_document(raw)
    except SpecError:
        return UNREADABLE
    masks = _secrets(doc)

    def hide(text: str) -> str:
        for value in sorted(masks, key=len, reverse=True):
            if len(value) >= MIN_REPLACED:
                text = text.replace(value, masks[value])
        return _SLACK.sub(rf"\1/{REDACTED}", text)

    hidden = _hidden(doc, masks, hide)
    text = hide(raw.decode("utf-8", "replace"))
    if _reads_as(text, hidden):
        return text
    try:
        return REWRITTEN + yaml.safe_dump(hidden, sort_keys=False, allow_unicode=True, default_flow_style=False)
    except yaml.YAMLError:
        return UNREADABLE


def _secrets(doc: Any) -> dict[str, str]:
    """Each secret value of the spec -> what is shown in its place."""
    found: dict[str, str] = {}
    if not isinstance(doc, dict):
        return found
    notify, env = doc.get("notify"), doc.get("env")
    if isinstance(notify, dict) and isinstance(webhook := notify.get("webhook"), str) and webhook:
        origin = _ORIGIN.match(webhook)
        found[webhook] = f"{origin[1]}/{REDACTED}" if origin else REDACTED
    if isinstance(env, dict):
        found.update({value: REDACTED for name, value in env.items()
                      if isinstance(name, str) and secret_env_name(name) and isinstance(value, str) and value})
    return found


def _hidden(doc: Any, masks: dict[str, str], hide: Callable[[str], str]) -> Any:
    """The document as it must read once shown: each secret field as ``masks`` says, whatever its
    length, and every other string as ``hide`` leaves it."""
    walked = _walk(doc, hide)
    if not isinstance(doc, dict):
        return walked
    notify, env = doc.get("notify"), doc.get("env")
    if isinstance(notify, dict) and notify.get("webhook") in masks:
        walked[hide("notify")][hide("webhook")] = masks[notify["webhook"]]
    if isinstance(env, dict):
        for name, value in env.items():
            if isinstance(value, str) and value in masks and isinstance(name, str) and secret_env_name(name):
                walked[hide("env")][hide(name)] = REDACTED
    return walked


def _walk(value: Any, hide: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return hide(value)
    if isinstance(value, dict):
        return {_walk(k, hide): _walk(v, hide) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, hide) for v in value]
    return value


def _reads_as(text: str, expected: Any) -> bool:
    try:
        return bool(load_document(text.encode("utf-8", "surrogatepass")) == expected)
    except SpecError:
        return False
