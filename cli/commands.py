"""Subcommands. Each parses options, calls the library, renders; no compiler logic here."""
from __future__ import annotations

import click

from hlo_spmd.ir.io import load_module, save_module
from hlo_spmd_cli.main import cli
from hlo_spmd_cli.render import render_hlo


@cli.command()
@click.argument("src", metavar="IN")
@click.option("-o", "--output", "out", required=True, metavar="OUT",
              help="Output file; .hlo/.txt writes HLO text, anything else a serialized HloModuleProto.")
@click.option("--format", "fmt", type=click.Choice(["text", "proto"]), default=None,
              help="Force the output format instead of deciding from OUT's suffix.")
@click.option("--no-verify", is_flag=True, help="Skip the structural verifier on the input.")
def convert(src: str, out: str, fmt: str | None, no_verify: bool) -> None:
    """Convert between HloModuleProto (.pb, or XLA's HloProto/HloSnapshot dumps) and HLO text."""
    module = load_module(src, verify=not no_verify)
    save_module(module, out, fmt)
    click.echo(f"wrote {out}", err=True)


@cli.command()
@click.argument("src", metavar="IN")
@click.option("-c", "--computation", default=None, help="Show only this computation.")
@click.option("-a", "--annotated-only", is_flag=True,
              help="Show only instructions that carry a sharding.")
@click.option("-i", "--instruction", default=None,
              help="Show one instruction with its operands and users.")
@click.option("--no-metadata", is_flag=True, help="Omit metadata={...} attributes.")
@click.option("--color/--no-color", default=None, help="Force or disable highlighting.")
def show(src: str, computation: str | None, annotated_only: bool, instruction: str | None,
         no_metadata: bool, color: bool | None) -> None:
    """Print a module in XLA's HLO syntax, highlighted, with every sharding shown."""
    from hlo_spmd.inspect import select_text

    module = load_module(src)
    text = select_text(module, computation=computation, annotated_only=annotated_only,
                       instruction=instruction, print_metadata=not no_metadata)
    render_hlo(text, color=color)
