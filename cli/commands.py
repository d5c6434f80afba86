"""Subcommands. Each parses options, calls the library, renders; no compiler logic here."""
from __future__ import annotations

import click

from hlo_spmd.ir.io import load_module, save_module
from hlo_spmd_cli.main import cli


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
    from hlo_spmd_cli.render import render_hlo  # rich: only the commands that render

    module = load_module(src)
    text = select_text(module, computation=computation, annotated_only=annotated_only,
                       instruction=instruction, print_metadata=not no_metadata)
    render_hlo(text, color=color)


@cli.command()
@click.argument("src", metavar="IN")
@click.option("-o", "--output", "out", required=True, metavar="OUT",
              help="Partitioned module; .hlo/.txt writes text, else HloModuleProto.")
@click.option("-n", "--num-partitions", type=int, default=None,
              help="Device count (default: what the shardings imply; a mismatch is an error).")
@click.option("--complete", is_flag=True,
              help="The module already has a sharding on every instruction: skip completion.")
@click.option("--format", "fmt", type=click.Choice(["text", "proto"]), default=None)
def partition(src: str, out: str, num_partitions: int | None, complete: bool,
              fmt: str | None) -> None:
    """Complete shardings and partition IN into one per-device SPMD program."""
    from hlo_spmd.passes.partition import partition as run_partition

    module = load_module(src, verify=True)
    result = run_partition(module, num_partitions, complete=complete)
    save_module(result.module, out, fmt)
    fallbacks = result.report.replicated_fallbacks
    click.echo(f"wrote {out}: {result.num_partitions} partitions, "
               f"{result.module.instruction_count()} instructions"
               + (f", {len(fallbacks)} ops replicated (no partitioned handler)" if fallbacks else ""),
               err=True)


@cli.command()
@click.argument("original", metavar="ORIGINAL")
@click.argument("partitioned", metavar="PARTITIONED")
@click.option("-n", "--num-partitions", type=int, default=None,
              help="Device count (default: the partitioned module's recorded shardings).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--rtol", type=float, default=None)
@click.option("--atol", type=float, default=None)
def verify(original: str, partitioned: str, num_partitions: int | None, seed: int,
           rtol: float | None, atol: float | None) -> None:
    """Run ORIGINAL on one CPU device and PARTITIONED on N, and compare (needs jax)."""
    from hlo_spmd.ir.io import module_bytes
    from hlo_spmd.runtime import verify as run_verify

    orig = load_module(original)
    part = load_module(partitioned)
    n = num_partitions or _recorded_partitions(part)
    report = run_verify(module_bytes(orig), module_bytes(part), n, seed=seed, rtol=rtol, atol=atol)
    click.echo(str(report))
    if not report.ok:
        raise SystemExit(1)


def _recorded_partitions(module) -> int:
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.sharding import from_proto

    counts = set()
    attrs = module.attrs
    shardings = list(attrs.spmd_parameters_shardings) if attrs is not None else []
    if attrs is not None and attrs.HasField("spmd_output_sharding"):
        shardings.append(attrs.spmd_output_sharding)
    for msg in shardings:
        s = from_proto(msg)
        for leaf in (s.tuple_elements if s.is_tuple else (s,)):
            if leaf.num_devices:
                counts.add(leaf.num_devices)
    if len(counts) != 1:
        raise HloSpmdError("cannot tell the partition count from the module; pass --num-partitions")
    return counts.pop()


@cli.command()
@click.argument("src", metavar="IN")
@click.option("-o", "--output", "out", required=True, metavar="OUT")
@click.option("--to-parameters", is_flag=True, help="Allow refining entry parameter shardings.")
@click.option("--to-output", is_flag=True, help="Allow refining the root's sharding.")
@click.option("--format", "fmt", type=click.Choice(["text", "proto"]), default=None)
def propagate(src: str, out: str, to_parameters: bool, to_output: bool, fmt: str | None) -> None:
    """Complete IN's shardings: every instruction gets one; user annotations are kept."""
    from hlo_spmd.passes.propagation import propagate as run_propagation

    module = load_module(src, verify=True)
    result = run_propagation(module, propagate_to_parameters=to_parameters,
                             propagate_to_output=to_output)
    save_module(module, out, fmt)
    sharded = sum(1 for i in module.instructions() if i.sharding is not None)
    click.echo(f"wrote {out}: {sharded}/{module.instruction_count()} instructions sharded, "
               f"{len(result.fixed)} user annotations kept, {result.iterations} iterations, "
               f"{result.seconds:.2f}s", err=True)


@cli.command()
@click.argument("src", metavar="IN")
@click.argument("name", metavar="NAME")
@click.option("--alternatives/--no-alternatives", default=True, show_default=True,
              help="List the candidate shardings that lost, and why.")
def explain(src: str, name: str, alternatives: bool) -> None:
    """Why NAME got its sharding: the chain of rules and neighbours back to the user
    annotations it came from."""
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.passes.propagation import propagate as run_propagation
    from hlo_spmd_cli.render import render_explanation

    module = load_module(src, verify=True)
    if module.find(name) is None:
        raise HloSpmdError(f"no instruction named {name!r} in {src}")
    result = run_propagation(module)
    render_explanation(result, name, alternatives)


@cli.command()
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--all", "show_all", is_flag=True,
              help="Also list instructions that exist in only one module.")
def diff(a: str, b: str, show_all: bool) -> None:
    """Per instruction, the shardings that differ between modules A and B."""
    from hlo_spmd.diff import sharding_diff
    from hlo_spmd_cli.render import render_diff

    rows = sharding_diff(load_module(a), load_module(b), include_missing=show_all)
    render_diff(rows, a, b)


@cli.command()
@click.argument("src", metavar="IN")
@click.option("--compare", "other", default=None, metavar="OTHER",
              help="A second partitioned module (e.g. XLA's) to show side by side.")
def stats(src: str, other: str | None) -> None:
    """What partitioning cost: collectives per kind (count, in loops, bytes per device)
    and the largest live tensor."""
    from hlo_spmd.stats import module_stats
    from hlo_spmd_cli.render import render_stats, render_stats_comparison

    a = module_stats(load_module(src))
    if other is None:
        render_stats(a, src)
    else:
        render_stats_comparison(a, module_stats(load_module(other)), src, other)
