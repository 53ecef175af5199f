// The pair page's error profile: a crosshair and a read-out of the index under the pointer (its largest and mean
// |diff|, and whether it has elements outside tolerance); the chart is one tab stop (chart_keys.js: the arrow keys
// step an index, with Shift a tenth of the axis, Home and End go to the ends).

import { readOut } from "./chart_keys.js";

const figure = document.querySelector("figure.profile-chart");
if (figure) {
  const data = JSON.parse(figure.dataset.series);
  const n = data.max.length;
  const plot = figure.querySelector(".plot");
  const svg = plot.querySelector("svg");
  const line = svg.querySelector("line.crosshair");
  const readout = figure.querySelector(".profile-readout");
  const width = svg.viewBox.baseVal.width;

  function show(at) {
    const x = n > 1 ? (at * width) / (n - 1) : 0;
    line.setAttribute("x1", x); line.setAttribute("x2", x);
    const outside = data.mismatched[at] ? "elements outside tolerance" : "every element within tolerance";
    readout.textContent = `index ${at}: max |diff| ${data.max[at]}, mean |diff| ${data.mean[at]}; ${outside}`;
  }
  readOut(plot, n, show, (event) => {
    const box = svg.getBoundingClientRect();
    return Math.round(((event.clientX - box.left) / box.width) * (n - 1));
  });
}
