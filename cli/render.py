"""Terminal rendering with rich: HLO text highlighting and tables."""
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
    highlighter = HloHighlighter()
    for line in text.splitlines():
        out.print(highlighter(line), markup=False, highlight=False)


def render_diff(rows, a_label: str, b_label: str) -> None:
    from rich.table import Table

    out = console()
    if not rows:
        out.print(f"no sharding differences between {a_label} and {b_label}")
        return
    table = Table(title=f"sharding differences: {a_label} -> {b_label}", show_lines=False)
    for col in ("computation", "instruction", "opcode", "A", "B", "status"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.computation, r.name, r.opcode, str(r.before) if r.before else "-",
                      str(r.after) if r.after else "-", r.status)
    out.print(table)
    out.print(f"{len(rows)} instruction(s) differ")


def render_explanation(result, name: str, alternatives: bool = True) -> None:
    from rich.table import Table

    out = console()
    chain = result.explain(name)
    if not chain:
        out.print(f"{name}: no sharding decision recorded")
        return
    head = chain[0]
    out.print(f"[bold]{name}[/bold]: [bold red]{head.sharding}[/bold red]", highlight=False)
    table = Table(title="how it got there (each row's source is the next row)")
    for col in ("instruction", "sharding", "direction", "rule", "from", "level/iter"):
        table.add_column(col, overflow="fold")
    for d in chain:
        table.add_row(d.name, str(d.sharding), d.direction, d.rule, ", ".join(d.sources) or "-",
                      f"{d.level}/{d.iteration}" if d.level >= 0 else "-")
    out.print(table)
    if alternatives and head.alternatives:
        alt = Table(title=f"candidates for {name} that lost")
        for col in ("sharding", "rule", "from", "why it lost"):
            alt.add_column(col, overflow="fold")
        for a in head.alternatives:
            alt.add_row(str(a.sharding), a.rule, ", ".join(a.sources) or "-", a.reason)
        out.print(alt)


def render_stats(stats, label: str) -> None:
    from rich.table import Table

    from hlo_spmd.stats import format_bytes, stats_rows

    table = Table(title=f"{label}: {stats.instruction_count} instructions, "
                        f"{stats.num_devices or '?'} devices")
    for col in ("item", "count", "in loops", "bytes/device", "bytes in loops", "max group",
                "detail"):
        table.add_column(col, overflow="fold", no_wrap=col in ("item", "bytes/device"))
    for r in stats_rows(stats):
        table.add_row(r["item"], _cell(r["count"]), _cell(r["in_loops"]),
                      format_bytes(r["bytes"]) if r["bytes"] is not None else "-",
                      format_bytes(r["bytes_in_loops"]) if r["bytes_in_loops"] else "-",
                      _cell(r["max_group"]), r["detail"] or "")
    console().print(table)


def render_stats_comparison(a, b, label_a: str, label_b: str) -> None:
    from rich.table import Table

    from hlo_spmd.stats import comparison_rows, format_bytes

    table = Table(title=f"{label_a} vs {label_b}")
    for col in ("item", "count A", "count B", "bytes/device A", "bytes/device B"):
        table.add_column(col, no_wrap=col == "item")
    for r in comparison_rows(a, b, ("a", "b")):
        table.add_row(r["item"], _cell(r["a_count"]), _cell(r["b_count"]),
                      format_bytes(r["a_bytes"]) if r["a_bytes"] is not None else "-",
                      format_bytes(r["b_bytes"]) if r["b_bytes"] is not None else "-")
    console().print(table)


def _cell(v) -> str:
    return "-" if v is None else str(v)
