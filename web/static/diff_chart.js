// The compare-sessions page's chart (web/views/diff_chart.py puts its data on the figure, data-series): max |diff|
// of every pair in session A and in session B overlaid on one log axis, drawn with uPlot. A crosshair reads out
// both sides of the pair under the pointer; the chart is one tab stop: ← → (PageUp, PageDown, Home, End) move the
// crosshair, Enter opens B's pair (A's where B has none). Without scripts the server's SVG stays.

/* global uPlot */

import { stepKeys } from "./chart_keys.js";

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
  const n = data.key.length;
  const positive = [...data.a, ...data.b].filter((v) => typeof v === "number" && v > 0);
  const lowDecade = positive.length ? Math.floor(Math.log10(Math.min(...positive))) : -8;
  const highDecade = Math.max(lowDecade + 1, positive.length ? Math.ceil(Math.log10(Math.max(...positive))) : 0);
  const high = 10 ** highDecade;
  const floor = 10 ** (lowDecade - 1); // exact pairs are drawn here, labelled 0
  const place = (v) => (v === null ? null : typeof v === "string" ? high : v <= 0 ? floor : v);
  const xs = data.key.map((_, i) => i);
  const holder = figure.querySelector(".chart-plot");
  const readout = document.createElement("p");
  readout.className = "chart-readout";
  readout.setAttribute("aria-live", "polite");

  function describe(i) {
    if (i === null || i === undefined) return "Point at a pair (or focus the chart and use the arrow keys) to read both sessions' error.";
    const layer = data.layer[i] === null ? "" : ` (layer ${data.layer[i]})`;
    const side = (status, value) => (status === null ? "absent" : `${status}, max |diff| ${number(value)}`);
    return `#${i} ${data.key[i]}${layer}: A ${side(data.status_a[i], data.a[i])}; B ${side(data.status_b[i], data.b[i])}; ${data.change[i]}`;
  }

  function floorLine(u) {
    const ctx = u.ctx;
    const { left, width } = u.bbox;
    const y = u.valToPos(floor, "y", true);
    ctx.save();
    ctx.strokeStyle = "#9aa5b1";
    ctx.setLineDash([2, 3]);
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + width, y); ctx.stroke();
    ctx.restore();
  }

  const options = {
    width: holder.clientWidth || 800,
    height: 260,
    legend: { show: false }, // the page's own legend, above the chart
    cursor: { drag: { x: false, y: false }, points: { size: 7 } },
    scales: { x: { time: false }, y: { distr: 3, range: () => [floor / 2, high * 2] } },
    axes: [
      { label: "pair (index, in A's execution order)", labelSize: 18, size: 34, stroke: "#5f6b7a", grid: { show: false } },
      {
        label: "max |diff| (log)", labelSize: 16, size: 50, stroke: "#5f6b7a", grid: { stroke: "#eceff3" },
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
      { label: "A", stroke: "#5f6b7a", width: 1.5, points: { show: n <= 400, size: 4, fill: "#5f6b7a" } },
      { label: "B", stroke: "#b35c00", width: 1.5, dash: [5, 3], points: { show: n <= 400, size: 4, fill: "#b35c00" } },
    ],
    hooks: {
      draw: [floorLine],
      setCursor: [(u) => { if (u.cursor.idx !== null && u.cursor.idx !== undefined) keys?.set(u.cursor.idx); readout.textContent = describe(u.cursor.idx); }],
    },
  };
  let keys = null; // the chart's keys (stepKeys), once it is drawn
  const plot = new uPlot(options, [xs, data.a.map(place), data.b.map(place)], holder);
  figure.classList.add("live"); // the server's SVG is hidden by the stylesheet
  holder.after(readout);
  readout.textContent = describe(null);

  holder.tabIndex = 0;
  holder.setAttribute("role", "img");
  holder.setAttribute("aria-label", "Chart of max |diff| in session A and in session B by pair. Arrow keys, Home and End move along the pairs, Enter opens one.");
  const open = (i) => {
    const id = data.pair_b[i] ?? data.pair_a[i];
    if (id !== null && id !== undefined) location.href = `/pairs/${id}`;
  };
  // chart_keys.js: ← → a pair, PageUp and PageDown 13, Home and End; from the pair the pointer last showed
  keys = stepKeys(holder, n, (i) => {
    const y = place(data.b[i]) ?? place(data.a[i]) ?? floor;
    plot.setCursor({ left: plot.valToPos(i, "x"), top: plot.valToPos(y, "y") });
    readout.textContent = describe(i);
  }, { upDown: false, page: 13, from: 0, enter: open });
  plot.over.addEventListener("click", () => {
    if (plot.cursor.idx !== null && plot.cursor.idx !== undefined) open(plot.cursor.idx);
  });
  new ResizeObserver(() => plot.setSize({ width: holder.clientWidth, height: 260 })).observe(holder);
}

const figure = document.getElementById("diff-chart");
if (figure && figure.dataset.series && window.uPlot) draw(figure, JSON.parse(figure.dataset.series));
