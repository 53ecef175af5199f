// What the pages' own charts share (the error profile, the histogram; the uPlot charts have uPlot's cursor): a
// read-out of the item under the pointer, and one tab stop where the arrow keys step an item (with Shift, a tenth
// of the items), PageUp and PageDown a tenth, Home and End go to the ends. `show(i)` draws the crosshair and writes
// the read-out of item i; `indexAt(event)` is the item under the pointer. Along a vertical chart (`vertical`: items
// top to bottom) ↓ steps forward, else → and ↑ do. Returns a function that shows an item as the keys do.

export function readOut(plot, count, show, indexAt, vertical = false) {
  let at = null;
  const go = (i) => {
    at = Math.max(0, Math.min(count - 1, i));
    show(at);
  };
  const forward = vertical
    ? { ArrowDown: 1, ArrowUp: -1, ArrowRight: 1, ArrowLeft: -1 }
    : { ArrowRight: 1, ArrowLeft: -1, ArrowUp: 1, ArrowDown: -1 };
  plot.addEventListener("pointermove", (event) => {
    const i = indexAt(event);
    if (i !== null) go(i);
  });
  plot.addEventListener("keydown", (event) => {
    const big = Math.max(1, Math.round(count / 10));
    const step = forward[event.key];
    if (step) go((at ?? -step) + step * (event.shiftKey ? big : 1));
    else if (event.key === "PageDown") go((at ?? 0) + big);
    else if (event.key === "PageUp") go((at ?? 0) - big);
    else if (event.key === "Home") go(0);
    else if (event.key === "End") go(count - 1);
    else return;
    event.preventDefault();
    event.stopPropagation(); // the inspector's arrow keys move its window
  });
  plot.addEventListener("focus", () => { if (at === null) go(0); });
  return go;
}
