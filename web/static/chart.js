// The session page's chart of error through the model, drawn with uPlot (web/static/vendor/uplot) from the data
// the server puts on its SVG chart's figure (data-series): max |diff| and 1 − cosine of every pair in execution order
// on a log scale, exact pairs on a floor line marked 0, the layers along the x axis, the first divergence marked,
// a red tick under each failing pair. A crosshair shows the pair under the pointer; dragging zooms into a range and
// filters the table to it (double-click: everything again); a click opens the pair. The chart is one tab stop:
// ← → move the crosshair, Enter opens its pair. Without scripts the server's SVG stays.

/* global uPlot */

import { stepKeys } from "./chart_keys.js";

function start() {
  const figure = document.getElementById("chart");
  if (figure && figure.dataset.series && window.uPlot && !figure.classList.contains("live")) {
    draw(figure, JSON.parse(figure.dataset.series));
  }
}
start();
document.addEventListener("page:swapped", start); // session.js swapped in a fresher page while comparing

function number(value) {
  // the pages' one format: 4 significant digits, scientific only outside 1e-3..1e4
  if (value === null || value === undefined) return "—";
  if (typeof value === "string") return value === "nan" ? "NaN" : "Inf";
  if (value === 0) return "0";
  const abs = Math.abs(value);
  if (abs >= 1e-3 && abs < 1e4) return String(Number(value.toPrecision(4)));
  const [mantissa, exponent] = value.toExponential(3).split("e");
  return `${String(Number(mantissa))}e${Number(exponent)}`;
}

function draw(figure, data) {
  const n = data.id.length;
  const positive = [...data.diff, ...data.one_minus_cos].filter((v) => typeof v === "number" && v > 0);
  const lowDecade = positive.length ? Math.floor(Math.log10(Math.min(...positive))) : -8;
  const highDecade = Math.max(lowDecade + 1, positive.length ? Math.ceil(Math.log10(Math.max(...positive))) : 0);
  const high = 10 ** highDecade;
  const floor = 10 ** (lowDecade - 1); // exact pairs are drawn here, labelled 0
  const place = (v) => (v === null ? null : typeof v === "string" ? high : v <= 0 ? floor : v);
  const xs = data.id.map((_, i) => i);
  const firstAt = data.status.indexOf("fail");
  const layerStarts = [];
  data.layer.forEach((layer, i) => { if (layer !== null && layer !== data.layer[i - 1]) layerStarts.push(i); });
  const holder = figure.querySelector(".chart-plot");
  const readout = document.createElement("p");
  readout.className = "chart-readout";
  readout.setAttribute("aria-live", "polite");

  function describe(i) {
    if (i === null || i === undefined) return "Point at a pair to read it; drag to zoom into a range and filter the table.";
    const layer = data.layer[i] === null ? "" : ` (layer ${data.layer[i]})`;
    return `#${data.position[i]} ${data.name[i]}${layer}: ${data.status[i]}, max |diff| ${number(data.diff[i])}, 1 − cos ${number(data.one_minus_cos[i])}`;
  }

  function marks(u) {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    ctx.save();
    ctx.beginPath();
    ctx.rect(left, top, width, height);
    ctx.clip();
    const yFloor = u.valToPos(floor, "y", true);
    ctx.strokeStyle = "#9aa5b1";
    ctx.setLineDash([2, 3]);
    ctx.beginPath(); ctx.moveTo(left, yFloor); ctx.lineTo(left + width, yFloor); ctx.stroke();
    ctx.setLineDash([]);
    ctx.strokeStyle = "#c0392b";
    ctx.lineWidth = 1.5 * devicePixelRatio;
    ctx.beginPath();
    data.status.forEach((status, i) => {
      if (status !== "fail" && status !== "error") return;
      const x = u.valToPos(i, "x", true);
      ctx.moveTo(x, top + height); ctx.lineTo(x, top + height - 6 * devicePixelRatio);
    });
    ctx.stroke();
    // reference tensors never compared (no partner in the candidate): a dashed orange line where each falls
    ctx.strokeStyle = "#e67e22";
    ctx.setLineDash([3, 3]);
    ctx.beginPath();
    for (const gap of data.gaps || []) {
      const x = u.valToPos(gap.at, "x", true);
      ctx.moveTo(x, top); ctx.lineTo(x, top + height);
    }
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.strokeStyle = "#c0392b";
    const firstX = firstAt >= 0 ? u.valToPos(firstAt, "x", true) : NaN;
    if (firstX >= left && firstX <= left + width) { // only while the zoom shows it
      const x = firstX;
      ctx.setLineDash([5, 4]);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = "#8e1b10";
      ctx.font = `${11 * devicePixelRatio}px system-ui, sans-serif`;
      ctx.textAlign = "left"; // uPlot leaves the x axis's "center", which put half the label off the plot
      ctx.textBaseline = "alphabetic";
      // beside the line on the side with more room, the name alone where the whole label does not fit
      const gap = 4 * devicePixelRatio;
      const room = Math.max(x - left, left + width - x) - gap;
      let label = `first divergence: ${data.name[firstAt]}`;
      if (ctx.measureText(label).width > room) label = data.name[firstAt];
      const textWidth = ctx.measureText(label).width;
      const start = x - left > left + width - x ? x - gap - textWidth : x + gap;
      ctx.fillText(label, Math.max(left, Math.min(start, left + width - textWidth)), top + 12 * devicePixelRatio);
    }
    ctx.restore();
  }

  // the x axis's labels: every layer (or position) where there is room, else every 2nd, 5th, 10th... one, evenly, so
  // that no label is skipped here and there (44 px or more between labels)
  function layerSplits(u, axis, min, max) {
    const starts = layerStarts.filter((i) => i >= min && i <= max);
    const ticks = starts.length ? starts : xs.filter((i) => i >= min && i <= max);
    const key = (i) => (starts.length ? data.layer[i] : i);
    const perIndex = u.bbox.width / devicePixelRatio / Math.max(1, max - min);
    for (const k of [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]) {
      const kept = ticks.filter((i) => key(i) % k === 0);
      if (kept.every((i, j) => j === 0 || (i - kept[j - 1]) * perIndex >= 44)) return kept;
    }
    return ticks.slice(0, 1);
  }

  const options = {
    width: holder.clientWidth || 800,
    height: 260,
    legend: { show: false },
    cursor: { drag: { x: true, y: false }, points: { size: 6 } },
    scales: { x: { time: false }, y: { distr: 3, range: () => [floor / 2, high * 2] } },
    axes: [
      {
        label: "layer (index)", labelSize: 18, size: 34, stroke: "#5f6b7a",
        splits: layerSplits,
        values: (u, splits) => splits.map((i) => (data.layer[i] === null ? String(data.position[i]) : String(data.layer[i]))),
        grid: { show: false },
      },
      {
        label: "max |diff|, 1 − cos (log)", labelSize: 16, size: 50, stroke: "#5f6b7a", grid: { stroke: "#eceff3" },
        splits: () => {
          const every = Math.max(1, Math.ceil((highDecade - lowDecade) / 6));
          const out = [floor];
          for (let k = lowDecade; k <= highDecade; k += every) out.push(10 ** k);
          return out;
        },
        filter: (u, splits) => splits,
        values: (u, splits) => splits.map((v) => (v === floor ? "0" : `1e${Math.round(Math.log10(v))}`)),
      },
    ],
    series: [
      {},
      { label: "max |diff|", stroke: "#b35c00", width: 1.2, points: { show: n <= 400, size: 4, fill: "#b35c00" } },
      { label: "1 − cosine", stroke: "#2b5fb8", width: 1, dash: [3, 3], points: { show: false } },
    ],
    hooks: {
      draw: [marks],
      setCursor: [(u) => { readout.textContent = describe(u.cursor.idx); }],
      setSelect: [(u) => {
        if (u.select.width < 4) return;
        const from = Math.max(0, Math.ceil(u.posToVal(u.select.left, "x")));
        const to = Math.min(n - 1, Math.floor(u.posToVal(u.select.left + u.select.width, "x")));
        if (to >= from) filterTable(data.position[from], data.position[to]);
      }],
    },
  };
  const plot = new uPlot(options, [xs, data.diff.map(place), data.one_minus_cos.map(place)], holder);
  figure.classList.add("live"); // the server's SVG is hidden by the stylesheet
  holder.after(readout);
  readout.textContent = describe(null);

  holder.tabIndex = 0;
  holder.setAttribute("role", "img");
  holder.setAttribute("aria-label", "Chart of max |diff| and 1 − cosine by layer. Arrow keys, Home and End move along the pairs, Enter opens one.");
  // the keys start at the first divergence (chart_keys.js: ← → a pair, PageUp and PageDown 13, Home and End)
  stepKeys(holder, n, (i) => {
    plot.setCursor({ left: plot.valToPos(i, "x"), top: plot.valToPos(place(data.diff[i]) ?? floor, "y") });
    readout.textContent = describe(i);
  }, { upDown: false, page: 13, from: firstAt >= 0 ? firstAt : 0, enter: (i) => { location.href = `/pairs/${data.id[i]}`; } });
  plot.over.addEventListener("click", () => {
    if (plot.select.width > 3 || plot.cursor.idx === null || plot.cursor.idx === undefined) return;
    location.href = `/pairs/${data.id[plot.cursor.idx]}`;
  });
  plot.over.addEventListener("dblclick", () => filterTable(null, null));
  new ResizeObserver(() => plot.setSize({ width: holder.clientWidth, height: 260 })).observe(holder);
}

// The table filtered to execution positions lo..hi (both null: every pair), fetched and swapped in without a
// reload; the URL follows (?lo=&hi=) so the filtered view is a link.
async function filterTable(lo, hi) {
  const url = new URL(location.href);
  for (const key of ["lo", "hi", "open", "page"]) url.searchParams.delete(key);
  if (lo !== null) { url.searchParams.set("lo", lo); url.searchParams.set("hi", hi); }
  const response = await fetch(url, { headers: { accept: "text/html" } });
  if (!response.ok) return;
  const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
  const section = document.querySelector("section.card.pairs-card");
  const replacement = fresh.querySelector("section.card.pairs-card");
  if (!section || !replacement) return;
  for (const child of [...section.children]) if (child.id !== "chart") child.remove();
  for (const child of [...replacement.children]) if (child.id !== "chart") section.append(child);
  history.replaceState(null, "", url);
  document.dispatchEvent(new CustomEvent("pairs:replaced"));
}
