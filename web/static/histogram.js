// The pair page's histogram of |diff| per decade: the bar under the pointer is marked and read out (its exact range,
// its count and its share, as the server wrote them on its row); the chart is one tab stop (chart_keys.js: ↓ and ↑
// step a bar, Home and End go to the ends).

import { readOut } from "./chart_keys.js";

const figure = document.querySelector("figure.histogram-chart");
if (figure) {
  const plot = figure.querySelector(".histogram-plot");
  const rows = [...plot.querySelectorAll("tbody tr")];
  const readout = figure.querySelector(".histogram-readout");

  function show(at) {
    rows.forEach((row, i) => row.classList.toggle("at", i === at));
    readout.textContent = rows[at].dataset.readout;
  }
  // the bar whose row spans the pointer's height (anywhere across the chart, labels and counts included)
  function indexAt(event) {
    const i = rows.findIndex((row) => {
      const box = row.getBoundingClientRect();
      return event.clientY >= box.top && event.clientY < box.bottom;
    });
    return i >= 0 ? i : null;
  }
  if (rows.length) readOut(plot, rows.length, show, indexAt, true);
}
