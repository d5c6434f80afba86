"""Subcommands. Each parses options, calls the library, renders; no compiler logic here."""
from __future__ import annotations

import click

from hlo_spmd_cli.common import read_module as load_module
from hlo_spmd_cli.common import label, status, write_module
from hlo_spmd_cli.main import cli

_QUIET = click.option("-q", "--quiet", is_flag=True, help="No status lines on stderr.")
_MESH = click.option("--mesh", default=None, metavar="AXES",
                     help="Device mesh, e.g. 'data=2,model=4' (for --shard, and to print "
                          "shardings in mesh-axis form).")
_SHARD = click.option("--shard", "shards", multiple=True, metavar="TARGET=SPEC",
                      help="Annotate TARGET (instruction name, '#K' entry parameter, 'out' / "
                           "'out#K' result) with SPEC: one entry per dim, a mesh axis, "
                           "'a+b' (major first) or '_'. Repeatable.")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
# CI gates (SIZE: 1.5MiB, 2GB, 123456; hlo_spmd.units.parse_size). Over the limit: one
# line, exit code 1, output still written. The figures are the ones `stats` prints.
_MAX_BYTES = click.option("--max-bytes-per-device", default=None, metavar="SIZE",
                          help="CI gate: fail (exit 1) when the collectives move more than "
                               "SIZE per device (e.g. 1.5MiB, 2GB, 123456).")
_MAX_PEAK = click.option("--max-peak-memory", default=None, metavar="SIZE",
                         help="CI gate: fail (exit 1) when the estimated peak live bytes "
                              "per device exceed SIZE.")


def _known_mesh(module, mesh: str | None):
    """The mesh given on the command line, else the module's Shardy mesh, else None."""
    from hlo_spmd.annotations.cli_spec import module_mesh, parse_mesh

    return parse_mesh(mesh) if mesh else module_mesh(module)


def _shapes(*modules) -> dict:
    out = {}
    for m in modules:
        for i in m.instructions():
            out.setdefault(i.name, i.shape)
    return out


@cli.command()
@click.argument("src", metavar="IN")
@click.option("-o", "--output", "out", required=True, metavar="OUT",
              help="Output file; .hlo/.txt writes HLO text, anything else a serialized HloModuleProto.")
@click.option("--format", "fmt", type=click.Choice(["text", "proto"]), default=None,
              help="Force the output format instead of deciding from OUT's suffix.")
@click.option("--no-verify", is_flag=True, help="Skip the structural verifier on the input.")
@_QUIET
def convert(src: str, out: str, fmt: str | None, no_verify: bool, quiet: bool) -> None:
    """Convert between HloModuleProto (.pb, or XLA's HloProto/HloSnapshot dumps) and HLO text.
    IN / OUT may be '-' (stdin / stdout)."""
    module = load_module(src, verify=not no_verify)
    write_module(module, out, fmt)
    status(f"wrote {label(out)}", quiet)


@cli.command()
@click.argument("src", metavar="IN")
@click.option("-c", "--computation", default=None, help="Show only this computation.")
@click.option("-a", "--annotated-only", is_flag=True,
              help="Show only instructions that carry a sharding.")
@click.option("-i", "--instruction", default=None,
              help="Show one instruction with its operands and users.")
@click.option("--no-metadata", is_flag=True, help="Omit metadata={...} attributes.")
@click.option("--color/--no-color", default=None, help="Force or disable highlighting.")
@click.option("--grid", "grid", default=None, metavar="NAME",
              help="Draw which device holds which tile of instruction NAME.")
@_MESH
def show(src: str, computation: str | None, annotated_only: bool, instruction: str | None,
         no_metadata: bool, color: bool | None, grid: str | None, mesh: str | None) -> None:
    """Print a module in XLA's HLO syntax, highlighted, with every sharding shown (and in
    mesh-axis form when a mesh is known: --mesh, or the module's Shardy mesh)."""
    from hlo_spmd.inspect import select_text
    from hlo_spmd_cli.render import render_hlo  # rich: only the commands that render

    module = load_module(src)
    if grid is not None:
        from hlo_spmd.errors import HloSpmdError
        from hlo_spmd_cli.grid import tile_grid
        from hlo_spmd_cli.render import render_grid

        inst = module.find(grid)
        if inst is None:
            raise HloSpmdError(f"no instruction named {grid!r} in {src}")
        render_grid(tile_grid(inst))
        return
    text = select_text(module, computation=computation, annotated_only=annotated_only,
                       instruction=instruction, print_metadata=not no_metadata)
    axes = _known_mesh(module, mesh)
    if axes:
        text = _annotate_mesh_forms(module, text, axes)
    render_hlo(text, color=color)


def _annotate_mesh_forms(module, text: str, axes) -> str:
    """Append ``/* mesh: data,_ */`` to each instruction line that has a sharding."""
    import re

    from hlo_spmd.annotations.cli_spec import mesh_form_of

    forms = {}
    for inst in module.instructions():
        if inst.sharding is not None:
            form = mesh_form_of(inst.sharding, inst.shape, axes)
            if form is not None:
                forms[inst.name] = form
    name_re = re.compile(r"^\s*(?:ROOT\s+)?%?([^\s=]+)\s*=")
    out = []
    for line in text.splitlines():
        m = name_re.match(line)
        if m and "sharding=" in line and m.group(1) in forms:
            line = f"{line} /* mesh: {forms[m.group(1)]} */"
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


@cli.command()
@click.argument("src", metavar="IN")
@click.option("-o", "--output", "out", required=True, metavar="OUT",
              help="Partitioned module; .hlo/.txt writes text, else HloModuleProto; '-' stdout.")
@click.option("-n", "--num-partitions", type=int, default=None,
              help="Device count (default: what the shardings imply; a mismatch is an error).")
@click.option("--complete", is_flag=True,
              help="The module already has a sharding on every instruction: skip completion.")
@click.option("--format", "fmt", type=click.Choice(["text", "proto"]), default=None)
@click.option("--report", "report_path", default=None, metavar="FILE.json",
              help="Write every inserted collective (kind, cost, cause, the op it serves) "
                   "as JSON; '-' for stdout.")
@click.option("--windowed-einsum-threshold", "windowed_mib", type=click.FloatRange(min=0),
              default=None, metavar="MiB",
              help="Dots whose operand all-gather exceeds MiB per device loop over "
                   "collective-permutes instead (windowed einsum; default: off).")
@click.option("--bidirectional", is_flag=True,
              help="Windowed einsum with pieces moving both ways round the ring.")
@click.option("--combine-threshold", "combine_mib", type=click.FloatRange(min=0),
              default=30.0, show_default=True, metavar="MiB",
              help="Combine independent collectives of one kind and device group into "
                   "one, up to MiB per combined collective (0: off).")
@_MESH
@_SHARD
@_QUIET
@_MAX_BYTES
@_MAX_PEAK
@click.option("--strict", is_flag=True,
              help="CI gate: any warning (a full rematerialization, an op replicated for "
                   "want of a partitioned handler, an unknown custom-call) fails the run "
                   "(exit code 1; the output is still written).")
@click.option("--propagate-to-output", "propagate_to_output", is_flag=False,
              flag_value="all", default=None, metavar="[WHICH]",
              help="Let completion choose the outputs' shardings (XLA's "
                   "allow_spmd_sharding_propagation_to_output), e.g. for a jax.jit module "
                   "whose out_shardings were left unspecified. WHICH: all (alone), none, "
                   "output indices 0,2, or booleans true,false. Default: the module's own "
                   "setting, else none.")
@click.option("--propagate-to-params", "propagate_to_params", is_flag=False,
              flag_value="all", default=None, metavar="[WHICH]",
              help="Let completion choose the entry parameters' shardings (XLA's "
                   "allow_spmd_sharding_propagation_to_parameters); WHICH as above, "
                   "parameter numbers.")
def partition(src: str, out: str, num_partitions: int | None, complete: bool,
              fmt: str | None, report_path: str | None, windowed_mib: float | None,
              bidirectional: bool, combine_mib: float, mesh: str | None,
              shards: tuple[str, ...], quiet: bool, max_bytes_per_device: str | None,
              max_peak_memory: str | None, strict: bool, propagate_to_output: str | None,
              propagate_to_params: str | None) -> None:
    """Complete shardings and partition IN into one per-device SPMD program.
    IN may be '-' (stdin)."""
    from hlo_spmd_cli.partition_run import run_partition

    run_partition(src, out, num_partitions, complete, fmt, report_path, windowed_mib,
                  bidirectional, combine_mib, mesh, shards, quiet, max_bytes_per_device,
                  max_peak_memory, strict, propagate_to_output, propagate_to_params)


@cli.command()
@click.argument("original", metavar="ORIGINAL")
@click.argument("partitioned", metavar="PARTITIONED")
@click.option("-n", "--num-partitions", type=int, default=None,
              help="Device count (default: the partitioned module's recorded shardings).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--rtol", type=float, default=None)
@click.option("--atol", type=float, default=None)
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True,
              metavar="K", help="Run PARTITIONED as K OS processes with N/K CPU devices "
                                "each, joined through jax.distributed on 127.0.0.1, as a "
                                "multi-host job runs it.")
@click.option("--xla-logs", is_flag=True, help="Let XLA's own C++ log lines through to stderr.")
def verify(original: str, partitioned: str, num_partitions: int | None, seed: int,
           rtol: float | None, atol: float | None, processes: int, xla_logs: bool) -> None:
    """Run ORIGINAL on one CPU device and PARTITIONED on N, and compare (needs jax).

    The verdict allows the rounding a reassociated sum may show: |out - ref| <=
    8 eps |ref| + 16 eps sqrt(K) rms(ref), eps the program's coarsest float precision,
    K the largest reduction feeding the output; integers exact. --rtol/--atol replace
    that rule."""
    from hlo_spmd.ir.io import module_bytes
    from hlo_spmd_cli.xla_quiet import quiet_xla

    orig = load_module(original, verify=True)
    part = load_module(partitioned, verify=True)
    n = num_partitions or _recorded_partitions(part, orig)
    with quiet_xla(enabled=not xla_logs):
        from hlo_spmd.runtime import verify as run_verify

        report = run_verify(module_bytes(orig), module_bytes(part), n, seed=seed, rtol=rtol,
                            atol=atol, processes=processes)
    click.echo(str(report))
    if not report.ok:
        raise SystemExit(1)


def _recorded_partitions(module, original) -> int:
    """The device count the partitioned module records; when it records none (HLO
    text), the count the original's shardings imply."""
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.passes.partition import infer_num_partitions
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
    if not counts and not shardings:
        try:
            return infer_num_partitions(original, None)
        except HloSpmdError:
            pass
    if len(counts) != 1:
        raise HloSpmdError("cannot tell the partition count from the module; pass --num-partitions")
    return counts.pop()


@cli.command()
@click.argument("src", metavar="IN")
@click.option("-o", "--output", "out", default=None, metavar="OUT",
              help="The completed module ('-' stdout); optional with --json.")
@click.option("--to-parameters", is_flag=True, help="Allow refining entry parameter shardings.")
@click.option("--to-output", is_flag=True, help="Allow refining the root's sharding.")
@click.option("--format", "fmt", type=click.Choice(["text", "proto"]), default=None)
@_MESH
@_SHARD
@_JSON
@_QUIET
def propagate(src: str, out: str | None, to_parameters: bool, to_output: bool,
              fmt: str | None, mesh: str | None, shards: tuple[str, ...], as_json: bool,
              quiet: bool) -> None:
    """Complete IN's shardings: every instruction gets one; user annotations are kept."""
    from hlo_spmd.errors import InputError
    from hlo_spmd.passes.propagation import propagate as run_propagation
    from hlo_spmd_cli.common import Progress, write_json

    if out is None and not as_json:
        raise InputError("give -o OUT (or --json)")
    if as_json and out == "-":
        raise InputError("--json prints to stdout; give -o a file")
    with Progress(quiet) as progress:
        progress.step(f"loading {src}")
        module = load_module(src, verify=True)
        axes = None
        if mesh or shards:
            from hlo_spmd.api import annotate

            annotate(module, mesh, list(shards))
        axes = _known_mesh(module, mesh)
        progress.step("completing shardings")
        result = run_propagation(module, propagate_to_parameters=to_parameters,
                                 propagate_to_output=to_output)
        if out is not None:
            progress.step(f"writing {label(out)}")
            write_module(module, out, fmt)
    sharded = sum(1 for i in module.instructions() if i.sharding is not None)
    if as_json:
        from hlo_spmd.annotations.cli_spec import mesh_form_of

        fixed = set(result.fixed) if not isinstance(result.fixed, dict) else set(result.fixed)
        rows = []
        for comp in module.computations:
            for i in comp.instructions:
                row = {"computation": comp.name, "instruction": i.name, "opcode": i.opcode,
                       "sharding": str(i.sharding) if i.sharding is not None else None}
                if axes:
                    row["mesh"] = mesh_form_of(i.sharding, i.shape, axes)
                rows.append(row)
        write_json({"module": module.name, "sharded": sharded,
                    "instructions_total": module.instruction_count(),
                    "user_annotations_kept": len(fixed), "iterations": result.iterations,
                    "instructions": rows}, "-")
    if out is not None:
        status(f"wrote {label(out)}: {sharded}/{module.instruction_count()} instructions sharded, "
               f"{len(result.fixed)} user annotations kept, {result.iterations} iterations, "
               f"{result.seconds:.2f}s", quiet)


@cli.command()
@click.argument("src", metavar="IN")
@click.argument("name", metavar="NAME")
@click.option("--alternatives/--no-alternatives", default=True, show_default=True,
              help="List the candidate shardings that lost, and why.")
@_MESH
@_JSON
def explain(src: str, name: str, alternatives: bool, mesh: str | None, as_json: bool) -> None:
    """Why NAME got its sharding: the chain of rules and neighbours back to the user
    annotations it came from."""
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.passes.propagation import propagate as run_propagation
    from hlo_spmd_cli.render import explanation_json, render_explanation

    module = load_module(src, verify=True)
    if module.find(name) is None:
        raise HloSpmdError(f"no instruction named {name!r} in {src}")
    axes = _known_mesh(module, mesh)
    shapes = _shapes(module)
    result = run_propagation(module)
    if as_json:
        from hlo_spmd_cli.common import write_json

        write_json(explanation_json(result, name, axes, shapes), "-")
        return
    render_explanation(result, name, alternatives, axes, shapes)


@cli.command()
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--all", "show_all", is_flag=True,
              help="Also list instructions that exist in only one module.")
@_MESH
@_JSON
def diff(a: str, b: str, show_all: bool, mesh: str | None, as_json: bool) -> None:
    """Per instruction, the shardings that differ between modules A and B."""
    from hlo_spmd.diff import sharding_diff
    from hlo_spmd_cli.render import diff_json, render_diff

    ma, mb = load_module(a), load_module(b)
    axes = _known_mesh(ma, mesh) or _known_mesh(mb, None)
    shapes = _shapes(ma, mb)
    rows = sharding_diff(ma, mb, include_missing=show_all)
    if as_json:
        from hlo_spmd_cli.common import write_json

        write_json({"a": a, "b": b, "differences": diff_json(rows, axes, shapes)}, "-")
        return
    render_diff(rows, a, b, axes, shapes)


@cli.command()
@click.argument("opcode", metavar="[OPCODE]", required=False)
@_JSON
def rules(opcode: str | None, as_json: bool) -> None:
    """For every opcode and custom-call target (or only OPCODE / a target): its forward and
    backward completion rules and its partition handler (module and function), read from
    the rule and handler registries."""
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.passes.rules import rules_table

    rows = rules_table(opcode)
    if opcode is not None and not rows:
        raise HloSpmdError(f"{opcode!r} is neither an opcode nor a custom-call target with "
                           "a rule (see `hlo-spmd rules`)")
    if as_json:
        from hlo_spmd_cli.common import write_json

        write_json([r.as_dict() for r in rows], "-")
        return
    from hlo_spmd_cli.render import emit_table

    prefix = "hlo_spmd.passes.partition.handlers."
    emit_table(None, ["kind", "name", "forward", "backward", "handler"],
               [[r.kind, r.name, r.forward, r.backward,
                 r.handler_module.removeprefix(prefix) + "." + r.handler_function]
                for r in rows])


@cli.command()
@click.argument("src", metavar="IN")
@click.option("--compare", "other", default=None, metavar="OTHER",
              help="A second partitioned module (e.g. XLA's) to show side by side.")
@_JSON
@_MAX_BYTES
@_MAX_PEAK
def stats(src: str, other: str | None, as_json: bool, max_bytes_per_device: str | None,
          max_peak_memory: str | None) -> None:
    """What partitioning cost: collectives per kind (count, in loops, bytes per device)
    and the largest live tensor. With a gate, exit code 1 when IN is over its limit."""
    from hlo_spmd.stats import module_stats
    from hlo_spmd_cli.common import check_gates, parse_limits

    limits = parse_limits(max_bytes_per_device, max_peak_memory)
    a = module_stats(load_module(src, verify=True))
    _print_stats(a, src, other, as_json)
    check_gates(a, *limits)  # after the table: CI logs show the figures that failed


def _print_stats(a, src: str, other: str | None, as_json: bool) -> None:
    from hlo_spmd.stats import module_stats, stats_json
    from hlo_spmd_cli.render import render_stats, render_stats_comparison

    if as_json:
        from hlo_spmd_cli.common import write_json

        obj = stats_json(a)
        if other is not None:
            obj = {"a": obj, "b": stats_json(module_stats(load_module(other, verify=True)))}
        write_json(obj, "-")
        return
    if other is None:
        render_stats(a, "<stdin>" if src == "-" else src)
    else:
        render_stats_comparison(a, module_stats(load_module(other, verify=True)), src, other)


@cli.command()
@click.argument("src", metavar="IN")
@click.option("--mesh", required=True, metavar="AXES",
              help="Device mesh to shard over, e.g. 'data=2,model=4'.")
@click.option("--memory-limit", "memory_limit", required=True, metavar="SIZE",
              help="Peak live memory per device the program must fit in: 123456, "
                   "1.5MiB, 2GB, 16GiB.")
@click.option("-o", "--output", "out", required=True, metavar="ANNOTATED",
              help="IN with the chosen annotations (.hlo/.txt: text, else HloModuleProto).")
@click.option("--partition", "partition_out", default=None, metavar="OUT",
              help="Also write the partitioned program (what 'partition ANNOTATED' writes).")
@click.option("--report", "report_path", default=None, metavar="FILE.json",
              help="Write the search report (chosen shardings, figures, baselines) as JSON.")
@click.option("--format", "fmt", type=click.Choice(["text", "proto"]), default=None)
@_SHARD
@_JSON
@_QUIET
def search(src: str, mesh: str, memory_limit: str, out: str, partition_out: str | None,
           report_path: str | None, fmt: str | None, shards: tuple[str, ...],
           as_json: bool, quiet: bool) -> None:
    """Choose shardings for IN's entry parameters and outputs on MESH so that the
    partitioned program moves the fewest bytes per device within --memory-limit.
    Annotations already in IN and --shard ones are kept."""
    import os

    from hlo_spmd.annotations.cli_spec import as_shard_specs, parse_mesh
    from hlo_spmd.errors import InputError
    from hlo_spmd.units import parse_size
    from hlo_spmd_cli.common import Progress, write_json

    limit = parse_size(memory_limit)  # fail on bad options before any work
    parse_mesh(mesh)
    as_shard_specs(list(shards))
    paths = [p for p in (out, partition_out, report_path) if p not in (None, "-")]
    if len(set(paths)) != len(paths):
        raise InputError("-o, --partition and --report must name different files")
    for p in paths:
        if not os.path.isdir(os.path.dirname(p) or "."):
            raise InputError("output directory does not exist", os.path.dirname(p))
    with Progress(quiet) as progress:
        progress.step(f"loading {src}")
        module = load_module(src, verify=True)
        import hlo_spmd.search

        result = hlo_spmd.search.search(module, mesh, limit, list(shards),
                                        progress=progress.step)
        progress.step(f"writing {label(out)}")
        write_module(result.annotated, out, fmt)
        if partition_out is not None:
            write_module(result.partition.module, partition_out, fmt)
        if report_path is not None:
            write_json(result.report, report_path)
    if as_json:
        write_json(result.report, "-")
    else:
        from hlo_spmd_cli.render import render_search

        render_search(result.report)
    status(f"wrote {label(out)}" + (f" and {label(partition_out)}" if partition_out else ""),
           quiet)
