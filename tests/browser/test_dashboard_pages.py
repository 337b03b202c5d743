"""The dashboard's pages in a real browser over the in-memory fakes (no local cloud): the fleet page
stays responsive with thousands of jobs, and resubmit sends the spec its dialog was opened on."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from werkzeug.serving import make_server

from controller.core import names
from controller.dashboard.guard import Guard
from controller.dashboard.server import create_app
from controller.dashboard.snapshot import Fleet, Snapshot
from controller.service.jobs import Jobs
from tests.harness import BUCKET, Harness, spec_doc

pytestmark = pytest.mark.timeout(180)

INTERVAL = 1.0


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(fleet, path)``: the dashboard over ``fleet`` on a free loopback port; the address of ``path``
    there with its key, as ``respawn dashboard`` prints it."""
    servers = []

    def start(fleet: Fleet, path: str) -> str:
        guard = Guard()
        server = make_server("127.0.0.1", 0, create_app(fleet, guard, INTERVAL), threaded=True)
        guard.bound("127.0.0.1", server.server_port)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}{path}?token={guard.key}"
    yield start
    for server in servers:
        server.shutdown()


@pytest.fixture
def page(chromium: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser.new_page()
        finally:
            browser.close()


def _running(h: Harness, job: str = "train") -> None:
    h.submit(job)
    h.tick()
    h.tick()


def test_the_fleet_page_stays_answerable_and_leaves_unchanged_rows_untouched_while_polling_10000_jobs(serve, page):
    """Behaviour, not a figure: a poll writes only the cells whose values changed (a running job's age and
    cost; no row added, moved or rebuilt), and the page keeps answering through the polls. The bound is a sanity bound far above
    the page as it is and far below the page as it was: a poll that found each row by a scan and rewrote
    every cell blocked the main thread 13 s at 10,000 jobs."""
    h = Harness()
    _running(h)
    fleet = Fleet(Jobs(h.store, BUCKET, h.policy), INTERVAL)
    one = fleet.snapshot()
    view = one.jobs["train"]
    many = Snapshot({f"job-{i:05d}": dataclasses.replace(view, row=dataclasses.replace(view.row, job=f"job-{i:05d}"))
                     for i in range(10_000)}, one.at)
    fleet.snapshot = lambda: many
    # Counts the answers handed to the page's poll: the poll applies one in the microtasks that follow,
    # so any later task (a page.evaluate) runs after it was applied.
    page.add_init_script("""(() => {
        window.delivered = 0;
        const fetched = window.fetch;
        window.fetch = async (...args) => {
            const answer = await fetched(...args);
            const json = answer.json.bind(answer);
            answer.json = async () => { const data = await json(); window.delivered += 1; return data; };
            return answer;
        };
    })()""")
    page.goto(serve(fleet, "/"))
    assert page.locator("#jobs tbody tr").count() == 10_000
    page.wait_for_function("() => window.delivered >= 1")
    # Every write inside the table, by the cell it touched ("rows" for rows added, removed or moved).
    page.evaluate("""() => {
        window.written = {};
        const body = document.querySelector('#jobs tbody');
        new MutationObserver((records) => {
            for (const r of records) {
                const node = r.target.nodeType === Node.ELEMENT_NODE ? r.target : r.target.parentElement;
                const cell = r.target === body ? 'rows' : (node.closest('td') || node).className || node.nodeName;
                window.written[cell] = (window.written[cell] || 0) + 1;
            }
        }).observe(body, {subtree: true, childList: true, attributes: true, characterData: true});
    }""")
    seen, worst = page.evaluate("window.delivered"), 0.0
    while True:  # three more polls of 10,000 unchanged rows
        asked = time.monotonic()
        delivered = page.evaluate("window.delivered")
        worst = max(worst, time.monotonic() - asked)
        if delivered >= seen + 3:
            break
        time.sleep(0.05)
    # A running job's age and cost advance with the clock; nothing else in its row changed.
    written = page.evaluate("window.written")
    assert set(written) <= {"age", "cost"}, f"polls rewrote what had not changed: {written}"
    assert worst < 3.0, f"the page's main thread was blocked {worst:.2f} s"
    page.click("th[data-sort=job]")
    page.click("th[data-sort=job]")  # descending
    assert page.locator("#jobs tbody tr").first.get_attribute("data-job") == "job-09999"


def test_resubmit_sends_the_spec_generation_shown_when_clicked_not_one_a_poll_brought_since(serve, page):
    h = Harness()
    _running(h)
    fleet = Fleet(Jobs(h.store, BUCKET, h.policy), INTERVAL)
    page.goto(serve(fleet, "/jobs/train"))
    page.click("#resubmit")  # the dialog opens on the spec shown
    h.submit("train", spec_doc(command="python train.py --teammates-fix"))  # a teammate's, while it is open
    teammates = h.store.read(BUCKET, names.spec_key("train")).info.generation
    deadline = time.monotonic() + 10
    while page.get_attribute("#job", "data-spec-generation") != str(teammates):  # a poll brings it behind the dialog
        assert time.monotonic() < deadline, "no poll brought the teammate's spec generation"
        time.sleep(0.1)
    page.click("#confirm-yes")
    page.wait_for_selector("#flash:not([hidden])")
    assert "changed" in page.text_content("#flash")
    assert h.store.read(BUCKET, names.spec_key("train")).info.generation == teammates


def test_a_browser_opened_on_the_forwarding_page_gets_in_and_its_links_and_polls_stay_in(serve, page):
    """``respawn dashboard`` opens the browser on a file that forwards to the address (never the key on a command
    line): a navigation from a file:// page, which is another site's, so the cookie it sets (SameSite=Strict)
    must still carry the key to the page's polls and to the links followed from it."""
    from controller.dashboard import serving

    h = Harness()
    _running(h)
    fleet = Fleet(Jobs(h.store, BUCKET, h.policy), INTERVAL)
    entry = serve(fleet, "/")
    opener = serving.forwarding_page(entry)
    statuses: list[tuple[int, str]] = []
    page.on("response", lambda r: statuses.append((r.status, r.url)))
    page.goto(opener.as_uri())
    page.wait_for_selector('#jobs tr[data-job="train"]')
    # Forwarded, the key then out of the address bar: the page's script takes it out once it ran,
    # which on a loaded machine can come after the row is drawn.
    page.wait_for_url(entry.partition("?")[0], timeout=10_000)
    assert page.url == entry.partition("?")[0]
    polled = len([s for s in statuses if "/api/jobs" in s[1]])
    deadline = time.monotonic() + 10 * INTERVAL
    while len([s for s in statuses if "/api/jobs" in s[1]]) <= polled:  # a poll, with the cookie alone
        assert time.monotonic() < deadline, "no poll"
        page.wait_for_timeout(100)
    page.click('#jobs tr[data-job="train"] a')
    page.wait_for_selector("#timeline")
    assert [s for s in statuses if s[0] >= 400 and not s[1].endswith("/favicon.ico")] == []
