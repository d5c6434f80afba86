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
