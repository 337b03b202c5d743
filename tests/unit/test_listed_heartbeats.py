"""A heartbeat judged on its listing (issue 40, part 2): the custom metadata its VM agent writes
with it makes the record its body would, but for the token, whose proof it carries instead; every
value is checked as the body's is, and anything the listing cannot say sends the pass to the body."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from controller.core.ports import BlobInfo
from controller.core.state import JobStatus, Standby
from controller.core.world import MAX_METADATA_BYTES, PROOF_KEY, Record, listing_metadata, token_proof

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOKEN = "s3cret-of-attempt-4"
BODY = {"instance": "job-4", "attempt": 4, "node": 0, "at": "2026-03-01T11:59:00.000Z", "token": TOKEN,
        "trainer_started": "2026-03-01T11:02:03.250Z", "step": 1200, "saved_step": 1100, "save_s": 0.41,
        "upload_s": 5.8}


def info(metadata: dict[str, Any] | None, size: int = 300) -> BlobInfo:
    return BlobInfo("bkt", "jobs/job/heartbeat", 17, NOW, size, metadata)


def status(attempt: int = 4, token: str | None = TOKEN) -> JobStatus:
    return JobStatus(attempt=attempt, attempt_token=token)


def standby(attempt: int, token: str) -> Standby:
    return Standby(attempt=attempt, project="p", zone="us-central1-a", instances=(f"job-{attempt}",), token=token,
                   provisioning="spot", since=NOW, until=NOW, cause="preemption notice from job-3")


def test_the_proof_is_the_tokens_sha256_in_hex_never_the_token():
    meta = listing_metadata(BODY)
    assert meta[PROOF_KEY] == hashlib.sha256(TOKEN.encode()).hexdigest() == token_proof(TOKEN)
    assert all(TOKEN not in value for value in meta.values()) and "token" not in meta


def test_a_heartbeat_judged_on_its_listing_is_the_one_its_body_gives_but_for_the_token():
    body = Record.parse(info(None), json.dumps(BODY).encode())
    listed = Record.listed(info(listing_metadata(BODY)))
    assert listed == replace(body, token=None, proof=token_proof(TOKEN))
    assert (listed.attempt, listed.step, listed.saved_step, listed.save_s, listed.upload_s) == (4, 1200, 1100, 0.41, 5.8)
    assert listed.trainer_started == datetime(2026, 3, 1, 11, 2, 3, 250000, tzinfo=UTC)


def test_a_listed_heartbeat_belongs_to_its_attempt_by_the_proof_of_its_token():
    listed = Record.listed(info(listing_metadata(BODY)))
    assert listed is not None and listed.belongs_to(status())
    assert not listed.belongs_to(status(token="another-attempts-secret")), "a wrong proof is not this attempt's"
    assert not listed.belongs_to(status(attempt=5)), "another attempt's"
    assert listed.belongs_to(status(token=None)), "a status from before tokens: the attempt decides, as for a body"


def test_a_listed_heartbeat_of_the_standby_belongs_to_the_standby_by_its_own_secret():
    listed = Record.listed(info(listing_metadata(BODY)))
    assert listed is not None and listed.belongs_to_standby(status(attempt=3, token="current").but(standby=standby(4, TOKEN)))
    other = standby(4, "the-standbys-own")
    assert not listed.belongs_to_standby(status(attempt=3, token="current").but(standby=other))


def test_a_proof_of_the_empty_token_proves_nothing():
    """A status whose token is empty has none a record can carry (a body's empty token is no token)."""
    forged = Record.listed(info({**listing_metadata(BODY), PROOF_KEY: token_proof("")}))
    assert forged is not None and not forged.belongs_to(status(token=""))
    assert not Record.parse(info(None), json.dumps({**BODY, "token": ""}).encode()).belongs_to(status(token=""))


GOOD = listing_metadata(BODY)


@pytest.mark.parametrize("metadata", [
    None, {},
    {k: v for k, v in GOOD.items() if k != PROOF_KEY},  # an older controller gave no token: no proof
    {**GOOD, PROOF_KEY: GOOD[PROOF_KEY].upper()},  # not as the agent writes it
    {**GOOD, PROOF_KEY: GOOD[PROOF_KEY][:63]},
    {**GOOD, PROOF_KEY: TOKEN},  # the secret itself is no proof
    {k: v for k, v in GOOD.items() if k != "attempt"},
    {**GOOD, "attempt": "1.5"}, {**GOOD, "attempt": '"4"'}, {**GOOD, "attempt": "-1"}, {**GOOD, "attempt": "1e99"},
    {**GOOD, "step": "not json"}, {**GOOD, "instance": "job-4"},  # a string must be its JSON text
    {**GOOD, "step": "[" * 5000 + "]" * 5000},  # deeper than the parser goes
    {**GOOD, "reason": "x" * MAX_METADATA_BYTES},  # more than GCS keeps: the body says it
    {**GOOD, "step": 1200},  # not a string: no listing of GCS's
])
def test_a_listing_that_cannot_say_sends_the_pass_to_the_body(metadata):
    assert Record.listed(info(metadata)) is None


def test_an_oversized_heartbeat_is_never_judged_on_its_listing():
    assert Record.listed(info(GOOD, size=65 * 1024)) is None  # the body rule (unreadable) decides it


@pytest.mark.parametrize("field, value", [
    ("step", 10**19), ("step", -1), ("step", 1.5), ("step", "12"), ("step", True), ("saved_step", float("inf")),
    ("save_s", 8 * 86400), ("save_s", -0.1), ("upload_s", float("nan")), ("save_s", "0.4"),
    ("trainer_started", "2026-03-01T11:02:03"), ("trainer_started", 1767225600), ("instance", "x" * 500),
    ("node", 10**7), ("instance", 7),
])
def test_a_garbage_value_in_the_listing_is_dropped_as_in_the_body_and_the_heartbeat_kept(field, value):
    body = {**BODY, field: value}
    listed = Record.listed(info(listing_metadata(body)))
    assert listed == replace(Record.parse(info(None), json.dumps(body).encode()), token=None, proof=token_proof(TOKEN))
    assert listed.belongs_to(status())


_VALUES = hs.one_of(hs.none(), hs.booleans(), hs.integers(min_value=-10**20, max_value=10**20),
                    hs.floats(allow_nan=True, allow_infinity=True), hs.text(max_size=40),
                    hs.sampled_from(["2026-03-01T11:02:03.250Z", "2026-03-01T13:02:03+02:00", "job-4"]),
                    hs.lists(hs.integers(), max_size=3))
_FIELDS = ("instance", "node", "exit_code", "reason", "saved", "trainer_started", "step", "save_s", "upload_s",
           "saved_step", "at")


@hs.composite
def _bodies(draw: Any) -> dict[str, Any]:
    """What a writer may put in a heartbeat: mostly a whole attempt and the right token (so that most
    examples reach the proof), else anything; each other field absent, sane, or anything."""
    body: dict[str, Any] = {}
    if draw(hs.integers(0, 9)) < 8:
        body["attempt"] = draw(hs.sampled_from([3, 4, 5, 4.0]))
    elif draw(hs.booleans()):
        body["attempt"] = draw(hs.one_of(hs.sampled_from(["4", -4, 10**10, 4.5, [4]]), _VALUES))
    if draw(hs.integers(0, 9)) < 7:
        body["token"] = TOKEN
    elif draw(hs.booleans()):
        body["token"] = draw(hs.sampled_from(["another-attempts-secret", "", "x" * 300, None, 7]))
    sane = {"instance": "job-4", "node": 0, "trainer_started": "2026-03-01T11:02:03.250Z", "step": 1200,
            "saved_step": 1100, "save_s": 0.41, "upload_s": 5.8, "at": "2026-03-01T11:59:00.000Z"}
    for key in _FIELDS:
        kind = draw(hs.integers(0, 2))
        if kind == 1 and key in sane:
            body[key] = sane[key]
        elif kind == 2:
            body[key] = draw(_VALUES)
    return body


@settings(max_examples=400, deadline=None)
@given(body=_bodies(), attempt=hs.sampled_from([3, 4, 5]), token=hs.sampled_from([TOKEN, "another-attempts-secret",
                                                                                 "", None]))
def test_any_heartbeat_a_writer_makes_is_judged_alike_from_its_listing_and_from_its_body(body, attempt, token):
    """Whatever a writer puts in a heartbeat (forged, garbage, oversized), written as the agent writes
    it: the listing either gives the body's record (its token's proof for its token) or defers to it."""
    from_body = Record.parse(info(None), json.dumps(body).encode())
    listed = Record.listed(info(listing_metadata(body)))
    judged = listed if listed is not None else from_body
    assert replace(judged, token=None, proof=None) == replace(from_body, token=None, proof=None)
    st = status(attempt, token)
    assert judged.belongs_to(st) == from_body.belongs_to(st)
    with_sb = status(1, "current").but(standby=standby(attempt, token or "sb"))
    assert judged.belongs_to_standby(with_sb) == from_body.belongs_to_standby(with_sb)
