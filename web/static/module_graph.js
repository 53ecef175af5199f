// The model as a graph: the server sends the module tree once as compact JSON (web/views/module_graph.py's
// graph_data) and this script builds the boxes of the open modules only; a folded module's children are built when
// it is first opened, so a 2,000-module model costs the DOM of the few boxes on screen, not 2,000 of them.

const section = document.querySelector("section.module-graph");
if (section) {
  const data = JSON.parse(section.querySelector(".graph-data").dataset.graph); // single-quoted: tojson escapes '
  const [ON_FIRST, ON_CULPRIT, TARGET, MATCHED, OPEN, TO_MATCH] = [1, 2, 4, 8, 16, 32];
  // with a search, the modules opened for it show the way to the matches (and to the first divergence and the
  // culprits); their other children wait behind one button, so 154 matches do not build 1,400 boxes
  const shown = data.query ? (flags) => flags & (TO_MATCH | ON_FIRST | ON_CULPRIT) : () => true;

  function element(tag, className, text) {
    const made = document.createElement(tag);
    if (className) made.className = className;
    if (text !== undefined) made.textContent = text;
    return made;
  }

  // one module: [relative path, name, shade, verdict, error, error kind, pair id, flags, modules inside, children]
  function item(node, parentPath) {
    const [relative, name, shade, verdict, error, kind, pairId, flags, inside, children] = node;
    const path = parentPath + relative;
    const onPath = [flags & ON_FIRST ? "first" : "", flags & ON_CULPRIT ? "culprit" : ""].filter(Boolean).join(" ");
    const li = element("li", onPath ? "on-path" : "");
    const box = element("div", `gnode shade-${shade}`);
    if (onPath) box.className += ` on-path ${onPath}`;
    if (flags & TARGET) box.classList.add("target");
    if (flags & MATCHED) box.classList.add("matched");
    box.dataset.module = path;
    const label = pairId === null ? element("span", "gname", name) : element("a", "", name);
    if (pairId !== null) label.href = `/pairs/${pairId}`;
    label.title = path;
    const meta = element("span", "gmeta");
    const verdictName = data.verdicts[verdict];
    if (verdictName !== "none") meta.append(element("span", `badge ${verdictName}`, verdictName), " ");
    if (error) meta.append(`${data.kinds[kind]} ${error}`);
    if (flags & TARGET) {
      meta.append(" ", element("strong", "", flags & ON_FIRST ? "first divergence" : "culprit"));
    }
    box.append(label, meta);
    li.append(box);
    if (children.length) {
      const details = element("details");
      const summary = element("summary", "gcount", `${inside} modules inside`);
      const list = element("ul");
      details.append(summary, list);
      const made = new Map(); // child index -> its li, once built
      // builds the children that `only` (their flags) keeps, every one without it; what is left waits behind a button
      const build = (only = null) => {
        const fresh = [];
        children.forEach((c, i) => {
          if (made.has(i) || (only !== null && !only(c[7]))) return;
          made.set(i, item(c, path));
          fresh.push(made.get(i));
        });
        const items = [...made.keys()].sort((x, y) => x - y).map((i) => made.get(i));
        const rest = children.length - made.size;
        if (rest > 0) {
          const more = element("li", "others");
          const button = element("button", "secondary", `${rest} other module${rest === 1 ? "" : "s"} here`);
          button.type = "button";
          button.addEventListener("click", () => build()?.querySelector("a, summary")?.focus());
          more.append(button);
          items.push(more);
        }
        list.replaceChildren(...items);
        return fresh[0];
      };
      if (flags & OPEN) {
        build(shown);
        details.open = true;
      }
      // on a click (Enter and Space on the summary click it too), before the default action opens it: the
      // children show at once
      summary.addEventListener("click", () => { if (!details.open && made.size < children.length) build(); });
      li.append(details);
    }
    return li;
  }

  section.querySelector("ul.graph-root").append(...data.roots.map((r) => item(r, "")));
}
