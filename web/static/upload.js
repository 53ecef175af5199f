// New session: drop zones, a real progress bar per file while the upload runs, then the session page, which
// shows the ingest and the comparisons live (and, next to each file's name, why a file could not be used).
// What is refused before the ingest begins gets its reason here, next to the file where it names one.
// Without this script the same form posts plainly and still works.

const form = document.querySelector("form.new-session");
if (form) {
  const zones = [...form.querySelectorAll(".dropzone")];
  const status = form.querySelector(".status");
  const chosen = new Map(zones.map((zone) => [zone.dataset.run, []]));

  function render(zone) {
    const list = zone.querySelector(".files");
    list.replaceChildren(...chosen.get(zone.dataset.run).map((item) => {
      const li = document.createElement("li");
      li.dataset.name = item.file.name;
      const name = Object.assign(document.createElement("span"), { className: "name", textContent: item.file.name });
      const bar = Object.assign(document.createElement("progress"), { max: item.file.size || 1, value: 0 });
      bar.setAttribute("aria-label", `upload of ${item.file.name}`);
      const note = Object.assign(document.createElement("span"), { className: "note" });
      item.bar = bar; item.note = note; item.li = li;
      li.append(name, bar, note);
      return li;
    }));
  }

  function add(zone, files) {
    const list = chosen.get(zone.dataset.run);
    for (const file of files) list.push({ file });
    render(zone);
  }

  for (const zone of zones) {
    const input = zone.querySelector("input[type=file]");
    input.addEventListener("change", () => { chosen.set(zone.dataset.run, []); add(zone, input.files); });
    zone.addEventListener("dragover", (event) => { event.preventDefault(); zone.classList.add("over"); });
    zone.addEventListener("dragleave", () => zone.classList.remove("over"));
    zone.addEventListener("drop", (event) => {
      event.preventDefault();
      zone.classList.remove("over");
      add(zone, event.dataTransfer.files);
    });
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const items = zones.flatMap((zone) => chosen.get(zone.dataset.run).map((item) => ({ ...item, run: zone.dataset.run })));
    if (!items.length) { status.textContent = "Choose at least one file for a run."; return; }
    const body = new FormData();
    body.append("name", form.elements.name.value);
    for (const item of items) body.append(item.run, item.file, item.file.name);
    // Parts go out in order, so the bytes sent so far tell how far each file is.
    const xhr = new XMLHttpRequest();
    xhr.open("POST", "/api/sessions?wait=false"); // answered once the bytes are on disk; ingest goes on
    xhr.upload.addEventListener("progress", (e) => {
      let left = e.loaded;
      for (const item of items) {
        const done = Math.min(item.file.size, Math.max(0, left));
        item.bar.value = done; left -= item.file.size;
      }
    });
    xhr.upload.addEventListener("load", () => {
      for (const item of items) item.bar.value = item.bar.max;
      status.textContent = "Uploaded. Opening the session page…";
    });
    xhr.addEventListener("load", () => {
      const reply = JSON.parse(xhr.responseText || "{}");
      if (xhr.status === 202 || xhr.status === 201) { location.href = reply.url || `/sessions/${reply.session.id}`; return; }
      status.textContent = reply.detail || `The upload failed (${xhr.status}).`;
      for (const run of reply.runs || []) {
        for (const problem of run.problems) {
          const item = items.find((i) => problem.file === i.file.name || problem.file.startsWith(`${i.file.name}/`)
            || problem.file.startsWith(`${i.file.name}[`));
          if (item) { item.note.textContent += ` ${problem.reason}`; item.li.classList.add("bad"); }
        }
      }
    });
    xhr.addEventListener("error", () => { status.textContent = "The connection failed during the upload."; });
    status.textContent = "Uploading…";
    xhr.send(body);
  });
}
