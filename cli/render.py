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
