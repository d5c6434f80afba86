"""Rendering: HLO text highlighting and tables, readable anywhere.

On a terminal tables are drawn with rich, wide enough that no cell (a sharding string
above all) is ever broken inside; when stdout is not a terminal (a pipe, a CI log) the
same tables are plain aligned text, one row a line, so they can be grepped.
"""
from __future__ import annotations

from rich.console import Console
from rich.highlighter import RegexHighlighter
from rich.theme import Theme


class HloHighlighter(RegexHighlighter):
    """Colours the parts of HLO text a reader scans for: names, opcodes, shapes, shardings."""

    base_style = "hlo."
    highlights = [
        r"(?P<keyword>\b(?:HloModule|ENTRY|ROOT)\b)",
        r"(?P<name>%?[A-Za-z_][\w.\-]*)(?= = )",
        r"= (?P<shape>\(?[a-z0-9]+\[[^\]]*\](?:\{[^}]*\})?)",
        r"\s(?P<opcode>[a-z][a-z0-9\-]*)\(",
        r"(?P<sharding>sharding=\{(?:[^{}]|\{[^{}]*\})*\})",
        r"(?P<metadata>metadata=\{[^}]*\})",
        r"(?P<comment>/\*.*?\*/)",
    ]


THEME = Theme({
    "hlo.keyword": "bold magenta",
    "hlo.name": "cyan",
    "hlo.shape": "green",
    "hlo.opcode": "bold yellow",
    "hlo.sharding": "bold red",
    "hlo.metadata": "dim",
    "hlo.comment": "dim italic",
})


def console(color: bool | None = None, stderr: bool = False) -> Console:
    kwargs = {"theme": THEME, "stderr": stderr, "soft_wrap": True}
    if color is not None:
        kwargs["force_terminal"] = color
        kwargs["no_color"] = not color
    return Console(**kwargs)


def render_hlo(text: str, color: bool | None = None) -> None:
    out = console(color)
    if not out.is_terminal and not color:
        out.file.write(text if text.endswith("\n") or not text else text + "\n")
        return
    highlighter = HloHighlighter()
    for line in text.splitlines():
        out.print(highlighter(line), markup=False, highlight=False)


def _is_terminal(out: Console) -> bool:
    return out.is_terminal


def emit_table(title: str | None, columns: list[str], rows: list[list[str]],
               out: Console | None = None) -> None:
    """One table: rich on a terminal (never wrapping a cell), plain text otherwise."""
    out = out or console()
    if not _is_terminal(out):
        out.file.write(plain_table(title, columns, rows))
        out.file.flush()
        return
    from rich.measure import Measurement
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, no_wrap=True, overflow="ignore")
    for r in rows:
        table.add_row(*r)
    need = Measurement.get(out, out.options.update(width=1 << 16), table).maximum
    # Wider than the terminal if a row needs it: the terminal may fold the line, but the
    # text itself keeps every sharding whole (copy, grep and logs see it intact).
    width = out.width
    out.width = max(width, need)
    try:
        out.print(table, crop=False, markup=False, highlight=False)
    finally:
        out.width = width


def plain_table(title: str | None, columns: list[str], rows: list[list[str]]) -> str:
    """Aligned columns, two spaces apart; the last column is never padded."""
    widths = [len(c) for c in columns]
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))
    lines = [title] if title else []

    def line(cells):
        parts = [c.ljust(widths[i]) if i < len(cells) - 1 else c for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    lines.append(line(columns))
    for r in rows:
        lines.append(line(r))
    return "\n".join(lines) + "\n"


def echo(text: str, out: Console | None = None) -> None:
    """A line of plain text (no markup interpretation, never wrapped)."""
    out = out or console()
    if _is_terminal(out):
        out.print(text, markup=False, highlight=False, soft_wrap=True)
    else:
        out.file.write(text + "\n")


def _with_mesh(s, shape, mesh) -> str:
    from hlo_spmd.annotations.cli_spec import mesh_form_of

    form = mesh_form_of(s, shape, mesh) if mesh else None
    return "-" if form is None else form


def render_diff(rows, a_label: str, b_label: str, mesh=None, shapes=None) -> None:
    if not rows:
        echo(f"no sharding differences between {a_label} and {b_label}")
        return
    cols = ["computation", "instruction", "opcode", "A", "B", "status"]
    if mesh:
        cols[5:5] = ["A (mesh)", "B (mesh)"]
    table = []
    for r in rows:
        row = [r.computation, r.name, r.opcode, str(r.before) if r.before else "-",
               str(r.after) if r.after else "-", r.status]
        if mesh:
            shape = (shapes or {}).get(r.name)
            row[5:5] = [_with_mesh(r.before, shape, mesh), _with_mesh(r.after, shape, mesh)]
        table.append(row)
    emit_table(f"sharding differences: {a_label} -> {b_label}", cols, table)
    echo(f"{len(rows)} instruction(s) differ")


def diff_json(rows, mesh=None, shapes=None) -> list[dict]:
    out = []
    for r in rows:
        d = {"computation": r.computation, "instruction": r.name, "opcode": r.opcode,
             "a": str(r.before) if r.before else None, "b": str(r.after) if r.after else None,
             "status": r.status}
        if mesh:
            shape = (shapes or {}).get(r.name)
            from hlo_spmd.annotations.cli_spec import mesh_form_of

            d["a_mesh"] = mesh_form_of(r.before, shape, mesh)
            d["b_mesh"] = mesh_form_of(r.after, shape, mesh)
        out.append(d)
    return out


def explanation_json(result, name: str, mesh=None, shapes=None) -> dict:
    from hlo_spmd.annotations.cli_spec import mesh_form_of

    chain = result.explain(name)
    out = {"instruction": name, "sharding": str(chain[0].sharding) if chain else None,
           "chain": [], "alternatives": []}
    for d in chain:
        row = {"instruction": d.name, "sharding": str(d.sharding), "direction": d.direction,
               "rule": d.rule, "from": list(d.sources),
               "level": d.level if d.level >= 0 else None,
               "iteration": d.iteration if d.level >= 0 else None}
        if mesh:
            row["mesh"] = mesh_form_of(d.sharding, (shapes or {}).get(d.name), mesh)
        out["chain"].append(row)
    if chain:
        for a in chain[0].alternatives:
            out["alternatives"].append({"sharding": str(a.sharding), "rule": a.rule,
                                        "from": list(a.sources), "why": a.reason})
    if mesh and chain:
        out["mesh"] = mesh_form_of(chain[0].sharding, (shapes or {}).get(name), mesh)
    return out


def render_explanation(result, name: str, alternatives: bool = True, mesh=None,
                       shapes=None) -> None:
    chain = result.explain(name)
    if not chain:
        echo(f"{name}: no sharding decision recorded")
        return
    head = chain[0]
    extra = ""
    if mesh:
        form = _with_mesh(head.sharding, (shapes or {}).get(name), mesh)
        extra = f"  (mesh: {form})"
    echo(f"{name}: {head.sharding}{extra}")
    cols = ["instruction", "sharding", "direction", "rule", "from", "level/iter"]
    if mesh:
        cols.insert(2, "mesh")
    rows = []
    for d in chain:
        row = [d.name, str(d.sharding), d.direction, d.rule, ", ".join(d.sources) or "-",
               f"{d.level}/{d.iteration}" if d.level >= 0 else "-"]
        if mesh:
            row.insert(2, _with_mesh(d.sharding, (shapes or {}).get(d.name), mesh))
        rows.append(row)
    emit_table("how it got there (each row's source is the next row)", cols, rows)
    if alternatives and head.alternatives:
        emit_table(f"candidates for {name} that lost", ["sharding", "rule", "from", "why it lost"],
                   [[str(a.sharding), a.rule, ", ".join(a.sources) or "-", a.reason]
                    for a in head.alternatives])


def render_stats(stats, label: str) -> None:
    from hlo_spmd.stats import format_bytes, stats_rows

    rows = []
    for r in stats_rows(stats):
        rows.append([r["item"], _cell(r["count"]), _cell(r["in_loops"]),
                     format_bytes(r["bytes"]) if r["bytes"] is not None else "-",
                     format_bytes(r["bytes_in_loops"]) if r["bytes_in_loops"] else "-",
                     _cell(r["max_group"]), r["detail"] or ""])
    emit_table(f"{label}: {stats.instruction_count} instructions, "
               f"{stats.num_devices or '?'} devices",
               ["item", "count", "in loops", "bytes/device", "bytes in loops", "max group",
                "detail"], rows)


def render_stats_comparison(a, b, label_a: str, label_b: str) -> None:
    from hlo_spmd.stats import comparison_rows, format_bytes

    rows = []
    for r in comparison_rows(a, b, ("a", "b")):
        rows.append([r["item"], _cell(r["a_count"]), _cell(r["b_count"]),
                     format_bytes(r["a_bytes"]) if r["a_bytes"] is not None else "-",
                     format_bytes(r["b_bytes"]) if r["b_bytes"] is not None else "-"])
    emit_table(f"{label_a} vs {label_b}",
               ["item", "count A", "count B", "bytes/device A", "bytes/device B"], rows)


def render_grid(grid, out: Console | None = None) -> None:
    """``show --grid``: which device holds which tile (see hlo_spmd.inspect.tile_grid)."""
    echo(grid["title"], out)
    if grid.get("note"):
        echo(grid["note"], out)
    emit_table(None, grid["columns"], grid["rows"], out)


def _cell(v) -> str:
    return "-" if v is None else str(v)


def render_search(report: dict) -> None:
    """``search``: the chosen shardings, then the winner's and the baselines' figures."""
    from hlo_spmd.stats import format_bytes

    rows = []
    for p in report["parameters"]:
        rows.append([f"#{p['parameter']}", p["name"], p["shape"], p["partition_spec"] or "-",
                     p["hlo"] or "-", "kept" if p["fixed"] else ""])
    for o in report["outputs"]:
        rows.append(["out" if o["output"] is None else f"out#{o['output']}", "", o["shape"],
                     o["partition_spec"] or "-", o["hlo"] or "-", ""])
    for c in report.get("constraints", ()):
        rows.append(["constraint", c["name"], c["shape"], c["partition_spec"], c["hlo"], ""])
    emit_table(f"chosen shardings on mesh {report['mesh']}",
               ["target", "name", "shape", "mesh axes", "HLO sharding", ""], rows)
    fig = [["search", format_bytes(report["winner"]["bytes_per_device"]),
            _cell(report["winner"]["collectives"]), format_bytes(report["winner"]["peak_bytes"]),
            "yes" if report["winner"]["fits"] else "no"]]
    without = report["search"].get("without_constraints")
    if report.get("constraints") and without is not None:
        fig.append(["search without constraints", format_bytes(without["bytes_per_device"]),
                    _cell(without["collectives"]), format_bytes(without["peak_bytes"]),
                    "yes" if without["fits"] else "no"])
    for name, b in report["baselines"].items():
        fig.append([name, format_bytes(b["bytes_per_device"]), _cell(b["collectives"]),
                    format_bytes(b["peak_bytes"]), "yes" if b["fits"] else "no"])
    limit = report["memory_limit"]
    emit_table(f"per device (memory limit {format_bytes(limit)})",
               ["program", "bytes moved", "collectives", "peak memory", "fits"], fig)
