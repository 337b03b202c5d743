// The fleet page: polls /api/jobs, keeps one row per job, sorts by a clicked header, filters by phase.
// Linear in the jobs at each poll (10,000 rows included): rows are found in a Map by job, cells by
// index, and the DOM is touched only where a value changed.
"use strict";
(() => {
  const table = document.getElementById("jobs");
  const body = table.tBodies[0];
  const filter = document.getElementById("phase-filter");
  const headers = [...table.tHead.rows[0].cells];
  const keys = headers.map((th) => th.dataset.sort).filter((k) => k !== "job");
  const rows = new Map();  // job -> its <tr>; its cells: tr.cells[0] the name, tr.cells[1 + i] keys[i]
  for (const tr of body.rows) rows.set(tr.dataset.job, tr);
  let sortKey = null, ascending = true;

  function value(tr, key) {
    if (key === "job") return tr.dataset.job.toLowerCase();
    const cell = tr.cells[1 + keys.indexOf(key)];
    const raw = cell ? (cell.dataset.value ?? cell.textContent) : "";
    const number = Number(raw);
    return raw !== "" && !Number.isNaN(number) ? number : raw.toLowerCase();
  }

  function arrange() {
    const all = [...body.rows];
    if (sortKey) {
      const keyed = all.map((tr) => [value(tr, sortKey), tr]);
      keyed.sort(([x], [y]) => {
        const order = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : String(x).localeCompare(String(y));
        return ascending ? order : -order;
      });
      if (keyed.some(([, tr], i) => tr !== all[i])) body.append(...keyed.map(([, tr]) => tr));
    }
    for (const tr of all) {
      const hidden = Boolean(filter.value) && tr.dataset.phase !== filter.value;
      if (tr.hidden !== hidden) tr.hidden = hidden;
    }
    for (const th of headers) {
      th.setAttribute("aria-sort", th.dataset.sort === sortKey ? (ascending ? "ascending" : "descending") : "none");
    }
  }

  function row(job) {
    let tr = rows.get(job.job);
    if (!tr) {
      tr = document.createElement("tr");
      tr.dataset.job = job.job;
      const name = document.createElement("td");
      name.className = "job";
      const link = document.createElement("a");
      link.href = "/jobs/" + encodeURIComponent(job.job);
      link.textContent = job.job;
      name.appendChild(link);
      tr.appendChild(name);
      for (const key of keys) {
        const td = document.createElement("td");
        td.className = key;
        tr.appendChild(td);
      }
      body.appendChild(tr);
      rows.set(job.job, tr);
    }
    return tr;
  }

  function apply(data) {
    const seen = new Set();
    for (const job of data.jobs) {
      seen.add(job.job);
      const tr = row(job);
      if (tr.dataset.phase !== job.phase) tr.dataset.phase = job.phase;
      keys.forEach((key, i) => {
        const td = tr.cells[1 + i];
        respawn.text(td, job.cells[key]);
        const sorted = String(key in job.sort ? job.sort[key] : job.cells[key]);
        if (td.dataset.value !== sorted) td.dataset.value = sorted;
      });
    }
    for (const [job, tr] of rows) if (!seen.has(job)) { tr.remove(); rows.delete(job); }
    const totals = data.totals.text;
    respawn.text(document.getElementById("total-running"), totals.accelerators_running);
    respawn.text(document.getElementById("total-week"), totals.accelerator_hours_week);
    respawn.text(document.getElementById("total-goodput"), totals.goodput);
    respawn.text(document.getElementById("total-cost"), totals.cost);
    respawn.text(document.getElementById("total-saved"), totals.saved);
    const zones = document.getElementById("zones").tBodies[0];
    respawn.rows(zones, Object.entries(data.totals.zones).map(([zone, c]) => [zone, c.preemptions, c.stockouts]));
    document.getElementById("empty").hidden = data.jobs.length > 0;
    document.getElementById("problem").hidden = true;
    respawn.text(document.getElementById("updated"), data.updated);
    arrange();
  }

  for (const th of headers) {
    const sort = () => {
      ascending = sortKey === th.dataset.sort ? !ascending : true;
      sortKey = th.dataset.sort;
      arrange();
    };
    th.addEventListener("click", sort);
    th.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); } });
  }
  filter.addEventListener("change", arrange);
  respawn.poll("/api/jobs", apply, (error) => {
    const problem = document.getElementById("problem");
    problem.textContent = `not refreshed: ${error}`;
    problem.hidden = false;
  });
})();
