"""Issue 28's proof in a real browser: `respawn dashboard` against the local cloud, seen through headless
Chromium (Debian's package, driven by Playwright for Python).

`respawn local up` runs in the background with a home of its own (as in tests/integration/test_local_up.py);
a second terminal's environment (its exports) submits the demo's job (its zones, machine, Spot, the example
trainer, a checkpoint every 40 steps) at a pace that keeps it RUNNING for the whole test, and writes two
hostile specs straight into the bucket (as only someone with write access to it could): one whose zones are
markup, which the controller fails with a message quoting them, and one whose job name is markup. Then
`respawn dashboard --port 0 --interval 1 --no-open` runs with the same environment, and the browser:

- the fleet page lists the job with its phase, filters by phase, sorts, and polls (`#updated` changes);
- the job page draws its timeline, its ledger and its history;
- a preemption injected while the page is open (`respawn local preempt demo-1`) shows up without a reload
  (the page's own window object survives) within the polling interval of the bucket's change;
- cancel asks first (`#confirm-no` cancels nothing), then cancels (`#flash`, then CANCELLED);
- hostile names and messages are shown as text: no dialog fires, no injected element exists;
- every request the pages made went to 127.0.0.1; no page threw a script error;
- the address it prints carries its key: without it, a 403; with it, a cookie the pages' scripts cannot read
  carries it, and the key leaves the address bar.

Screenshots of both pages at 1280 and 390 pixels wide go to tests/browser/screenshots/ (git-ignored) or
$RESPAWN_SCREENSHOTS. Everything started here is stopped at the end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from controller.core import names
from controller.core.state import JobStatus, Phase
from controller.service.config import REPO_ROOT
from localcloud.gcs import client
from tests.browser.conftest import SCREENSHOTS
from tests.wait import Terminal, until

pytestmark = pytest.mark.timeout(300)

JOB = "demo"  # the demo's job: localcloud/demo.py's GpuDemo spec, at a pace that outlasts the test
INTERVAL = 1.0  # the dashboard's polling interval (--interval)
SLACK = 3.0  # what a poll may take on top of its interval on 2 shared CPUs: a read, a render, a paint
HOSTILE = "hostile"  # a valid name, its message markup: the controller quotes its zones in its error
HOSTILE_ZONES = ["<script>alert(1)</script>", "<img src=x onerror=alert(2)>"]
HOSTILE_NAME = "x<img src=y onerror=alert(3)>"  # no valid job name: only a write to the bucket makes it
DASHBOARD = [sys.executable, "-m", "controller.cli", "dashboard"]
WIDTHS = {1280: 800, 390: 844}  # a laptop, a phone
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         # A request to any host but 127.0.0.1 fails to resolve (it is still seen, and the test fails on it).
         "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]


# -- the local cloud, its jobs, the dashboard ----------------------------------------------------------------
@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`respawn local up` in its own process and home; the second terminal's environment (its exports)."""
    shell = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
    home, folder = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("respawn-local")
    shell.update(HOME=str(home), CLOUDSDK_CONFIG=str(home / "gcloud"), CLOUDSDK_CORE_DISABLE_PROMPTS="1",
                 COLUMNS="200")
    with Terminal([sys.executable, "-m", "controller.cli", "local", "up", "--tick", "2", "--preemption-notice", "5",
                   "--dir", str(folder)], shell, home) as up:
        yield {"env": {**shell, **up.exports()}, "home": home, "lines": up.lines}
        assert up.stop() == 0, "".join(up.lines)[-3000:]


def respawn(env: dict[str, str], *args: str, cwd: Path | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "controller.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=cwd, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"respawn {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout


@dataclass
class Fleet:
    env: dict[str, str]
    bucket: Any

    def status(self, job: str = JOB) -> JobStatus | None:
        blob = self.bucket.get_blob(names.status_key(job))
        return JobStatus.from_json(blob.download_as_bytes()) if blob else None

    def running(self, attempt: int) -> bool:
        st = self.status()
        return bool(st and st.phase == Phase.RUNNING and st.attempt == attempt and st.instances)


@pytest.fixture(scope="module")
def fleet(cloud: dict[str, Any]) -> Fleet:
    """The demo's job RUNNING (with a checkpoint), and the two hostile jobs FAILED."""
    env, home = cloud["env"], cloud["home"]
    spec = home / f"{JOB}.yaml"
    spec.write_text("zones: [us-central1-a, us-central1-b]\n"
                    "machine_type: g2-standard-8\n"
                    "provisioning: spot\n"
                    f"command: python {REPO_ROOT}/examples/trainer.py\n"
                    'env: {TRAIN_STEPS: "1000000", CHECKPOINT_EVERY: "40", STEP_SECONDS: "0.04"}\n'
                    f"checkpoint: {{uri: gs://{env['RESPAWN_BUCKET']}/checkpoints/{JOB}}}\n"
                    "heartbeat_interval: 2s\n")
    assert f"submitted {JOB}" in respawn(env, "submit", str(spec), cwd=home)
    bucket = client(env["STORAGE_EMULATOR_HOST"], env["RESPAWN_PROJECT"]).bucket(env["RESPAWN_BUCKET"])
    hostile = ("zones: [" + ", ".join(f'"{z}"' for z in HOSTILE_ZONES) + "]\nmachine_type: g2-standard-8\n"
               "command: python trainer.py\n")
    for job in (HOSTILE, HOSTILE_NAME):
        bucket.blob(names.spec_key(job)).upload_from_string(hostile)
    f = Fleet(env, bucket)
    until(f"{JOB} running", lambda: f.running(1), 90)
    until("a checkpoint", lambda: any(b.name.endswith("/_SUCCESS") for b in bucket.list_blobs(
        prefix=f"checkpoints/{JOB}/")), 60)
    for job in (HOSTILE, HOSTILE_NAME):
        final = until(f"{job!r} to fail", lambda: (s := f.status(job)) and s.phase.terminal and s, 60)
        assert final.phase == Phase.FAILED
    assert "<script>alert(1)</script>" in f.status(HOSTILE).message  # the markup reaches the status as is
    return f


@pytest.fixture(scope="module")
def dashboard(cloud: dict[str, Any], fleet: Fleet) -> Iterator[dict[str, Any]]:
    """`respawn dashboard --port 0 --interval 1 --no-open`: its URL (the one line it prints), until SIGINT."""
    process = subprocess.Popen([*DASHBOARD, "--port", "0", "--interval", str(INTERVAL), "--no-open"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cloud["env"],
                               cwd=cloud["home"], stdin=subprocess.DEVNULL, start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    first = threading.Event()

    def read(stream: Any, into: list[str], signal_first: bool) -> None:
        for line in stream:
            into.append(line)
            if signal_first:
                first.set()
        first.set()

    threading.Thread(target=read, args=(process.stdout, out, True), daemon=True).start()
    threading.Thread(target=read, args=(process.stderr, err, False), daemon=True).start()
    try:
        if not first.wait(60) or not out:
            pytest.fail(f"respawn dashboard printed nothing (exit {process.poll()}): {''.join(err)[-3000:]}")
        match = re.fullmatch(r"dashboard at ((http://127\.0\.0\.1:(\d+)/)\?token=([A-Za-z0-9_-]{43}))\n", out[0])
        assert match, f"the dashboard's line: {out[0]!r} (stderr: {''.join(err)[-1000:]})"
        entry, url, port, key = match.group(1), match.group(2), int(match.group(3)), match.group(4)
        assert port != 0
        until("the dashboard to answer", lambda: _answers(url, key), 30)
        assert requests.get(url, timeout=10).status_code == 403  # without its key: another account on this machine
        # entry: the address printed, its key in it; url: the address alone, which the key's cookie opens after
        yield {"url": url, "entry": entry, "key": key, "port": port, "out": out, "err": err, "process": process}
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=30)
        assert code in (0, -signal.SIGINT, 130), f"the dashboard exited {code} on SIGINT: {''.join(err)[-2000:]}"
        assert out == [out[0]], f"the dashboard printed more than its one line: {out}"
        with pytest.raises(requests.ConnectionError):
            requests.get(url, timeout=5)  # stopped: nothing listens any more
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def _answers(url: str, key: str) -> bool:
    try:
        return requests.get(url, params={"token": key}, timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


# -- the browser ----------------------------------------------------------------------------------------------
@dataclass
class Seen:
    """Everything the pages did that the test checks at the end."""
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # uncaught script errors and console errors
    failed: list[str] = field(default_factory=list)  # responses of 400 and more: "STATUS URL"


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[tuple[Any, Seen]]:
    """Headless Chromium (the system's) with a fresh profile; every request, dialog and script error recorded."""
    from playwright.sync_api import sync_playwright

    seen = Seen()
    with tempfile.TemporaryDirectory(prefix="respawn-chromium-") as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True, args=FLAGS,
                                                       viewport={"width": 1280, "height": 800})
        context.on("request", lambda r: seen.requests.append(r.url))
        context.on("response", lambda r: r.status >= 400 and seen.failed.append(f"{r.status} {r.url}"))

        def watch(page: Any) -> None:
            page.on("dialog", lambda d: (seen.dialogs.append(f"{d.type}: {d.message}"), d.dismiss()))
            page.on("pageerror", lambda e: seen.errors.append(f"{page.url}: {e}"))
            # A response of 400 or more is logged as a console error too: those are checked as responses.
            page.on("console", lambda m: m.type == "error" and not m.text.startswith("Failed to load resource")
                    and seen.errors.append(f"{page.url}: console: {m.text}"))

        context.on("page", watch)
        for page in context.pages:
            watch(page)
        try:
            yield context, seen
        finally:
            context.close()


@pytest.fixture(scope="module")
def page(browser: tuple[Any, Seen], dashboard: dict[str, Any]) -> Any:
    """The browser's tab, let in once by the address printed: its cookie carries the key to every page after."""
    context, _ = browser
    tab = context.pages[0] if context.pages else context.new_page()
    tab.goto(dashboard["entry"])
    return tab


def shoot(page: Any, name: str) -> dict[int, Path]:
    """The whole page at each width, as a window that tall shows it. (Not Playwright's full_page: Chromium lays a
    page out anew for it, and a table there can come out other than the window shows it.)"""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shots: dict[int, Path] = {}
    for width, height in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        for _ in range(3):  # the height the page takes at this width (a taller window may reflow it)
            page.wait_for_timeout(300)  # a reflow, and a poll's repaint if one lands
            tall = max(height, min(8000, page.evaluate("document.documentElement.scrollHeight")))
            if tall == page.viewport_size["height"]:
                break
            page.set_viewport_size({"width": width, "height": tall})
        shots[width] = SCREENSHOTS / f"{name}-{width}.png"
        page.screenshot(path=str(shots[width]))
        assert shots[width].stat().st_size > 5000, shots[width]
    page.set_viewport_size({"width": 1280, "height": 800})
    return shots


def overflow(page: Any, width: int) -> int:
    """How many pixels the document scrolls sideways at ``width`` (0: it fits)."""
    page.set_viewport_size({"width": width, "height": WIDTHS[width]})
    page.wait_for_timeout(200)
    extra = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    page.set_viewport_size({"width": 1280, "height": 800})
    return int(extra)


def rows(page: Any, visible_only: bool = False) -> list[str]:
    return page.evaluate("""(visibleOnly) => [...document.querySelectorAll('#jobs tr[data-job]')]
        .filter(r => !visibleOnly || (r.offsetParent !== null && getComputedStyle(r).visibility !== 'hidden'))
        .map(r => r.dataset.job)""", visible_only)


def cell(page: Any, job: str, name: str) -> str:
    return page.evaluate("""([job, name]) => {
        const row = [...document.querySelectorAll('#jobs tr[data-job]')].find(r => r.dataset.job === job);
        const c = row && row.querySelector('.' + name);
        return c ? c.innerText.trim() : null; }""", [job, name])


# -- the tests, in the order a user meets them ----------------------------------------------------------------
def test_the_address_printed_lets_the_browser_in_its_key_leaves_the_address_bar_and_no_script_reads_it(
        dashboard, browser, page):
    context, _ = browser
    response = page.goto(dashboard["entry"])
    assert response.status == 200
    page.wait_for_selector("#jobs tr[data-job]")
    assert page.url == dashboard["url"]  # the key out of the address bar (and the history)
    assert page.evaluate("document.cookie") == ""  # HttpOnly: no script of any page reads it
    (cookie,) = [c for c in context.cookies(dashboard["url"]) if c["name"] == f"respawn-dashboard-{dashboard['port']}"]
    assert cookie["value"] == dashboard["key"] and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/"
    page.reload()  # the address without its key: the cookie carries it
    page.wait_for_selector("#jobs tr[data-job]")


def test_the_fleet_page_lists_the_job_with_its_phase_filters_sorts_and_polls(dashboard, fleet, page):
    page.goto(dashboard["url"])
    page.wait_for_selector("#jobs tr[data-job]")
    assert {JOB, HOSTILE, HOSTILE_NAME} <= set(rows(page)), rows(page)
    assert cell(page, JOB, "phase") == "RUNNING"
    for name in ("attempt", "zone", "step", "age", "goodput", "cost", "event"):
        assert cell(page, JOB, name) is not None, f"the job's row has no .{name} cell"
    assert cell(page, JOB, "attempt").startswith("1")
    assert "us-central1-a" in cell(page, JOB, "zone")
    assert cell(page, HOSTILE, "phase") == "FAILED"

    # Filtering by phase: RUNNING shows the demo's job alone, FAILED the two others, "" all three.
    page.select_option("#phase-filter", "RUNNING")
    until("the RUNNING filter", lambda: rows(page, visible_only=True) == [JOB], 10)
    page.select_option("#phase-filter", "FAILED")
    until("the FAILED filter", lambda: set(rows(page, visible_only=True)) == {HOSTILE, HOSTILE_NAME}, 10)
    page.select_option("#phase-filter", "")
    until("no filter", lambda: {JOB, HOSTILE, HOSTILE_NAME} <= set(rows(page, visible_only=True)), 10)

    # Sorting by phase groups the rows by phase; clicking again turns the groups around.
    assert page.locator("th[data-sort]").count() >= 3
    header = page.locator('th[data-sort="phase"]')
    assert header.count() == 1, "no th[data-sort=phase]"

    def grouped() -> list[str]:
        phases = [cell(page, job, "phase") for job in rows(page, visible_only=True)]
        return [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]

    header.click()
    once = until("the rows grouped by phase", lambda: (g := grouped()) and len(g) == len(set(g)) and g, 10)
    header.click()
    until("the groups turned around", lambda: grouped() == once[::-1], 10)

    # The page polls: #updated changes within the interval (and a poll's time).
    before = page.inner_text("#updated")
    page.wait_for_function("(b) => document.querySelector('#updated').innerText !== b", arg=before,
                           timeout=(2 * INTERVAL + SLACK) * 1000)
    shoot(page, "fleet")


def timeline_drawn(page: Any) -> bool:
    return page.evaluate("""() => {
        const t = document.querySelector('#timeline');
        if (!t) return false;
        const img = t.tagName === 'IMG' ? t : t.querySelector('img');
        if (img) return img.complete && img.naturalWidth > 0;
        const svg = t.tagName.toLowerCase() === 'svg' ? t : t.querySelector('svg');
        return !!svg && svg.getBoundingClientRect().width > 0 && svg.querySelectorAll('*').length > 0; }""")


def history(page: Any) -> list[str]:
    return page.evaluate("[...document.querySelectorAll('#history > li')].map(li => li.innerText.trim())")


def test_the_job_page_draws_its_timeline_ledger_and_history(dashboard, fleet, page):
    page.goto(f"{dashboard['url']}jobs/{JOB}")
    assert page.inner_text("h1").strip().startswith(JOB)
    page.wait_for_selector("#timeline")
    until("the timeline drawn", lambda: timeline_drawn(page), 15)
    assert page.locator("table#ledger").count() == 1 and page.locator("#ledger tr").count() >= 1
    assert len(history(page)) >= 2, history(page)  # submitted (or pending), then running at least
    assert page.inner_text("#phase").strip() == "RUNNING"
    # Its current run's last lines from the local Cloud Logging, as `respawn logs` prints them (the demo trainer's
    # steps), read once the page asks for them, and the command that prints them all.
    assert page.inner_text("#logs-command").strip() == f"respawn logs {JOB} --follow"
    page.wait_for_function("() => /trainer: step \\d+/.test(document.querySelector('#logs').innerText)",
                           timeout=30_000)
    lines = page.inner_text("#logs").splitlines()
    assert 1 <= len(lines) <= 40, lines
    stepped = [line for line in lines if re.fullmatch(rf"\d\d-\d\d \d\d:\d\d:\d\d {JOB}-1 .*trainer: step \d+ loss \S+", line)]
    assert stepped, lines
    keyed = {"Authorization": f"Bearer {dashboard['key']}"}  # as a scraper sends it
    api = requests.get(f"{dashboard['url']}api/jobs/{JOB}", headers=keyed, timeout=10)
    assert api.status_code == 200 and api.headers["content-type"].startswith("application/json")
    listed = requests.get(f"{dashboard['url']}api/jobs", headers=keyed, timeout=10)
    assert listed.status_code == 200 and JOB in listed.text


def test_a_preemption_shows_up_without_a_reload_within_the_polling_interval(dashboard, fleet, page):
    page.goto(f"{dashboard['url']}jobs/{JOB}")
    until("the timeline drawn", lambda: timeline_drawn(page), 15)
    before = history(page)
    page.evaluate("window.__notReloaded = true")  # gone if the page reloads or navigates
    status = fleet.status()
    assert status and status.phase == Phase.RUNNING
    [instance] = status.instances
    events = len(status.history)
    assert "preempted" in respawn(fleet.env, "local", "preempt", instance)
    # The bucket's first change after the preemption, then the page's: no more than a poll apart.
    until("the controller to record the preemption", lambda: len(fleet.status().history) > events, 60)
    changed = time.monotonic()
    page.wait_for_function("(n) => document.querySelectorAll('#history > li').length > n", arg=len(before),
                           timeout=(INTERVAL + SLACK) * 1000)
    lag = time.monotonic() - changed
    assert page.evaluate("window.__notReloaded === true"), "the page reloaded"
    print(f"the preemption reached the page {lag:.2f} s after the bucket")  # shown with -s
    assert lag <= INTERVAL + SLACK, lag
    # Then it runs again, attempt 2, and the page follows it there.
    until("attempt 2 running", lambda: fleet.running(2), 90)
    page.wait_for_function("() => document.querySelector('#phase').innerText.trim() === 'RUNNING'",
                           timeout=(INTERVAL + SLACK) * 1000)
    after = history(page)
    assert any("preempt" in line.lower() for line in after[len(before):]), after
    assert page.evaluate("window.__notReloaded === true"), "the page reloaded"
    until("the timeline drawn", lambda: timeline_drawn(page), 15)
    shoot(page, "job")


def test_cancel_asks_first_then_cancels(dashboard, fleet, page):
    page.goto(f"{dashboard['url']}jobs/{JOB}")
    page.wait_for_selector("#cancel")
    cancel_key = names.cancel_key(JOB)
    # Asked, and declined: nothing is cancelled.
    page.click("#cancel")
    page.wait_for_selector("dialog#confirm[open]")
    page.click("#confirm-no")
    page.wait_for_selector("dialog#confirm:not([open])", state="attached")
    page.wait_for_timeout(1000)
    assert fleet.bucket.get_blob(cancel_key) is None, "declining the confirmation cancelled the job"
    assert fleet.status().phase != Phase.CANCELLED
    # Asked, and accepted.
    page.click("#cancel")
    page.wait_for_selector("dialog#confirm[open]")
    page.click("#confirm-yes")
    page.wait_for_function("() => (document.querySelector('#flash') || {innerText: ''}).innerText"
                           ".includes('cancel requested')", timeout=10_000)
    until("the cancel request in the bucket", lambda: fleet.bucket.get_blob(cancel_key) is not None, 10)
    until("the job CANCELLED", lambda: fleet.status().phase == Phase.CANCELLED, 60)
    page.wait_for_function("() => document.querySelector('#phase').innerText.trim() === 'CANCELLED'",
                           timeout=(INTERVAL + SLACK) * 1000)
    # Nothing is left to cancel: the button is disabled, and says why.
    page.wait_for_function("() => document.querySelector('#cancel').disabled", timeout=(INTERVAL + SLACK) * 1000)
    assert "nothing to cancel" in page.get_attribute("#cancel", "title")


def test_hostile_names_and_messages_are_text_in_every_page(dashboard, fleet, page, browser):
    _, seen = browser
    page.goto(dashboard["url"])
    page.wait_for_selector("#jobs tr[data-job]")
    page.wait_for_timeout((2 * INTERVAL + 1) * 1000)  # a poll or two redraws the rows: they are checked too
    assert HOSTILE_NAME in rows(page)  # the attribute holds the name as is
    assert HOSTILE_NAME in page.inner_text("#jobs")  # shown as the text it is
    pages = [f"{dashboard['url']}jobs/{HOSTILE}", f"{dashboard['url']}jobs/{urllib.parse.quote(HOSTILE_NAME)}"]
    texts = []
    for url in pages:
        response = page.goto(url)
        page.wait_for_timeout((2 * INTERVAL + 1) * 1000)
        texts.append(page.inner_text("body") if response.status == 200 else "")
        assert response.status in (200, 404), (url, response.status)
        # No element the markup would make exists (the server's Content-Security-Policy would stop an inline
        # script running: escaping is checked here on its own, as the DOM shows it).
        injected = page.evaluate("""() => [...document.querySelectorAll('img')].filter(i => /^(x|y)$/.test(
            i.getAttribute('src'))).length + [...document.querySelectorAll('script')].filter(s =>
            /^alert\\(\\d\\)$/.test(s.textContent.trim())).length""")
        assert injected == 0, f"{url}: the hostile markup made elements"
        if url == pages[0]:
            shoot(page, "hostile")  # the message as text, in the page's layout
    assert "<script>alert(1)</script>" in texts[0], texts[0][:2000]  # the message, shown as text
    assert texts[1] == "" or HOSTILE_NAME in texts[1]
    assert seen.dialogs == [], seen.dialogs


def test_the_pages_fit_a_phone(dashboard, page):
    """At 390 pixels the document does not scroll sideways (a wide table scrolls in its own box), and a job's
    name in the fleet table stays on one line (not broken a letter or two per line)."""
    wide = {}
    for url in (dashboard["url"], f"{dashboard['url']}jobs/{JOB}"):
        page.goto(url)
        page.wait_for_load_state("load")
        page.wait_for_timeout(500)
        wide[url] = overflow(page, 390)
    page.goto(dashboard["url"])
    page.wait_for_selector("#jobs tr[data-job]")
    page.set_viewport_size({"width": 390, "height": WIDTHS[390]})
    page.wait_for_timeout(300)
    lines = page.evaluate("""(jobs) => Object.fromEntries(jobs.map(job => {
        const row = [...document.querySelectorAll('#jobs tr[data-job]')].find(r => r.dataset.job === job);
        const name = row && [...row.querySelectorAll('a, td')].find(e => e.innerText.trim() === job);
        if (!name) return [job, null];
        const range = document.createRange(); range.selectNodeContents(name);
        const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        return [job, tops.size]; }))""", [JOB, HOSTILE])
    page.set_viewport_size({"width": 1280, "height": 800})
    problems = [f"the document scrolls sideways at 390 px (pixels): {wide}"] * any(v > 1 for v in wide.values())
    problems += [f"lines a job's name takes in the fleet table at 390 px: {lines}"] * (lines != {JOB: 1, HOSTILE: 1})
    assert problems == []


def test_the_fleet_table_fits_a_laptop(dashboard, page):
    """At 1280 pixels every column of the fleet table is in view, the last event included: a long message wraps
    in its cell, it does not push the table out of its box."""
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(dashboard["url"])
    page.wait_for_selector("#jobs tr[data-job]")
    page.wait_for_timeout(500)
    box = page.evaluate("""() => {
        const t = document.querySelector('#jobs'), r = t.getBoundingClientRect();
        let p = t.parentElement;
        while (p && p !== document.body && !/(auto|scroll|hidden)/.test(getComputedStyle(p).overflowX)) p = p.parentElement;
        const clip = p && p !== document.body ? p.getBoundingClientRect().right : document.documentElement.clientWidth;
        return {table: Math.round(r.right), clip: Math.round(clip)}; }""")
    assert box["table"] <= box["clip"] + 1, f"the fleet table is cut off at 1280 px (right edges): {box}"


def test_every_request_went_to_127_0_0_1_and_no_script_failed(dashboard, browser, page):
    _, seen = browser
    for url in (dashboard["url"], f"{dashboard['url']}jobs/{JOB}"):  # both pages at least, whatever ran before
        page.goto(url)
        page.wait_for_load_state("load")
        page.wait_for_timeout((INTERVAL + 1) * 1000)  # a poll's requests too
    assert seen.requests, "no request recorded"
    outside = [u for u in seen.requests
               if urllib.parse.urlsplit(u).scheme not in ("data", "blob", "about")
               and urllib.parse.urlsplit(u).hostname != "127.0.0.1"]
    assert outside == [], outside
    assert seen.errors == [], seen.errors
    assert seen.dialogs == [], seen.dialogs
    # Only what may be missing may fail: the page of a job whose name is no job name, and a favicon.
    assert [f for f in seen.failed if not f.endswith("/favicon.ico") and "/jobs/x%3C" not in f] == [], seen.failed
