// The session page: expand or collapse every group, and reorder pairs by dragging rows (kept in the session).
// Everything here has a no-script twin: groups start open, and the ▲▼ buttons move a row.

for (const button of document.querySelectorAll("button[data-details]")) {
  button.addEventListener("click", () => {
    const open = button.dataset.details === "open";
    for (const d of document.querySelectorAll("details.group")) d.open = open;
  });
}

const table = document.querySelector("table.pairs[data-reorder]");
if (table) {
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
