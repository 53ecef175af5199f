// The session page: open and close groups of the pairs table (fetching a group's rows when it is opened or
// scrolls into view), page through a large group, reorder pairs with ▲▼ or by dragging rows (kept in the session,
// no reload), and while runs are ingested or pairs compared, keep the page live: poll the progress, move each
// run's ingest bar, and fetch the page again (swapping it in, no reload) whenever it has something new to show.
// Everything here has a no-script twin: a group's header is a link that opens it, ▲▼ are form buttons, and the
// page refreshes itself (a meta refresh inside <noscript>) while anything is in progress.

const pairsTable = () => document.querySelector("table.pairs");

async function loadGroup(tbody, page) {
  const table = pairsTable();
  if (!table || tbody.dataset.loading) return null;
  tbody.dataset.loading = "yes";
  const url = `${table.dataset.groups}&open=${encodeURIComponent(tbody.dataset.key)}&page=${page}`;
  try {
    const response = await fetch(url, { headers: { accept: "text/html" } });
    if (!response.ok) return null;
    const parsed = new DOMParser().parseFromString(`<table>${await response.text()}</table>`, "text/html");
    const fresh = parsed.querySelector("tbody");
    if (!fresh) return null;
    tbody.replaceWith(fresh);
    return fresh;
  } finally {
    delete tbody.dataset.loading;
  }
}

// Open groups whose rows are not on the page yet load once they come near the viewport.
const nearView = new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (!entry.isIntersecting) continue;
    nearView.unobserve(entry.target);
    loadGroup(entry.target, entry.target.dataset.page || 0);
  }
}, { rootMargin: "800px 0px" });

function watchUnloaded() {
  for (const tbody of document.querySelectorAll("tbody.group.open")) {
    if (!tbody.querySelector("tr.row")) nearView.observe(tbody);
  }
}

function setOpen(tbody, open) {
  tbody.classList.toggle("open", open);
  const toggle = tbody.querySelector("a.toggle");
  if (toggle) toggle.setAttribute("aria-expanded", String(open));
  if (open && !tbody.querySelector("tr.row")) nearView.observe(tbody);
}

document.addEventListener("click", async (event) => {
  const toggle = event.target.closest("a.toggle");
  if (toggle) {
    event.preventDefault();
    const tbody = toggle.closest("tbody");
    setOpen(tbody, !tbody.classList.contains("open"));
    return;
  }
  const paging = event.target.closest("tr.pager a[data-page], tr.more a");
  if (paging) {
    event.preventDefault();
    const tbody = paging.closest("tbody");
    const fresh = await loadGroup(tbody, paging.dataset.page || tbody.dataset.page || 0);
    if (fresh && paging.dataset.page) fresh.scrollIntoView({ block: "start" });
    return;
  }
  const button = event.target.closest("button[data-groups]");
  if (button) {
    for (const tbody of document.querySelectorAll("tbody.group")) setOpen(tbody, button.dataset.groups === "open");
  }
});

// --- reordering: the whole order lives in #pair-order; the table shows one page of it --------------------

function pairOrder() {
  const data = document.getElementById("pair-order");
  return data ? JSON.parse(data.dataset.keys) : null;
}

async function saveOrder(keys) {
  const table = pairsTable();
  document.getElementById("pair-order").dataset.keys = JSON.stringify(keys);
  const response = await fetch(table.dataset.reorder, {
    method: "PUT", headers: { "content-type": "application/json" }, body: JSON.stringify({ pairs: keys }),
  });
  table.dataset.saved = response.ok ? "yes" : "no";
}

document.addEventListener("submit", (event) => {
  const form = event.target.closest("td.move form");
  const keys = pairOrder();
  if (!form || !keys || !event.submitter) return;
  event.preventDefault();
  const up = event.submitter.value === "up";
  const row = form.closest("tr");
  const at = keys.indexOf(row.dataset.key);
  const to = up ? at - 1 : at + 1;
  if (at < 0 || to < 0 || to >= keys.length) return;
  [keys[at], keys[to]] = [keys[to], keys[at]];
  const neighbour = up ? row.previousElementSibling : row.nextElementSibling;
  if (neighbour && neighbour.classList.contains("row")) {
    row.parentNode.insertBefore(row, up ? neighbour : neighbour.nextSibling);
    event.submitter.focus({ preventScroll: true });
  } else {
    row.remove(); // it moved onto the previous or next page of the table
  }
  saveOrder(keys);
});

function bindDragging() {
  const table = pairsTable();
  if (!table || !table.dataset.reorder) return;
  let dragged = null;
  table.addEventListener("dragstart", (event) => {
    dragged = event.target.closest("tr.row");
    if (!dragged) return;
    dragged.classList.add("dragging");
    event.dataTransfer.effectAllowed = "move";
  });
  table.addEventListener("dragover", (event) => {
    event.preventDefault();
    const over = event.target.closest("tr.row");
    if (!dragged || !over || over === dragged) return;
    const { top, height } = over.getBoundingClientRect();
    over.parentNode.insertBefore(dragged, event.clientY < top + height / 2 ? over : over.nextSibling);
  });
  table.addEventListener("dragend", () => {
    if (!dragged) return;
    dragged.classList.remove("dragging");
    const keys = pairOrder().filter((key) => key !== dragged.dataset.key);
    const next = dragged.nextElementSibling;
    const previous = dragged.previousElementSibling;
    if (next && next.classList.contains("row")) keys.splice(keys.indexOf(next.dataset.key), 0, dragged.dataset.key);
    else if (previous && previous.classList.contains("row")) keys.splice(keys.indexOf(previous.dataset.key) + 1, 0, dragged.dataset.key);
    else keys.push(dragged.dataset.key);
    dragged = null;
    saveOrder(keys);
  });
}

function enhance() {
  for (const button of document.querySelectorAll("button[data-groups]")) button.hidden = false;
  watchUnloaded();
  bindDragging();
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
  enhance();
  document.dispatchEvent(new CustomEvent("page:swapped"));
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

document.addEventListener("pairs:replaced", enhance); // the chart filtered the table (chart.js)
enhance();
followProgress();
