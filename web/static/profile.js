// The pair page's error profile: a crosshair and a read-out of the index under the pointer (its largest and mean
// |diff|, and whether it has elements outside tolerance); the chart is one tab stop, where the arrow keys step an
// index (with Shift, a tenth of the axis), Home and End go to the ends.

const figure = document.querySelector("figure.profile-chart");
if (figure) {
  const data = JSON.parse(figure.dataset.series);
  const n = data.max.length;
  const plot = figure.querySelector(".plot");
  const svg = plot.querySelector("svg");
  const line = svg.querySelector("line.crosshair");
  const readout = figure.querySelector(".profile-readout");
  const width = svg.viewBox.baseVal.width;
  let at = null;

  function show(i) {
    at = Math.max(0, Math.min(n - 1, i));
    const x = n > 1 ? (at * width) / (n - 1) : 0;
    line.setAttribute("x1", x); line.setAttribute("x2", x);
    const outside = data.mismatched[at] ? "elements outside tolerance" : "every element within tolerance";
    readout.textContent = `index ${at}: max |diff| ${data.max[at]}, mean |diff| ${data.mean[at]}; ${outside}`;
  }
  plot.addEventListener("pointermove", (event) => {
    const box = svg.getBoundingClientRect();
    show(Math.round(((event.clientX - box.left) / box.width) * (n - 1)));
  });
  plot.addEventListener("keydown", (event) => {
    const big = Math.max(1, Math.round(n / 10));
    const step = { ArrowRight: 1, ArrowLeft: -1, ArrowUp: 1, ArrowDown: -1 }[event.key];
    if (step) show((at ?? -step) + step * (event.shiftKey ? big : 1));
    else if (event.key === "Home") show(0);
    else if (event.key === "End") show(n - 1);
    else return;
    event.preventDefault();
    event.stopPropagation(); // the inspector's arrow keys move its window
  });
  plot.addEventListener("focus", () => { if (at === null) show(0); });
}
