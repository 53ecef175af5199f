// The model as a graph: the server sends the module tree once as compact JSON (web/views/module_graph.py's
// graph_data) and this script builds the boxes of the open modules only; a folded module's children are built when
// it is first opened, so a 2,000-module model costs the DOM of the few boxes on screen, not 2,000 of them.

const section = document.querySelector("section.module-graph");
if (section) {
  const data = JSON.parse(section.querySelector("script.graph-data").textContent);
  const [ON_FIRST, ON_CULPRIT, TARGET, MATCHED, OPEN] = [1, 2, 4, 8, 16];

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
      let built = false;
      const build = () => {
        if (built) return;
        built = true;
        list.append(...children.map((c) => item(c, path)));
      };
      if (flags & OPEN) {
        build();
        details.open = true;
      }
      summary.addEventListener("click", build); // before the default action opens it: the children show at once
      details.addEventListener("toggle", build);
      li.append(details);
    }
    return li;
  }

  section.querySelector("ul.graph-root").append(...data.roots.map((r) => item(r, "")));
}
