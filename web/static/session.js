// The session page: expand or collapse every group, reorder pairs by dragging rows (kept in the session), and
// while runs are ingested or pairs compared, keep the page live: poll the progress, move each run's ingest bar,
// and fetch the page again (swapping it in, no reload) whenever it has something new to show.
// Everything here has a no-script twin: groups start open, the ▲▼ buttons move a row, and the page refreshes
// itself (a meta refresh inside <noscript>) while anything is in progress.

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-details]");
  if (!button) return;
  const open = button.dataset.details === "open";
  for (const d of document.querySelectorAll("details.group")) d.open = open;
});

function bindReorder() {
  const table = document.querySelector("table.pairs[data-reorder]");
  if (!table) return;
  const body = table.tBodies[0];
  let dragged = null;
  body.addEventListener("dragstart", (event) => {
    dragged = event.target.closest("tr");
    dragged.classList.add("dragging");
    event.dataTransfer.effectAllowed = "move";
  });
  body.addEventListener("dragover", (event) => {
    event.preventDefault();
    const over = event.target.closest("tr");
    if (!dragged || !over || over === dragged) return;
    const { top, height } = over.getBoundingClientRect();
    body.insertBefore(dragged, event.clientY < top + height / 2 ? over : over.nextSibling);
  });
  body.addEventListener("dragend", async () => {
    if (!dragged) return;
    dragged.classList.remove("dragging");
    dragged = null;
    const pairs = [...body.rows].map((row) => row.dataset.key);
    const response = await fetch(table.dataset.reorder, {
      method: "PUT", headers: { "content-type": "application/json" }, body: JSON.stringify({ pairs }),
    });
    table.dataset.saved = response.ok ? "yes" : "no";
  });
}

// --- live progress -------------------------------------------------------------------------------------

const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

function moveBars(state) {
  for (const run of state.runs) {
    const item = document.querySelector(`.ingest-runs li[data-run="${run.id}"]`);
    if (!item) continue;
    item.querySelector(".words").textContent = run.words;
    const bar = item.querySelector("progress");
    if (bar && run.bytes_done !== null) {
      bar.max = run.bytes_total || 1;
      bar.value = run.bytes_total ? run.bytes_done : 1;
    }
  }
}

async function swapPage() {
  const response = await fetch(location.href, { headers: { accept: "text/html" } });
  if (!response.ok) return false;
  const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
  const main = fresh.querySelector("main");
  if (!main) return false;
  document.querySelector("main").replaceChildren(...main.childNodes);
  bindReorder();
  return true;
}

async function followProgress() {
  for (;;) {
    const live = document.getElementById("live");
    if (!live) return; // the page shows everything: nothing more will change by itself
    let state;
    try {
      const response = await fetch(live.dataset.progress, { headers: { accept: "application/json" } });
      if (response.status === 404) return; // the session was deleted meanwhile
      state = await response.json();
    } catch {
      await sleep(2000);
      continue;
    }
    moveBars(state);
    if (state.signature !== live.dataset.signature) {
      try { await swapPage(); } catch { /* try again on the next round */ }
    }
    await sleep(state.stage === "comparing" ? 2000 : 1000);
  }
}

bindReorder();
followProgress();
