// The value inspector: sliders and number boxes per dimension of more than one index, arrow keys, "Jump to max
// diff" and a click on the heatmap (which moves with the window) without a reload. The window lives in the URL (index, start, count), so links and the back button work; the server
// renders the grids (the same partial as the page), so this script only moves the window.

const form = document.querySelector("form.window");
if (form) {
  const pairId = form.dataset.pair;
  const shape = form.dataset.shape.split(",").filter((s) => s !== "").map(Number);
  const grids = document.getElementById("inspector-grids");
  const sliders = form.querySelector(".sliders");
  let state = readState(new URLSearchParams(location.search));

  function readState(params) {
    const index = (params.get("index") ?? form.elements.index.value).split(",");
    const free = index.map((v, d) => (v.trim() === ":" ? d : -1)).filter((d) => d >= 0);
    const starts = (params.get("start") ?? form.elements.start.value).split(",").map(Number);
    const counts = (params.get("count") ?? form.elements.count.value).split(",").map(Number);
    return { index, free, starts, counts };
  }

  function query(s) {
    return new URLSearchParams({ index: s.index.join(","), start: s.starts.join(","), count: s.counts.join(",") });
  }

  function clamp(value, lo, hi) { return Math.max(lo, Math.min(hi, value)); }

  async function show(s, push = true) {
    state = s;
    form.elements.index.value = s.index.join(",");
    form.elements.start.value = s.starts.join(",");
    form.elements.count.value = s.counts.join(",");
    syncSliders();
    const q = query(s);
    if (push) history.pushState(null, "", `/pairs/${pairId}?${q}`);
    const response = await fetch(`/pairs/${pairId}/grid?${q}`);
    grids.innerHTML = await response.text();
    bindHeatmap();
    showLargest();
  }

  // the window's largest difference scrolled into view inside the grids' own scroll area (not the page)
  function showLargest() {
    const area = grids.querySelector(".grids");
    const cell = area && area.querySelector("td.max");
    if (!cell) return;
    const box = area.getBoundingClientRect();
    const at = cell.getBoundingClientRect();
    area.scrollTop += at.top - box.top - area.clientHeight / 2;
    area.scrollLeft += at.left - box.left - area.clientWidth / 2;
  }

  // the window moved so that it holds `target` (an aligned index), centred where it can be
  function moveTo(target) {
    const next = structuredClone(state);
    shape.forEach((size, dim) => {
      const w = next.free.indexOf(dim);
      if (w >= 0) next.starts[w] = clamp(target[dim] - Math.floor(next.counts[w] / 2), 0, Math.max(0, size - next.counts[w]));
      else next.index[dim] = String(target[dim]);
    });
    show(next);
  }

  // a click on a heatmap cell opens that spot (the SVG is the app's own document, so its cells can be read)
  function bindHeatmap() {
    const heatmap = grids.querySelector("object.heatmap");
    if (!heatmap) return;
    const listen = () => {
      const svg = heatmap.contentDocument;
      if (!svg || svg.documentElement.dataset.bound) return;
      svg.documentElement.dataset.bound = "yes";
      svg.addEventListener("click", (event) => {
        const cell = event.target.closest("rect[data-index]");
        if (cell) moveTo(cell.dataset.index.split(",").map(Number));
      });
    };
    heatmap.addEventListener("load", listen);
    listen();
  }

  function control(label, max, value, onChange) {
    const row = document.createElement("div");
    row.className = "slider";
    const name = document.createElement("span");
    name.textContent = label;
    const range = Object.assign(document.createElement("input"), { type: "range", min: 0, max, value });
    const box = Object.assign(document.createElement("input"), { type: "number", min: 0, max, value });
    range.setAttribute("aria-label", label);
    box.setAttribute("aria-label", `${label} (number)`);
    range.addEventListener("input", () => { box.value = range.value; onChange(Number(range.value)); });
    box.addEventListener("change", () => { range.value = box.value; onChange(Number(box.value)); });
    row.append(name, range, box);
    return { row, range, box };
  }

  let controls = [];
  function buildSliders() {
    sliders.replaceChildren();
    controls = shape.flatMap((size, dim) => {
      if (size <= 1) return []; // nothing to move along
      const w = state.free.indexOf(dim);
      const isWindow = w >= 0;
      const max = isWindow ? Math.max(0, size - state.counts[w]) : size - 1;
      const value = isWindow ? state.starts[w] : Number(state.index[dim]);
      const label = `dim ${dim} (size ${size})${isWindow ? ", window start" : ""}`;
      const c = control(label, max, value, (v) => {
        const next = structuredClone(state);
        if (isWindow) next.starts[w] = v; else next.index[dim] = String(v);
        schedule(next);
      });
      sliders.append(c.row);
      return [{ ...c, dim, isWindow, w }];
    });
    sliders.hidden = controls.length === 0;
  }

  function syncSliders() {
    for (const c of controls) {
      const v = c.isWindow ? state.starts[c.w] : Number(state.index[c.dim]);
      c.range.value = v; c.box.value = v;
    }
  }

  let timer = null;
  function schedule(next) {
    clearTimeout(timer);
    timer = setTimeout(() => show(next), 60);
  }

  buildSliders();
  bindHeatmap();
  showLargest();

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const params = new URLSearchParams(new FormData(form));
    state = readState(params);
    buildSliders();
    show(state);
  });

  const jump = document.getElementById("jump");
  if (jump) {
    jump.addEventListener("click", (event) => {
      event.preventDefault();
      // centre the current window (same dimensions and counts) on the largest difference
      moveTo(jump.dataset.argmax.split(",").map(Number));
    });
  }

  window.addEventListener("popstate", () => show(readState(new URLSearchParams(location.search)), false));

  document.addEventListener("keydown", (event) => {
    if (event.target.closest("input, textarea, select") || !["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown"].includes(event.key)) return;
    if (!shape.length) return;
    event.preventDefault();
    const next = structuredClone(state);
    if (event.key === "ArrowLeft" || event.key === "ArrowRight") {
      const w = next.free.length - 1;  // the last window dimension
      const dim = next.free[w];
      const step = (event.shiftKey ? next.counts[w] : 1) * (event.key === "ArrowRight" ? 1 : -1);
      next.starts[w] = clamp(next.starts[w] + step, 0, Math.max(0, shape[dim] - next.counts[w]));
    } else {
      const fixed = next.index.map((v, d) => (v.trim() === ":" ? -1 : d)).filter((d) => d >= 0);
      if (!fixed.length) return;
      const dim = fixed[fixed.length - 1];
      const step = event.key === "ArrowDown" ? 1 : -1;
      next.index[dim] = String(clamp(Number(next.index[dim]) + step, 0, shape[dim] - 1));
    }
    show(next);
  });
}
