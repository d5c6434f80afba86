"""XLA's own GSPMD results for a module: the reference our passes are compared with.

XLA's SPMD pipeline (compiled with ``use_spmd_partitioning=True`` on N CPU devices) runs
``sharding-propagation`` (the completion: every instruction gets a sharding) and then
``spmd-partitioning`` (the per-device program). This module compiles an annotated,
unpartitioned module and collects XLA's dumps of both:

* :func:`xla_pass_dumps` - text and proto of the module after each requested pass
  (and of the module XLA's pipeline received), as an :class:`XlaDumps`.
* :func:`xla_completed_shardings` - instruction name -> completed sharding text.
* :func:`xla_completed_module` - the same, as one of our :class:`~hlo_spmd.ir.Module`.
* :func:`xla_partitioned_module` - XLA's partitioned module (``HloModuleProto`` bytes).
* :func:`compare_shardings` / :func:`compare_modules` - instruction-by-instruction
  agreement of two sets of shardings (semantic equality), an :class:`AgreementReport`.

How the dumps are made: jaxlib 0.10's ``ExecutableBuildOptions.debug_options`` carries
the per-compile dump options (``xla_dump_to``, ``xla_dump_hlo_pass_re``,
``xla_dump_hlo_as_text`` / ``_as_proto``), so each compile dumps into its own fresh
directory and the process-global ``XLA_FLAGS`` stay untouched. The compile runs in this
process when jax can provide N CPU devices here; otherwise (jax already initialised with
fewer devices) in a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (``mode=`` chooses explicitly).

Shardy modules (``xla.sdy.*`` markers, the ``shardy_*`` fixtures): XLA's GSPMD
partitioner refuses them (``xla.sdy.FuncResultSharding`` custom-calls), but its
``sharding-propagation`` pass runs first and completes their classic ``sharding=``
annotations. ``shardy=False`` therefore still yields the GSPMD completion (the
partitioning failure is recorded in :attr:`XlaDumps.error`); ``shardy=True`` compiles
with ``use_shardy_partitioner=True``, where the completion is the ``shardy-xla`` pass
(Shardy's propagation, with instructions renamed by the MLIR round trip) and the
partitioned module exists. ``shardy=None`` picks by the module's markers, except for
:func:`xla_completed_shardings` / :func:`xla_completed_module`, which default to the
GSPMD completion because that is what our propagation implements.

What XLA's completion leaves unsharded (checked on every fixture with jaxlib 0.10.2):
the scalar instructions of computations applied per element (reduce, reduce-window,
scatter, sort and all-reduce bodies), scalar constants that only feed a reduce's init
value, ``topk`` and ``xla.sdy.*`` custom-calls. Its partitioner treats those as
replicated; :func:`compare_shardings` does the same by default. Propagation also turns
``Sharding`` custom-calls into ``copy`` instructions with new names, which
:func:`compare_modules` pairs up by structure.

Results are cached on disk, keyed by sha256(module bytes, module id cleared), N, the
jaxlib version, the shardy flag and the pass list, under
``~/.cache/hlo-spmd/xla-reference`` (override with ``HLO_SPMD_XLA_CACHE=DIR``;
``HLO_SPMD_XLA_CACHE=off`` disables the cache). Failed compiles are not cached.

One concept per module: the dumps and the compile that makes them in
:mod:`~hlo_spmd.runtime.xla_dumps`, the cache in :mod:`~hlo_spmd.runtime.xla_cache`, the
sharding comparison in :mod:`~hlo_spmd.runtime.sharding_compare`; this module ties them
together (and re-exports their public names). The per-fixture agreement table is a
script: ``python benchmarks/xla_agreement.py --agreement fixtures/hlo [-v]``.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.runtime.module_io import ModuleLike, to_proto_bytes
from hlo_spmd.runtime.sharding_compare import (AgreementReport, Disagreement, _align_names,
                                               compare_modules, compare_shardings,
                                               module_shardings, no_xla_reference,
                                               semantically_equal)
from hlo_spmd.runtime.xla_cache import (CACHE_ENV, _cache_key, _read_cache, _write_cache,
                                        cache_dir, clear_cache)
from hlo_spmd.runtime.xla_dumps import (DEFAULT_PASSES, GSPMD_COMPLETION_PASS,
                                        PARTITIONING_PASS, SHARDY_COMPLETION_PASS, PassDump,
                                        XlaDumps, _can_run_here, _collect, _compile_and_dump,
                                        _compile_in_subprocess, _jaxlib_version, _pass_regex,
                                        is_shardy_module)

if TYPE_CHECKING:  # pragma: no cover
    from hlo_spmd.ir.module import Module

__all__ = [
    "DEFAULT_PASSES", "SHARDY_COMPLETION_PASS", "PassDump", "XlaDumps", "Disagreement",
    "AgreementReport", "FixtureCase", "cache_dir", "clear_cache", "is_shardy_module",
    "xla_pass_dumps", "xla_completed_shardings", "xla_completed_module",
    "xla_partitioned_module", "module_shardings", "semantically_equal",
    "compare_shardings", "compare_modules", "fixture_cases", "format_agreement_table",
    "agreement_for_case", "SOURCES", "no_xla_reference",
]


def xla_pass_dumps(module_bytes: ModuleLike, num_partitions: int,
                   passes: Sequence[str] = DEFAULT_PASSES, shardy: bool | None = None, *,
                   cache: bool | str | os.PathLike | None = None, mode: str = "auto",
                   timeout: float = 600.0) -> XlaDumps:
    """Compile the annotated module for ``num_partitions`` CPU devices with XLA's SPMD
    partitioner and collect the module after each of ``passes``.

    ``module_bytes``: anything :func:`~hlo_spmd.runtime.module_io.to_proto_bytes` accepts.
    ``shardy``: compile with ``use_shardy_partitioner`` (None: when the module carries
    Shardy markers). Shardy's completion pass ``shardy-xla`` is added to ``passes``.
    XLA itself falls back to GSPMD for a module without Shardy markers; the result's
    ``shardy`` then says False.
    ``cache``: None/True = default directory (see module docstring), False = no cache,
    a path = that directory. ``mode``: ``"auto"`` (in this process if it can have N CPU
    devices, else a subprocess), ``"inprocess"`` or ``"subprocess"``.

    Raises :class:`HloSpmdError` if XLA did not reach the completion pass.
    """
    n = int(num_partitions)
    if n < 2:
        raise HloSpmdError(f"num_partitions must be >= 2 (XLA runs no SPMD passes for one "
                           f"partition), got {num_partitions}")
    if mode not in ("auto", "inprocess", "subprocess"):
        raise HloSpmdError(f"unknown mode {mode!r} (auto, inprocess, subprocess)")
    proto_bytes = to_proto_bytes(module_bytes)
    if shardy is None:
        shardy = is_shardy_module(proto_bytes)
    passes = tuple(passes)
    if shardy and SHARDY_COMPLETION_PASS not in passes:
        passes = passes + (SHARDY_COMPLETION_PASS,)
    version = _jaxlib_version()

    root: Path | None
    if cache is None or cache is True:
        root = cache_dir()
    elif cache is False:
        root = None
    else:
        root = Path(cache).expanduser()
    entry = root / _cache_key(proto_bytes, n, shardy, passes, version) if root else None
    if entry is not None and entry.is_dir():
        hit = _read_cache(entry)
        if hit is not None:
            return hit

    if mode == "auto":
        mode = "inprocess" if _can_run_here(n) else "subprocess"
    regex = _pass_regex(passes)
    with tempfile.TemporaryDirectory(prefix="hlo-spmd-xla-dump-") as tmp:
        out_dir = Path(tmp) / "dump"
        out_dir.mkdir()
        start = time.perf_counter()
        if mode == "inprocess":
            error = _compile_and_dump(proto_bytes, n, shardy, regex, out_dir)
        else:
            error = _compile_in_subprocess(proto_bytes, n, shardy, regex, out_dir, timeout)
        seconds = time.perf_counter() - start
        after, first_input = _collect(out_dir, passes)
    if shardy and SHARDY_COMPLETION_PASS not in after and GSPMD_COMPLETION_PASS in after:
        # XLA falls back to GSPMD for a module without Shardy markers ("Module has GSPMD
        # attrs or ops, but Shardy is enabled"): record what actually ran.
        shardy = False
    dumps = XlaDumps(n, bool(shardy), passes, after, first_input, error, version, seconds,
                     mode=mode)
    completion = dumps.completion_pass
    if completion not in after:
        raise HloSpmdError(
            f"XLA did not run {completion} for {n} partition(s)"
            + (f": {error}" if error else " (no dump produced)"))
    if entry is not None:
        _write_cache(entry, dumps)
        dumps.cache_path = entry
    return dumps


def xla_completed_module(module_bytes: ModuleLike, num_partitions: int, *,
                         shardy: bool = False, **kwargs: Any) -> "Module":
    """XLA's module after its completion pass, as our IR (from the dumped proto).

    ``shardy=False`` (default) is GSPMD's ``sharding-propagation`` - also for Shardy
    modules, whose classic annotations it completes before the partitioner refuses them.
    """
    return xla_pass_dumps(module_bytes, num_partitions, shardy=shardy, **kwargs) \
        .propagated.module()


def xla_completed_shardings(module_bytes: ModuleLike, num_partitions: int, *,
                            shardy: bool = False, **kwargs: Any) -> dict[str, str]:
    """Instruction name -> XLA's completed sharding text, every instruction of every
    computation of the dumped module (``""`` for an instruction XLA left unsharded)."""
    module = xla_completed_module(module_bytes, num_partitions, shardy=shardy, **kwargs)
    return {name: (str(s) if s is not None else "")
            for name, s in module_shardings(module).items()}


def xla_partitioned_module(module_bytes: ModuleLike, num_partitions: int, *,
                           shardy: bool | None = None, **kwargs: Any) -> bytes:
    """XLA's partitioned module (``HloModuleProto`` bytes, after ``spmd-partitioning``).

    Carries ``spmd_parameters_shardings`` / ``spmd_output_sharding``; runnable with
    :func:`hlo_spmd.runtime.run_partitioned`-style per-device execution.
    """
    return xla_pass_dumps(module_bytes, num_partitions, shardy=shardy, **kwargs) \
        .partitioned.proto


# ---------------------------------------------------------------------------------------
# fixtures and the agreement table
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FixtureCase:
    """One fixture: name, partition count, and where its module comes from."""

    name: str
    num_partitions: int
    path: Path  # the .pb, or the .hlo when there is no .pb
    form: str = "classic"

    def proto_bytes(self) -> bytes:
        """``HloModuleProto`` bytes (``.hlo`` text is converted by jaxlib's parser)."""
        return to_proto_bytes(self.path)


def fixture_cases(root: str | os.PathLike) -> list[FixtureCase]:
    """Every fixture under ``root``: each ``.pb`` with a ``.json`` sidecar, and each
    ``.hlo`` without a ``.pb`` whose sidecar has ``num_partitions`` (handwritten)."""
    root = Path(root)
    cases: list[FixtureCase] = []
    for sidecar in sorted(root.rglob("*.json")):
        try:
            meta = json.loads(sidecar.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or "num_partitions" not in meta:
            continue
        pb, hlo = sidecar.with_suffix(".pb"), sidecar.with_suffix(".hlo")
        path = pb if pb.exists() else hlo if hlo.exists() else None
        if path is None:
            continue
        rel = sidecar.relative_to(root).with_suffix("")
        cases.append(FixtureCase(rel.as_posix(), int(meta["num_partitions"]), path,
                                 str(meta.get("form", "classic"))))
    return cases


def format_agreement_table(rows: Iterable[tuple[str, AgreementReport | str]]) -> str:
    """Per-fixture table; a row's report may be a string (skipped / error reason)."""
    lines = [f"{'fixture':<46} {'agree':>7} {'compared':>8} {'%':>6} {'diff':>5} "
             f"{'only ours':>9} {'only xla':>8} {'no ref':>6}"]
    total_c = total_a = 0
    for name, rep in rows:
        if isinstance(rep, str):
            lines.append(f"{name:<46} {rep}")
            continue
        total_c += rep.compared
        total_a += rep.agreed
        lines.append(f"{name:<46} {rep.agreed:>7} {rep.compared:>8} {rep.percent:>6.1f} "
                     f"{rep.disagreed:>5} {len(rep.only_ours):>9} {len(rep.only_xla):>8} "
                     f"{len(rep.no_reference):>6}")
    pct = 100.0 * total_a / total_c if total_c else 100.0
    lines.append(f"{'TOTAL':<46} {total_a:>7} {total_c:>8} {pct:>6.1f}")
    return "\n".join(lines)


#: Where our propagation's input comes from in :func:`agreement_for_case`.
SOURCES = ("xla-input", "fixture")


def agreement_for_case(case: FixtureCase, *, source: str = "xla-input",
                       xla_only: bool = False, **kwargs: Any) -> AgreementReport:
    """Run our propagation and compare with XLA's GSPMD completion of the fixture.

    ``source="xla-input"`` (default) propagates the module XLA's ``sharding-propagation``
    itself received (the ``before_sharding-propagation`` dump: the fixture after XLA's
    HLO -> StableHLO -> HLO import, call inlining and conditional canonicalisation), so
    both sides see the same instructions under the same names. ``source="fixture"``
    propagates the fixture as stored; then only the names that survive XLA's import
    are compared (inlined calls and renamed instructions are lost).
    ``xla_only``: "ours" is XLA's own completion (checks the machinery, needs no
    propagation). ``kwargs`` go to :func:`xla_pass_dumps`.
    """
    if source not in SOURCES:
        raise HloSpmdError(f"unknown source {source!r} ({', '.join(SOURCES)})")
    proto = case.proto_bytes()
    dumps = xla_pass_dumps(proto, case.num_partitions, shardy=False, **kwargs)
    xla_module = dumps.propagated.module()
    if xla_only:
        ours = dumps.propagated.module()
    else:
        from hlo_spmd.ir.io import load_module_bytes
        from hlo_spmd.passes.propagation import propagate

        if source == "xla-input":
            if dumps.input is None:
                raise HloSpmdError("XLA did not dump its input to sharding-propagation")
            ours = dumps.input.module()
        else:
            ours = load_module_bytes(proto, str(case.path))
        propagate(ours)
    return compare_modules(ours, xla_module, num_devices=case.num_partitions,
                           label=case.name)
