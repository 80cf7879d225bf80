"""A GraphDiff as terminal text, JSON, Graphviz DOT or a self-contained HTML page.

Op and node names are data, never markup: DOT strings are quoted with
their backslashes, quotes and line breaks escaped, and HTML text and
attributes go through html.escape, so a graph whose names hold `<script>`,
quotes or newlines draws as text. The HTML page needs no network (inline
SVG, no script).
"""
import html
import json
from typing import Dict, List, Set, Tuple

from graphmod.cli.graph_diff import GraphDiff

COLORS = {"added": "#2e7d32", "removed": "#c62828", "rerouted": "#ef6c00", "context": "#9e9e9e"}
FILLS = {"added": "#e8f5e9", "removed": "#ffebee", "rerouted": "#fff3e0", "context": "#fafafa"}


def text(d: GraphDiff, verbose: bool = False, width: int = 100) -> str:
    """One line per converted variable (and for the shared ops), with the
    rules that made its changes: a screen for a model with dozens of
    features. verbose lists every change under its group."""
    j = d.to_json()
    lines = [f"graph diff: {d.before_ops} -> {d.after_ops} ops: +{j['added']} added, "
             f"-{j['removed']} removed, ~{j['rerouted']} rerouted"]
    for g in d.groups:
        counts = f"+{g.count('added')} -{g.count('removed')} ~{g.count('rerouted')}"
        rules = ", ".join(g.rules) or "rules unknown (no rewrite record)"
        line = f"  {g.name}: {counts}  [{rules}]"
        if len(line) <= width:
            lines.append(line)
        else:  # the rules on a line of their own
            lines.append(_clip(f"  {g.name}: {counts}", width))
            lines.append(_clip(f"      rules: {rules}", width))
        if verbose:
            for c in g.changes:
                mark = {"added": "+", "removed": "-", "rerouted": "~"}[c.kind]
                rule = f" ({c.rule})" if c.rule else ""
                detail = f": {c.detail}" if c.detail else ""
                lines.append(_clip(f"      {mark} {c.op} [{c.type}]{rule}{detail}", width))
    for s in d.skipped:
        lines.append(_clip(f"  left dense: {s['variable']}: {s['reason']}", width))
    return "\n".join(printable(line) for line in lines) + "\n"


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[:width - 3] + "..."


def printable(s: str) -> str:
    """Control characters (a crafted name's newlines, terminal escapes) shown, not obeyed."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def to_json(d: GraphDiff) -> str:
    return json.dumps(d.to_json(), indent=1) + "\n"


# --- drawings: the changed ops and their direct neighbours -----------------

def _neighbourhoods(d: GraphDiff, limit: int) -> List[Tuple[str, Dict[str, str], Set[tuple]]]:
    """Per group: (name, {node: kind}, {(from, to)} edges) of its changed ops
    (at most `limit`) and the ops they read or that read them."""
    consumers: Dict[str, List[str]] = {}
    for name, node in d.after.items():
        for x in node.input:
            consumers.setdefault(x.lstrip("^").split(":")[0], []).append(name)
    out = []
    for g in d.groups:
        kinds: Dict[str, str] = {}
        for c in g.changes[:limit]:
            kinds[c.op] = c.kind
        edges = set()
        for name, kind in list(kinds.items()):
            graph = d.before if kind == "removed" else d.after
            node = graph.get(name)
            for x in (node.input if node is not None else []):
                src = x.lstrip("^").split(":")[0]
                kinds.setdefault(src, "context")
                edges.add((src, name))
            if kind != "removed":
                for user in consumers.get(name, [])[:8]:
                    kinds.setdefault(user, "context")
                    edges.add((name, user))
        out.append((g.name, kinds, edges))
    return out


def _dot_string(s: str) -> str:
    """A DOT quoted string holding s as text."""
    s = s.replace("\\", "\\\\").replace('"', '\\"')
    s = s.replace("\r", "\\r").replace("\n", "\\n")
    return f'"{s}"'


def dot(d: GraphDiff, limit: int = 40) -> str:
    lines = ["digraph graphmod_diff {", "  rankdir=LR;", "  node [shape=box, style=filled, "
             "fontname=Helvetica, fontsize=10];"]
    types = {**{n: v.op for n, v in d.before.items()}, **{n: v.op for n, v in d.after.items()}}
    for i, (name, kinds, edges) in enumerate(_neighbourhoods(d, limit)):
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(f"    label={_dot_string(name)};")
        for node, kind in kinds.items():
            label = f"{node}\n{types.get(node, '?')}"
            lines.append(f"    {_dot_string(f'{i}/{node}')} [label={_dot_string(label)}, "
                         f"color={_dot_string(COLORS[kind])}, "
                         f"fillcolor={_dot_string(FILLS[kind])}];")
        for a, b in sorted(edges):
            lines.append(f"    {_dot_string(f'{i}/{a}')} -> {_dot_string(f'{i}/{b}')};")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _layers(kinds: Dict[str, str], edges: Set[tuple]) -> Dict[str, int]:
    """A column per node: 1 + the highest column of the nodes feeding it
    (edges inside the neighbourhood only; cycles cut)."""
    feeds: Dict[str, List[str]] = {n: [] for n in kinds}
    for a, b in edges:
        feeds[b].append(a)
    column: Dict[str, int] = {}

    def col(n, seen=()):
        if n in column:
            return column[n]
        if n in seen:
            return 0
        column[n] = 1 + max((col(a, seen + (n,)) for a in feeds[n]), default=-1)
        return column[n]
    for n in kinds:
        col(n)
    return column


def page(d: GraphDiff, title: str = "graphmod diff", limit: int = 40) -> str:
    """A self-contained HTML page: the summary, then per group an SVG
    drawing of its changed ops (coloured by kind) and their neighbours."""
    e = html.escape
    j = d.to_json()
    types = {**{n: v.op for n, v in d.before.items()}, **{n: v.op for n, v in d.after.items()}}
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{e(title)}</title><style>body{{font-family:Helvetica,Arial,sans-serif;"
        "margin:16px}} h2{{font-size:15px;margin:18px 0 4px}} .k{{display:inline-block;"
        "padding:1px 6px;margin-right:6px;border:1px solid}} td{{padding:1px 8px}}</style>"
        "</head><body>",
        f"<h1 style='font-size:18px'>{e(title)}</h1>",
        f"<p>{d.before_ops} &rarr; {d.after_ops} ops: {j['added']} added, {j['removed']} "
        f"removed, {j['rerouted']} rerouted. " + " ".join(
            f"<span class='k' style='border-color:{COLORS[k]};background:{FILLS[k]}'>"
            f"{k}</span>" for k in ("added", "removed", "rerouted", "context")) + "</p>",
        "<table>" + "".join(
            f"<tr><td>{e(g.name)}</td><td>+{g.count('added')} -{g.count('removed')} "
            f"~{g.count('rerouted')}</td><td>{e(', '.join(g.rules))}</td></tr>"
            for g in d.groups) + "</table>"]
    if d.skipped:
        parts.append("<h2>Left dense</h2><ul>" + "".join(
            f"<li>{e(s['variable'])}: {e(s['reason'])}</li>" for s in d.skipped) + "</ul>")
    for name, kinds, edges in _neighbourhoods(d, limit):
        parts.append(f"<h2>{e(name)}</h2>")
        parts.append(_svg(kinds, edges, types))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _svg(kinds: Dict[str, str], edges: Set[tuple], types: Dict[str, str]) -> str:
    e = html.escape
    column = _layers(kinds, edges)
    rows: Dict[int, int] = {}
    pos = {}
    box_w, box_h, gap_x, gap_y = 230, 34, 60, 12
    for n in sorted(kinds, key=lambda n: (column[n], n)):
        c = column[n]
        r = rows.get(c, 0)
        rows[c] = r + 1
        pos[n] = (10 + c * (box_w + gap_x), 10 + r * (box_h + gap_y))
    width = 20 + (max(column.values(), default=0) + 1) * (box_w + gap_x)
    height = 20 + max(rows.values(), default=1) * (box_h + gap_y)
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
           "style='border:1px solid #ddd'>"]
    for a, b in sorted(edges):
        (x1, y1), (x2, y2) = pos[a], pos[b]
        out.append(f"<line x1='{x1 + box_w}' y1='{y1 + box_h / 2}' x2='{x2}' "
                   f"y2='{y2 + box_h / 2}' stroke='#90a4ae' stroke-width='1'/>")
    for n, kind in kinds.items():
        x, y = pos[n]
        label = n if len(n) <= 34 else "..." + n[-31:]
        out.append(f"<g><title>{e(n)} [{e(types.get(n, '?'))}]</title>"
                   f"<rect x='{x}' y='{y}' width='{box_w}' height='{box_h}' rx='3' "
                   f"fill='{FILLS[kind]}' stroke='{COLORS[kind]}' stroke-width='2'/>"
                   f"<text x='{x + 5}' y='{y + 14}' font-size='11'>{e(label)}</text>"
                   f"<text x='{x + 5}' y='{y + 28}' font-size='10' fill='#555'>"
                   f"{e(types.get(n, '?'))}</text></g>")
    out.append("</svg>")
    return "".join(out)
