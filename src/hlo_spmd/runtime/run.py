"""Running modules on the XLA CPU runtime: unpartitioned on one device, partitioned on N.

``run_partitioned`` takes GLOBAL inputs, slices them by the module's global parameter
shardings into per-device pieces (uneven shards padded at the end to
``ceil(dim / tiles)``), runs the per-device SPMD program on N CPU devices, and
reassembles GLOBAL outputs by the output sharding, checking that devices holding the
same data agree. ``verify`` runs an original module on one device and its partitioned
version on N and compares.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.runtime import slicing
from hlo_spmd.runtime._jax import cpu_devices, load_jax
from hlo_spmd.runtime.compare import ComparisonReport, compare, widen_by_xla
from hlo_spmd.runtime.compile import compile_module
from hlo_spmd.runtime.inputs import random_inputs
from hlo_spmd.runtime.module_io import (
    ArraySpec,
    ModuleLike,
    Signature,
    entry_signature,
    non_manual_entry_values,
    read_spmd_shardings,
    strip_shardings,
    tile_form_shardings,
    to_proto_bytes,
)

if TYPE_CHECKING:
    from hlo_spmd.runtime.distributed import ProcessGroup

__all__ = [
    "PartitionedRun",
    "ReplicaMismatchError",
    "compare",
    "execute_per_device",
    "random_inputs",
    "run_partitioned",
    "run_partitioned_detailed",
    "run_unpartitioned",
    "run_xla_spmd",
    "UnpartitionedRunError",
    "verify",
]


class ReplicaMismatchError(HloSpmdError):
    """Devices that should hold the same output values returned different ones."""


class UnpartitionedRunError(HloSpmdError):
    """XLA cannot compile the module as a single-device program."""


@dataclass
class PartitionedRun:
    """Everything one partitioned run produced.

    ``outputs``: global (reassembled) outputs; ``per_device``: for each output, the raw
    per-device results (padded shape, index = device id); ``problems``: replica
    disagreements and layout errors found while reassembling.
    """

    outputs: list[np.ndarray]
    per_device: list[list[np.ndarray]]
    problems: list[str] = field(default_factory=list)
    input_pieces: list[list[np.ndarray]] = field(default_factory=list)


def execute_per_device(executable: Any, per_param_pieces: Sequence[Sequence[np.ndarray]],
                       num_devices: int) -> list[list[np.ndarray]]:
    """Run ``executable`` with explicit per-device argument buffers.

    ``per_param_pieces[p][d]`` is parameter ``p`` on device ``d``; all pieces of one
    parameter have the same shape. Returns ``results[o][d]``, output ``o`` on device ``d``.

    jaxlib 0.10.2 has no ``buffer_from_pyval``; each parameter becomes a jax.Array built
    from single-device arrays with a *replicated* NamedSharding (so the global shape is
    simply the piece shape, rank-0 included). The executable sees only each device's
    buffer, so "replicated" is never acted upon.
    """
    jax = load_jax(num_devices).jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = cpu_devices(num_devices)
    replicated = NamedSharding(Mesh(np.array(devices), ("devices",)), PartitionSpec())
    # jax canonicalizes 64-bit arrays to 32 bits unless x64 is on; the module's s64 / f64
    # parameters must get their own width. The context keeps the process-wide default.
    with jax.enable_x64(True):
        args = []
        for pieces in per_param_pieces:
            buffers = [jax.device_put(np.asarray(p), dev) for p, dev in zip(pieces, devices)]
            args.append(jax.make_array_from_single_device_arrays(
                tuple(np.shape(pieces[0])), replicated, buffers))
        try:
            results = executable.execute_sharded(args).disassemble_into_single_device_arrays()
        except Exception as exc:
            raise HloSpmdError(f"XLA failed to run the module: {exc}") from exc
    position = {dev.id: i for i, dev in enumerate(devices)}
    outputs = []
    for per_device in results:
        ordered: list[np.ndarray | None] = [None] * num_devices
        for buf in per_device:
            (dev,) = buf.devices()
            ordered[position[dev.id]] = np.asarray(buf)
        outputs.append(ordered)  # type: ignore[arg-type]
    return outputs


def _check_input(i: int, x: Any, spec: ArraySpec | None, what: str) -> np.ndarray:
    x = np.asarray(x)
    if spec is None:
        return x
    if x.dtype != spec.dtype:
        if not np.can_cast(x.dtype, spec.dtype, "same_kind"):
            raise HloSpmdError(f"input {i}: dtype {x.dtype} does not match {what} {spec}")
        x = x.astype(spec.dtype)
    return x


def _check_count(inputs: Sequence[Any], sig: Signature) -> None:
    if len(inputs) != len(sig.parameters):
        raise HloSpmdError(
            f"{len(inputs)} inputs given, the module has {len(sig.parameters)} parameters "
            f"({', '.join(map(str, sig.parameters))})"
        )


def run_unpartitioned(module: ModuleLike, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run ``module`` (proto bytes, HLO text, ...) on one CPU device; returns its outputs.

    A tuple root gives one array per element. Sharding annotations are ignored: with
    ``num_partitions=1`` XLA runs an annotated module as a single-device program (checked
    with jaxlib 0.10.2); if XLA rejects it anyway, the shardings are stripped and the
    module compiled again.
    """
    proto_bytes = to_proto_bytes(module)
    sig = entry_signature(proto_bytes)
    _check_count(inputs, sig)
    arrays = []
    for i, (x, spec) in enumerate(zip(inputs, sig.parameters)):
        x = _check_input(i, x, spec, "parameter")
        if tuple(x.shape) != spec.shape:
            raise HloSpmdError(f"input {i}: shape {list(x.shape)} does not match parameter {spec}")
        arrays.append(x)
    try:
        executable = compile_module(proto_bytes, 1)
    except HloSpmdError as first_error:
        try:
            try:  # named shardings in the tile form first (manual regions need them)
                executable = compile_module(tile_form_shardings(proto_bytes), 1)
            except HloSpmdError:
                executable = compile_module(strip_shardings(proto_bytes), 1)
        except HloSpmdError:
            raise UnpartitionedRunError(
                f"{first_error} -- a module with manual regions (shard_map: "
                "SPMDFullToShardShape / SPMDShardToFullShape custom-calls) has no "
                "single-device meaning; use run_xla_spmd() to run it through XLA's own "
                "SPMD partitioner instead"
            ) from first_error
    results = execute_per_device(executable, [[x] for x in arrays], 1)
    return [per_device[0] for per_device in results]


def _resolve_shardings(proto_bytes: bytes, sig: Signature, param_shardings, output_sharding):
    stored_params, stored_output = read_spmd_shardings(proto_bytes)
    if param_shardings is None:
        if stored_params is None and not sig.parameters:
            # A repeated field cannot tell "empty" from "absent": with no entry
            # parameters there is nothing to record, and no sharding is needed.
            stored_params = []
        if stored_params is None:
            raise HloSpmdError(
                "the module records no spmd_parameters_shardings (HloModuleProto field "
                "14); pass param_shardings"
            )
        param_shardings = stored_params
    if output_sharding is None:
        if stored_output is None:
            raise HloSpmdError(
                "the module records no spmd_output_sharding (HloModuleProto field 12); "
                "pass output_sharding"
            )
        output_sharding = stored_output
    params = []
    for s in param_shardings:  # a tuple parameter's sharding gives one per element
        sharding = slicing.as_sharding(s)
        elements = slicing.tuple_leaves(sharding)
        params.extend(elements if elements is not None else [sharding])
    if len(params) != len(sig.parameters):
        raise HloSpmdError(
            f"{len(params)} parameter shardings for {len(sig.parameters)} parameters"
        )
    if isinstance(output_sharding, (list, tuple)):
        leaves = [slicing.as_sharding(s) for s in output_sharding]
    else:
        output = slicing.as_sharding(output_sharding)
        leaves = slicing.tuple_leaves(output)
        if leaves is None:
            leaves = [output] * len(sig.results)
    if len(leaves) != len(sig.results):
        raise HloSpmdError(f"{len(leaves)} output shardings for {len(sig.results)} outputs")
    return params, leaves


def run_partitioned_detailed(
    module: ModuleLike,
    inputs: Sequence[np.ndarray],
    num_partitions: int,
    param_shardings: Sequence[Any] | None = None,
    output_sharding: Any | None = None,
    *,
    output_shapes: Sequence[Sequence[int]] | None = None,
    poison_padding: bool = False,
    replica_rtol: float = 1e-5,
    replica_atol: float = 1e-6,
    require_manual: bool = True,
    processes: "int | ProcessGroup" = 1,
) -> PartitionedRun:
    """:func:`run_partitioned`, returning per-device results and problems instead of raising.

    ``replica_rtol`` / ``replica_atol``: how closely devices holding the same floating
    values must agree (integers and bool: exactly). ``processes`` > 1 runs the program as
    that many OS processes joined through jax.distributed, ``num_partitions / processes``
    devices each (:mod:`hlo_spmd.runtime.distributed`), as a multi-host job runs it; an
    open :class:`~hlo_spmd.runtime.distributed.ProcessGroup` runs it on that group.
    """
    proto_bytes = to_proto_bytes(module)
    if require_manual and num_partitions > 1:
        not_manual = non_manual_entry_values(proto_bytes)
        if not_manual:
            raise HloSpmdError(
                "not a per-device program: " + ", ".join(not_manual) + " lack "
                "sharding={manual}, so XLA would partition the module again"
            )
    sig = entry_signature(proto_bytes)
    _check_count(inputs, sig)
    params, out_shardings = _resolve_shardings(proto_bytes, sig, param_shardings,
                                               output_sharding)
    n = int(num_partitions)
    per_param = []
    for i, (x, spec, sharding) in enumerate(zip(inputs, sig.parameters, params)):
        x = _check_input(i, x, spec, "per-device parameter")
        pad = slicing.poison_value(x.dtype) if poison_padding else 0
        pieces = slicing.shard_pieces(x, sharding, n, pad_value=pad)
        if tuple(pieces[0].shape) != spec.shape:
            raise HloSpmdError(
                f"input {i}: global shape {list(x.shape)} with sharding "
                f"{slicing.describe(sharding)} gives per-device shape "
                f"{list(pieces[0].shape)}, but the module's parameter {i} is {spec}"
            )
        per_param.append(pieces)
    if not isinstance(processes, int):  # a ProcessGroup kept open across runs
        if processes.num_devices != n:
            raise HloSpmdError(f"the process group has {processes.num_devices} devices, "
                               f"the program is for {n}")
        per_device = processes.execute(proto_bytes, per_param)
    elif processes > 1:
        from hlo_spmd.runtime.distributed import execute_multiprocess

        per_device = execute_multiprocess(proto_bytes, per_param, n, processes)
    else:
        per_device = execute_per_device(compile_module(proto_bytes, n), per_param, n)
    if output_shapes is None:
        output_shapes = [
            slicing.global_shape_if_even(sharding, spec.shape)
            for sharding, spec in zip(out_shardings, sig.results)
        ]
    elif len(output_shapes) != len(sig.results):
        raise HloSpmdError(f"{len(output_shapes)} output shapes for {len(sig.results)} outputs")
    outputs, problems = [], []
    for o, (pieces, sharding, shape) in enumerate(zip(per_device, out_shardings, output_shapes)):
        try:
            array, found = slicing.assemble_checked(
                pieces, sharding, shape, rtol=replica_rtol, atol=replica_atol)
        except slicing.OutputLayoutError as exc:
            problems.append(f"output {o}: {exc}")
            outputs.append(np.asarray(pieces[0]))
            continue
        problems += [f"output {o}: {p}" for p in found]
        outputs.append(array)
    return PartitionedRun(outputs, per_device, problems, per_param)


def run_partitioned(
    module: ModuleLike,
    inputs: Sequence[np.ndarray],
    num_partitions: int,
    param_shardings: Sequence[Any] | None = None,
    output_sharding: Any | None = None,
    *,
    output_shapes: Sequence[Sequence[int]] | None = None,
    poison_padding: bool = False,
) -> list[np.ndarray]:
    """Run a per-device SPMD module on ``num_partitions`` CPU devices; GLOBAL in and out.

    * ``module``: proto bytes (or text, ...) whose entry parameters and root carry
      ``sharding={manual}``.
    * ``inputs``: GLOBAL arrays, one per parameter; each is sliced by its parameter
      sharding (default: the module's ``spmd_parameters_shardings``, field 14) into
      per-device pieces padded at the end to ``ceil(dim / tiles)``. Padding is 0, or in
      ``poison_padding`` mode NaN for floats / the type's max for ints / True for bool,
      so a program that lets padding leak into its result is caught.
    * ``output_sharding``: default the module's ``spmd_output_sharding`` (field 12); a
      tuple sharding (or a list) gives one sharding per output leaf.
    * ``output_shapes``: the GLOBAL output shapes. The per-device module cannot tell
      them for uneven shardings; by default they are per-device shape x tile count.

    Returns the reassembled GLOBAL outputs (a tuple root gives one per element). Raises
    :class:`ReplicaMismatchError` when devices that must hold the same values disagree.
    """
    run = run_partitioned_detailed(
        module, inputs, num_partitions, param_shardings, output_sharding,
        output_shapes=output_shapes, poison_padding=poison_padding)
    if run.problems:
        raise ReplicaMismatchError("; ".join(run.problems))
    return run.outputs


def run_xla_spmd(
    module: ModuleLike,
    inputs: Sequence[np.ndarray],
    num_partitions: int,
    *,
    poison_padding: bool = False,
) -> list[np.ndarray]:
    """Run an annotated (unpartitioned) module through XLA's OWN SPMD partitioner.

    The reference for modules that have no single-device meaning (shard_map manual
    regions) and a way to compare with XLA's GSPMD. The module is compiled for
    ``num_partitions`` devices with ``use_spmd_partitioning=True``; inputs are sliced by
    the parameter shardings XLA chose (``get_parameter_shardings``) and outputs
    reassembled by ``get_output_shardings``. GLOBAL arrays in and out.
    """
    # Tile-form shardings and device-list groups: the same module, spelled the way
    # jaxlib 0.10.2's import keeps intact (it drops a mesh's device order).
    proto_bytes = tile_form_shardings(to_proto_bytes(module))
    sig = entry_signature(proto_bytes)
    _check_count(inputs, sig)
    n = int(num_partitions)
    executable = compile_module(proto_bytes, n)
    param_shardings = executable.get_parameter_shardings()
    output_shardings = executable.get_output_shardings()
    if param_shardings is None or output_shardings is None:  # pragma: no cover
        raise HloSpmdError("XLA reported no parameter / output shardings")
    per_param = []
    for i, (x, spec, sharding) in enumerate(zip(inputs, sig.parameters, param_shardings)):
        x = _check_input(i, x, spec, "parameter")
        if tuple(x.shape) != spec.shape:
            raise HloSpmdError(f"input {i}: shape {list(x.shape)} does not match parameter {spec}")
        pad = slicing.poison_value(x.dtype) if poison_padding else 0
        per_param.append(slicing.shard_pieces(x, sharding, n, pad_value=pad))
    per_device = execute_per_device(executable, per_param, n)
    outputs, problems = [], []
    for o, (pieces, sharding, spec) in enumerate(zip(per_device, output_shardings, sig.results)):
        array, found = slicing.assemble_checked(pieces, sharding, spec.shape)
        problems += [f"output {o}: {p}" for p in found]
        outputs.append(array)
    if problems:
        raise ReplicaMismatchError("XLA's own partitioned program: " + "; ".join(problems))
    return outputs


def verify(
    original: ModuleLike,
    partitioned: ModuleLike,
    num_partitions: int,
    inputs: Sequence[np.ndarray] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    *,
    seed: int = 0,
    input_spec: str | Sequence[str | None] | None = None,
    poison_padding: bool = True,
    param_shardings: Sequence[Any] | None = None,
    output_sharding: Any | None = None,
    reference: str = "auto",
    processes: "int | ProcessGroup" = 1,
) -> ComparisonReport:
    """Run ``original`` on one device and ``partitioned`` on ``num_partitions``; compare.

    ``reference``: ``"unpartitioned"`` runs the original on one device; ``"xla"`` runs
    it through XLA's own SPMD partitioner on ``num_partitions`` devices
    (:func:`run_xla_spmd`); ``"auto"`` (default) is ``"unpartitioned"`` unless XLA
    cannot compile the original for one device (shard_map manual regions), then
    ``"xla"``. ``report.reference`` says which one ran.

    Inputs default to :func:`random_inputs` for the original's parameters (``seed``,
    ``input_spec``). Padding is poisoned by default (see :func:`run_partitioned`).
    ``processes`` > 1 runs the partitioned program as that many OS processes joined
    through jax.distributed (see :func:`run_partitioned_detailed`).
    Global output shapes come from the original's results. Replica disagreements and
    output layout errors are reported in ``report.problems``; errors that prevent
    running at all (compile failure, parameter shape mismatch) raise
    :class:`HloSpmdError`.
    """
    original_bytes = to_proto_bytes(original)
    sig = entry_signature(original_bytes)
    _check_fits_in_memory(sig)
    if inputs is None:
        inputs = random_inputs(sig.parameters, seed=seed, spec=input_spec)
    if reference not in ("auto", "unpartitioned", "xla"):
        raise HloSpmdError(f"unknown reference {reference!r} (auto, unpartitioned, xla)")
    used = "unpartitioned"
    if reference == "xla":
        used = "xla"
        expected = run_xla_spmd(original_bytes, inputs, num_partitions)
    else:
        try:
            expected = run_unpartitioned(original_bytes, inputs)
        except UnpartitionedRunError:
            if reference != "auto":
                raise
            used = "xla"
            expected = run_xla_spmd(original_bytes, inputs, num_partitions)
    partitioned = to_proto_bytes(partitioned)
    if param_shardings is None or output_sharding is None:
        param_shardings, output_sharding = _interface_from_original(
            original_bytes, partitioned, num_partitions, param_shardings, output_sharding)
    run = run_partitioned_detailed(
        partitioned, inputs, num_partitions, param_shardings, output_sharding,
        output_shapes=[e.shape for e in expected] if _same_count(partitioned, expected)
        else None,
        poison_padding=poison_padding, processes=processes)
    from hlo_spmd.ir.io import load_module_bytes
    from hlo_spmd.runtime.precision import program_precision

    precision = program_precision(load_module_bytes(original_bytes, "original"),
                                  num_partitions)
    depths = (precision.output_depths if len(precision.output_depths) == len(expected)
              else precision.depth)
    report = compare(expected, run.outputs, rtol, atol, eps=precision.eps, depth=depths)
    if not report.ok and rtol is None and atol is None and used == "unpartitioned" \
            and not run.problems and len(expected) == len(run.outputs):
        # The rule alone says no: see how much XLA's own partitioning of the module
        # rounds on the same inputs before calling the program wrong.
        try:
            xla = run_xla_spmd(original_bytes, inputs, num_partitions)
        except HloSpmdError:
            xla = None
        if xla is not None:
            widen_by_xla(report, expected, run.outputs, xla)
    report.problems[:0] = run.problems
    report.reference = (f"original run by XLA's own SPMD partitioner on {num_partitions} "
                        "devices" if used == "xla" else "original run on 1 device")
    k = processes if isinstance(processes, int) else processes.num_processes
    if k > 1:
        report.reference += (f"; partitioned run as {k} processes x "
                             f"{num_partitions // k} devices (jax.distributed)")
    return report


def _check_fits_in_memory(sig: Signature) -> None:
    """A module whose inputs and outputs cannot fit in this machine's memory is refused
    up front, by name, rather than failing inside numpy or XLA."""
    import os

    need = sum(int(np.prod(a.shape, dtype=object)) * a.dtype.itemsize
               for a in (*sig.parameters, *sig.results))
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return
    if need > have:
        raise HloSpmdError(f"the module's parameters and results need {need} bytes, more "
                           f"than this machine's {have} bytes of memory: too large to run")


def _interface_from_original(original: bytes, partitioned: bytes, num_partitions: int,
                             param_shardings: Any, output_sharding: Any) -> tuple[Any, Any]:
    """The global interface for a partitioned module that does not record it (HLO text
    cannot: XLA's text has no syntax for spmd_parameters_shardings / spmd_output_sharding):
    the shardings partitioning records, re-derived by completing the original."""
    stored_params, stored_output = read_spmd_shardings(partitioned)
    has_params = stored_params is not None or not entry_signature(partitioned).parameters
    if (param_shardings is not None or has_params) and (
            output_sharding is not None or stored_output is not None):
        return param_shardings, output_sharding
    from hlo_spmd.ir.io import load_module_bytes
    from hlo_spmd.passes.partition import interface_shardings

    params, output = interface_shardings(load_module_bytes(original, "original"),
                                         num_partitions)
    return (param_shardings if param_shardings is not None or has_params else params,
            output_sharding if output_sharding is not None or stored_output is not None
            else output)


def _same_count(module: ModuleLike, expected: Sequence[np.ndarray]) -> bool:
    return len(entry_signature(module).results) == len(expected)
