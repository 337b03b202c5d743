// respawn dashboard: what both pages share. Text from the server is only ever set as textContent.
"use strict";
const respawn = (() => {
  // The printed address carries the dashboard's key (?token=...); its cookie holds it now, so the key
  // leaves the address bar (a shared screen, a copied link, the history).
  const address = new URL(location.href);
  if (address.searchParams.has("token")) {
    address.searchParams.delete("token");
    history.replaceState(history.state, "", address.pathname + address.search + address.hash);
  }
  const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;
  const token = meta("respawn-token");
  const interval = Math.max(1, Number(meta("respawn-interval")) || 5) * 1000;

  // Poll `url` every interval, one request at a time, and hand each answer to `apply` (the first
  // request at once with `{now: true}`, else after an interval).
  function poll(url, apply, failed, options) {
    const once = async () => {
      try {
        const answer = await fetch(url, {headers: {"Accept": "application/json"}, cache: "no-store"});
        if (!answer.ok) throw new Error(`${answer.status} ${answer.statusText}`);
        apply(await answer.json());
      } catch (error) {
        if (failed) failed(String(error));
      } finally {
        setTimeout(once, interval);
      }
    };
    setTimeout(once, options && options.now ? 0 : interval);
  }

  // POST with the page's token in a header (the server refuses any POST without it).
  async function post(url, body) {
    const answer = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json", "X-Respawn-Token": token},
                                     body: JSON.stringify(body || {})});
    let data = {};
    try { data = await answer.json(); } catch (error) { data = {error: `${answer.status} ${answer.statusText}`}; }
    return {ok: answer.ok, data};
  }

  function text(element, value) {
    if (element && element.textContent !== String(value)) element.textContent = String(value);
  }

  function rows(tbody, cells) {
    tbody.replaceChildren(...cells.map((row) => {
      const tr = document.createElement("tr");
      for (const cell of row) {
        const td = document.createElement("td");
        td.textContent = cell;
        tr.appendChild(td);
      }
      return tr;
    }));
  }

  return {poll, post, text, rows};
})();
