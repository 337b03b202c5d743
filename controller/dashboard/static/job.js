// A job's page: polls /api/jobs/JOB (phase, tables, history, timeline), and cancel / resubmit behind a dialog.
"use strict";
(() => {
  const main = document.getElementById("job");
  const dialog = document.getElementById("confirm");
  const flash = document.getElementById("flash");
  let pending = null;

  function say(message, bad) {
    flash.textContent = message;
    flash.className = bad ? "problem" : "done";
    flash.hidden = false;
  }

  function apply(data) {
    respawn.text(document.getElementById("phase"), data.phase);
    respawn.text(document.getElementById("attempt"), data.attempt);
    respawn.text(document.getElementById("updated"), data.updated);
    const summary = document.querySelector("#summary tbody");
    summary.replaceChildren(...data.facts.map(([what, figure]) => {
      const tr = document.createElement("tr");
      const th = document.createElement("th");
      th.textContent = what;
      const td = document.createElement("td");
      td.textContent = figure;
      tr.append(th, td);
      return tr;
    }));
    respawn.rows(document.querySelector("#ledger tbody"), data.attempts);
    respawn.rows(document.querySelector("#losses tbody"), data.losses);
    const history = document.getElementById("history");
    history.replaceChildren(...data.history.map((event) => {
      const li = document.createElement("li");
      li.textContent = event.text;
      return li;
    }));
    if (String(data.status_generation) !== main.dataset.statusGeneration && data.status_generation) {
      main.dataset.statusGeneration = String(data.status_generation);
      document.getElementById("timeline").src = `${main.dataset.timeline}?g=${data.status_generation}`;
    }
    main.dataset.specGeneration = data.spec_generation ?? "";
    respawn.text(document.getElementById("spec"), data.spec ?? "(no spec in the bucket)");
    document.getElementById("resubmit").disabled = !data.spec;
    const cancel = document.getElementById("cancel");
    cancel.disabled = Boolean(data.cancel_refused);
    if (data.cancel_refused) cancel.title = data.cancel_refused; else cancel.removeAttribute("title");
  }

  // The last log lines (the server reads Cloud Logging at most every data.every seconds per job).
  function logs(data) {
    const pre = document.getElementById("logs");
    const bottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 8;  // following the end: stay there
    respawn.text(pre, data.lines.length ? data.lines.join("\n") + "\n" : (data.note || ""));
    pre.className = data.lines.length ? "" : "note";
    respawn.text(document.getElementById("logs-read"), data.read_at || "not yet");
    if (bottom) pre.scrollTop = pre.scrollHeight;
  }

  function ask(question, action) {
    pending = action;
    document.getElementById("confirm-text").textContent = question;
    dialog.showModal();
  }

  const name = document.querySelector("h1").textContent;
  document.getElementById("cancel").addEventListener("click", () =>
    ask(`Cancel ${name}? Its VMs are deleted; its checkpoints are kept.`,
        () => respawn.post(main.dataset.cancel)));
  document.getElementById("resubmit").addEventListener("click", () => {
    const shown = Number(main.dataset.specGeneration);  // the spec on screen when asked, not at the confirm
    ask(`Resubmit ${name} with --replace, from the spec shown below?`,
        () => respawn.post(main.dataset.resubmit, {spec_generation: shown}));
  });
  document.getElementById("confirm-no").addEventListener("click", () => { pending = null; dialog.close(); });
  document.getElementById("confirm-yes").addEventListener("click", async () => {
    const action = pending;
    pending = null;
    dialog.close();
    if (!action) return;
    try {
      const {ok, data} = await action();
      say(ok ? data.message : data.error, !ok);
    } catch (error) {
      say(String(error), true);
    }
  });
  respawn.poll(main.dataset.api, apply, (error) => say(`not refreshed: ${error}`, true));
  const shown = document.getElementById("logs");
  shown.scrollTop = shown.scrollHeight;  // the lines the page came with: their end in view
  const logsNote = (error) => logs({lines: [], note: `logs not refreshed: ${error}`, read_at: null});
  respawn.poll(main.dataset.logs, logs, logsNote, {now: true});
})();
