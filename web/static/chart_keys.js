// What the pages' own charts share: one tab stop where the arrow keys step an item (with Shift, a page of items),
// PageUp and PageDown a page (a tenth of the items unless the chart says otherwise), Home and End go to the ends,
// and Enter opens the item where the chart has somewhere to go (`stepKeys`); and, for the charts drawn here (the
// error profile, the histogram; the uPlot charts have uPlot's cursor), a read-out of the item under the pointer
// (`readOut`).

// Keys on `target` that step through `count` items: `go(i)` shows item i. Along a vertical chart (`vertical`: items
// top to bottom) ↓ steps forward, else → (and ↑, unless `upDown` is false) does. `from`: the item the keys start
// at (null: none, the first key goes to an end); `enter(i)`: what Enter does at item i. Returns `move(i)`, which
// shows an item as the keys do, and `at()`, the item shown (null before any).
export function stepKeys(target, count, go, options = {}) {
  const { vertical = false, upDown = true, page = Math.max(1, Math.round(count / 10)), from = null, enter = null } = options;
  let at = from;
  const move = (i) => {
    at = Math.max(0, Math.min(count - 1, i));
    go(at);
  };
  const forward = vertical
    ? { ArrowDown: 1, ArrowUp: -1, ArrowRight: 1, ArrowLeft: -1 }
    : upDown
      ? { ArrowRight: 1, ArrowLeft: -1, ArrowUp: 1, ArrowDown: -1 }
      : { ArrowRight: 1, ArrowLeft: -1 };
  target.addEventListener("keydown", (event) => {
    const step = forward[event.key];
    if (step) move((at ?? -step) + step * (event.shiftKey ? page : 1));
    else if (event.key === "PageDown") move((at ?? 0) + page);
    else if (event.key === "PageUp") move((at ?? 0) - page);
    else if (event.key === "Home") move(0);
    else if (event.key === "End") move(count - 1);
    else if (event.key === "Enter" && enter) enter(at ?? 0);
    else return;
    event.preventDefault();
    event.stopPropagation(); // the inspector's arrow keys move its window
  });
  return { move, at: () => at, set: (i) => { at = i; } };
}

// `show(i)` draws the crosshair and writes the read-out of item i; `indexAt(event)` is the item under the pointer.
// Returns a function that shows an item as the keys do.
export function readOut(plot, count, show, indexAt, vertical = false) {
  const keys = stepKeys(plot, count, show, { vertical });
  plot.addEventListener("pointermove", (event) => {
    const i = indexAt(event);
    if (i !== null) keys.move(i);
  });
  plot.addEventListener("focus", () => { if (keys.at() === null) keys.move(0); });
  return keys.move;
}
