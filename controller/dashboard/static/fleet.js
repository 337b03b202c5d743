// The fleet page: polls /api/jobs, keeps one row per job, sorts by a clicked header, filters by phase.
"use strict";
(() => {
  const table = document.getElementById("jobs");
  const body = table.tBodies[0];
  const filter = document.getElementById("phase-filter");
  const keys = [...table.tHead.rows[0].cells].map((th) => th.dataset.sort).filter((k) => k !== "job");
  let sortKey = null, ascending = true;

  function value(tr, key) {
    const cell = tr.querySelector(`td.${key}`);
    const raw = cell ? (cell.dataset.value ?? cell.textContent) : "";
    const number = Number(raw);
    return raw !== "" && !Number.isNaN(number) ? number : raw.toLowerCase();
  }

  function arrange() {
    const all = [...body.rows];
    if (sortKey) {
      all.sort((a, b) => {
        const x = value(a, sortKey), y = value(b, sortKey);
        const order = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : String(x).localeCompare(String(y));
        return ascending ? order : -order;
      });
      body.append(...all);
    }
    for (const tr of all) tr.hidden = Boolean(filter.value) && tr.dataset.phase !== filter.value;
    for (const th of table.tHead.rows[0].cells) {
      th.setAttribute("aria-sort", th.dataset.sort === sortKey ? (ascending ? "ascending" : "descending") : "none");
    }
  }

  function row(job) {
    let tr = [...body.rows].find((r) => r.dataset.job === job.job);
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
    }
    return tr;
  }

  function apply(data) {
    const seen = new Set();
    for (const job of data.jobs) {
      seen.add(job.job);
      const tr = row(job);
      tr.dataset.phase = job.phase;
      for (const key of keys) {
        const td = tr.querySelector(`td.${key}`);
        respawn.text(td, job.cells[key]);
        td.dataset.value = key in job.sort ? job.sort[key] : job.cells[key];
      }
    }
    for (const tr of [...body.rows]) if (!seen.has(tr.dataset.job)) tr.remove();
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

  for (const th of table.tHead.rows[0].cells) {
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
