"""What ``hlo-spmd partition`` does once its options are parsed: load, complete and
partition, write the module (and the report), print the status lines. Free of click, so
the fast path (:mod:`hlo_spmd_cli.fast`) and the click command
(:mod:`hlo_spmd_cli.commands`) run this one function."""
from __future__ import annotations


def run_partition(src: str, out: str, num_partitions: int | None = None,
                  complete: bool = False, fmt: str | None = None,
                  report_path: str | None = None, windowed_mib: float | None = None,
                  bidirectional: bool = False, combine_mib: float = 30.0,
                  mesh: str | None = None, shards: tuple[str, ...] = (),
                  quiet: bool = False, max_bytes_per_device: str | None = None,
                  max_peak_memory: str | None = None, strict: bool = False,
                  propagate_to_output: str | None = None,
                  propagate_to_params: str | None = None) -> None:
    """The partition command (the parameters are its options, see ``commands.partition``).
    A failed gate raises GateError after the output (and report) were written."""
    from hlo_spmd.api import partition_owned as api_partition
    from hlo_spmd.passes.partition import PartitionOptions
    from hlo_spmd_cli.common import Progress, label, parse_limits, read_module, status, \
        write_json, write_module

    max_bytes, max_peak = parse_limits(max_bytes_per_device, max_peak_memory)
    with Progress(quiet) as progress:
        progress.step(f"loading {src}")
        module = read_module(src, verify=True)
        if shards or mesh:
            from hlo_spmd.annotations.cli_spec import as_shard_specs, parse_mesh

            parse_mesh(mesh) if mesh else None  # fail on a bad spec before any work
            as_shard_specs(list(shards))
        to_output = to_params = None  # None: the module's own setting (text header)
        if propagate_to_output is not None or propagate_to_params is not None:
            from hlo_spmd.annotations.cli_spec import (parse_propagation_flags,
                                                       propagation_counts)

            n_out, n_params = propagation_counts(module)
            if propagate_to_output is not None:
                to_output = parse_propagation_flags(propagate_to_output, n_out, "output")
            if propagate_to_params is not None:
                to_params = parse_propagation_flags(propagate_to_params, n_params, "parameter")
        progress.step("completing shardings and partitioning")
        options = PartitionOptions(windowed_einsum_threshold_mib=windowed_mib,
                                   windowed_einsum_bidirectional=bidirectional,
                                   combine_threshold_mib=combine_mib)
        # The report feeds the status lines and --report: with neither, it is not built.
        want_report = report_path is not None or not quiet or strict
        result = api_partition(module, num_partitions, mesh=mesh, shard=list(shards),
                               complete=complete, options=options, report=want_report,
                               propagate_to_output=to_output,
                               propagate_to_parameters=to_params)
        progress.step(f"writing {label(out)}")
        if report_path is not None and report_path == out:
            from hlo_spmd.errors import InputError

            raise InputError("--report and -o name the same file")
        if report_path not in (None, "-"):
            import os

            from hlo_spmd.errors import InputError

            folder = os.path.dirname(report_path) or "."
            if not os.path.isdir(folder):  # fail before writing anything
                raise InputError("report directory does not exist", folder)
        write_module(result.module, out, fmt)
        if report_path is not None:
            write_json(result.report, report_path)
    if not quiet:
        _status_lines(result, out, quiet)
    if max_bytes is not None or max_peak is not None or strict:
        from hlo_spmd.stats import module_stats
        from hlo_spmd_cli.common import check_gates

        stats = module_stats(result.module, result.num_partitions,
                             memory=max_peak is not None)
        check_gates(stats, max_bytes, max_peak, _warnings(result) if strict else [], strict)


def _warnings(result) -> list[str]:
    """Every warning a run gives (what ``--strict`` turns into an error): full
    rematerializations, ops without a partitioned handler, unknown custom-calls."""
    report = result.report
    return (list(result.warnings)
            + [f"{f['instruction']} ({f['opcode']}) replicated: no partitioned handler"
               for f in report["replicated_fallbacks"]]
            + [f"custom-call {c['instruction']} (target {c['target']!r}) replicated: no "
               "partitioning rule" for c in report["unknown_custom_calls"]])


def _status_lines(result, out: str, quiet: bool) -> None:
    from hlo_spmd.report import top_causes_line
    from hlo_spmd_cli.common import label, status

    fallbacks = result.report["replicated_fallbacks"]
    status(f"wrote {label(out)}: {result.num_partitions} partitions, "
           f"{result.module.instruction_count()} instructions"
           + (f", {len(fallbacks)} ops replicated (no partitioned handler)" if fallbacks else ""),
           quiet)
    status(top_causes_line(result.report), quiet)
    for w in result.warnings:
        status(f"warning: {w}", quiet)
    for call in result.report["unknown_custom_calls"]:
        status(f"  replicated: custom-call {call['instruction']} (target {call['target']!r} "
               "has no partitioning rule)", quiet)
