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

Script mode::

    python -m hlo_spmd.runtime.xla_reference --agreement fixtures/hlo [-v] [--xla-only]
        [--source xla-input|fixture]

prints, per fixture, how far our propagation agrees with XLA's completion.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.runtime.module_io import ModuleLike, to_proto_bytes

if TYPE_CHECKING:  # pragma: no cover
    from hlo_spmd.ir.module import Module
    from hlo_spmd.sharding import HloSharding

__all__ = [
    "DEFAULT_PASSES", "SHARDY_COMPLETION_PASS", "PassDump", "XlaDumps", "Disagreement",
    "AgreementReport", "FixtureCase", "cache_dir", "clear_cache", "is_shardy_module",
    "xla_pass_dumps", "xla_completed_shardings", "xla_completed_module",
    "xla_partitioned_module", "module_shardings", "semantically_equal",
    "compare_shardings", "compare_modules", "fixture_cases", "format_agreement_table",
    "agreement_for_case", "SOURCES", "no_xla_reference",
]

#: The passes dumped by default: the completion and the partitioner.
DEFAULT_PASSES = ("sharding-propagation", "spmd-partitioning")
#: The completion pass when XLA runs Shardy (``use_shardy_partitioner=True``).
SHARDY_COMPLETION_PASS = "shardy-xla"
GSPMD_COMPLETION_PASS = "sharding-propagation"
PARTITIONING_PASS = "spmd-partitioning"

CACHE_ENV = "HLO_SPMD_XLA_CACHE"
_CACHE_OFF = ("off", "0", "none", "false", "no")
_CACHE_FORMAT = 1  # bump when the cached layout changes

# module_0001.jit_f.0001.spmd-partitioner.after_sharding-propagation.before_spmd-partitioning.txt
_DUMP_RE = re.compile(
    r"^module_(?P<module>\d+)\.(?P<name>.+)\.(?P<seq>\d{4})\.(?P<pipeline>[^.]+)"
    r"\.after_(?P<after>[^.]+)\.before_(?P<before>[^.]+)\.(?P<ext>txt|hlo\.pb)$")


# ---------------------------------------------------------------------------------------
# dumps
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PassDump:
    """One dumped module: XLA's text and ``HloModuleProto`` bytes (wrapper removed)."""

    label: str  # "after_<pass>" or "before_<pass>"
    file_stem: str
    text: str
    proto: bytes

    def module(self, from_text: bool = False) -> "Module":
        """The dump as our IR: from the proto (default; lossless, and it does not depend
        on our text parser knowing every newest syntax XLA prints), or ``from_text``
        with :func:`hlo_spmd.ir.text_parser.parse_module`."""
        if from_text:
            from hlo_spmd.ir.text_parser import parse_module

            return parse_module(self.text, self.file_stem)
        from hlo_spmd.ir.io import load_module_bytes

        return load_module_bytes(self.proto, self.file_stem)


@dataclass
class XlaDumps:
    """What XLA's SPMD pipeline produced for one module and partition count.

    ``after[pass]`` is the module right after the first run of ``pass``; ``input`` is
    the module just before the first dumped pass (what XLA's pipeline received, after
    its HLO -> StableHLO -> HLO import and the passes ahead of the completion).
    ``error`` is XLA's compile error when the compile failed after the completion (a
    Shardy module compiled with ``shardy=False``).
    """

    num_partitions: int
    shardy: bool
    passes: tuple[str, ...]
    after: dict[str, PassDump]
    input: PassDump | None
    error: str | None
    jaxlib_version: str
    seconds: float  # compile + dump time when produced (not cache-load time)
    cached: bool = False
    cache_path: Path | None = None
    mode: str = "inprocess"

    @property
    def completion_pass(self) -> str:
        return SHARDY_COMPLETION_PASS if self.shardy else GSPMD_COMPLETION_PASS

    @property
    def propagated(self) -> PassDump:
        """The module after XLA's completion (every instruction's sharding)."""
        dump = self.after.get(self.completion_pass)
        if dump is None:
            raise HloSpmdError(f"XLA did not dump the module after {self.completion_pass}"
                               + (f" ({self.error})" if self.error else ""))
        return dump

    @property
    def partitioned(self) -> PassDump:
        """XLA's partitioned module (after ``spmd-partitioning``)."""
        dump = self.after.get(PARTITIONING_PASS)
        if dump is None:
            why = f": {self.error}" if self.error else ""
            raise HloSpmdError(f"XLA produced no partitioned module{why}")
        return dump


def _jaxlib_version() -> str:
    try:
        from importlib.metadata import version

        return version("jaxlib")
    except Exception:  # pragma: no cover - jaxlib missing / odd install
        return "unknown"


def is_shardy_module(module: ModuleLike) -> bool:
    """True if the module carries Shardy markers (``xla.sdy.*`` custom-calls / attributes)."""
    from hlo_spmd.runtime.module_io import parse_module_proto

    proto = parse_module_proto(to_proto_bytes(module))
    if any(k.startswith("xla.sdy") for k in proto.frontend_attributes.map):
        return True
    for comp in proto.computations:
        for inst in comp.instructions:
            if inst.custom_call_target.startswith("xla.sdy"):
                return True
            if any(k.startswith("xla.sdy") for k in inst.frontend_attributes.map):
                return True
    return False


def _pass_regex(passes: Sequence[str]) -> str:
    return "|".join(re.escape(p) for p in passes)


def cache_dir() -> Path | None:
    """The on-disk cache directory, or None when disabled (``HLO_SPMD_XLA_CACHE=off``)."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        if env.strip().lower() in _CACHE_OFF or not env.strip():
            return None
        return Path(env).expanduser()
    return Path.home() / ".cache" / "hlo-spmd" / "xla-reference"


def clear_cache(directory: str | os.PathLike | None = None) -> int:
    """Remove every cached entry; returns how many were removed."""
    root = Path(directory) if directory is not None else cache_dir()
    if root is None or not root.is_dir():
        return 0
    n = 0
    for entry in root.iterdir():
        if entry.is_dir() and (entry / "meta.json").exists():
            shutil.rmtree(entry, ignore_errors=True)
            n += 1
    return n


def _key_bytes(proto_bytes: bytes) -> bytes:
    """The module bytes with the module ``id`` cleared: jaxlib's text parser numbers
    modules with a process-wide counter, which must not defeat the cache."""
    from hlo_spmd.runtime.module_io import parse_module_proto

    proto = parse_module_proto(proto_bytes)
    if not proto.id:
        return proto_bytes
    proto.ClearField("id")
    return proto.SerializeToString(deterministic=True)


def _cache_key(proto_bytes: bytes, n: int, shardy: bool, passes: Sequence[str],
               version: str) -> str:
    h = hashlib.sha256(_key_bytes(proto_bytes)).hexdigest()
    extra = json.dumps([_CACHE_FORMAT, n, version, bool(shardy), list(passes)])
    return f"{h[:40]}-n{n}-{'sdy' if shardy else 'gspmd'}-" + \
        hashlib.sha256(extra.encode()).hexdigest()[:12]


def _collect(dump_dir: Path, passes: Sequence[str]) -> tuple[dict[str, PassDump], PassDump | None]:
    """Read the ``after_<pass>`` dumps (first run of each pass) and the pipeline input."""
    from hlo_spmd.runtime.module_io import _unwrap

    files: dict[str, dict[str, Path]] = {}
    parsed = []
    for path in sorted(dump_dir.iterdir()):
        m = _DUMP_RE.match(path.name)
        if not m:
            continue
        stem = path.name[: -len("." + m.group("ext"))]
        files.setdefault(stem, {})[m.group("ext")] = path
        parsed.append((int(m.group("module")), int(m.group("seq")), stem, m))
    if not parsed:
        return {}, None
    # One compile dumps one module; if XLA dumped several, keep the first (lowest id).
    first_module = min(p[0] for p in parsed)
    parsed = sorted({(p[1], p[2]): p for p in parsed if p[0] == first_module}.values(),
                    key=lambda p: p[1])

    def load(stem: str, label: str) -> PassDump | None:
        f = files.get(stem, {})
        if "txt" not in f or "hlo.pb" not in f:
            return None
        return PassDump(label, stem, f["txt"].read_text(), _unwrap(f["hlo.pb"].read_bytes(), stem))

    after: dict[str, PassDump] = {}
    first_input: PassDump | None = None
    wanted = set(passes)
    for _module, _seq, stem, m in parsed:
        if first_input is None and m.group("before") in wanted:
            first_input = load(stem, "before_" + m.group("before"))
        p = m.group("after")
        if p in wanted and p not in after:
            dump = load(stem, "after_" + p)
            if dump is not None:
                after[p] = dump
    return after, first_input


def _compile_and_dump(proto_bytes: bytes, n: int, shardy: bool, regex: str,
                      out_dir: Path) -> str | None:
    """Compile in this process with per-compile dump options; returns XLA's error or None."""
    from hlo_spmd.runtime._jax import cpu_devices, load_jax
    from hlo_spmd.runtime.compile import compile_options

    devices = cpu_devices(n)
    xc = load_jax(n).xla_client
    options = compile_options(n)
    build = options.executable_build_options
    build.use_spmd_partitioning = True  # also for n == 1: the passes must run
    build.use_shardy_partitioner = bool(shardy)
    debug = build.debug_options
    debug.xla_dump_to = str(out_dir)
    debug.xla_dump_hlo_pass_re = regex
    debug.xla_dump_hlo_as_text = True
    debug.xla_dump_hlo_as_proto = True
    try:
        stablehlo = xc._xla.mlir.hlo_to_stablehlo(proto_bytes)
    except Exception as exc:
        raise HloSpmdError("XLA could not import the module (HLO -> StableHLO): "
                           + _first_lines(exc)) from exc
    try:
        devices[0].client.compile_and_load(stablehlo, xc.DeviceList(tuple(devices)), options)
    except Exception as exc:  # keep whatever XLA dumped before failing
        return _first_lines(exc)
    return None


def _first_lines(exc: BaseException, n: int = 4) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return " ".join(lines[:n])


def _can_run_here(n: int) -> bool:
    from hlo_spmd.runtime.devices import ensure_host_devices

    try:
        ensure_host_devices(n)
    except HloSpmdError:
        return False
    return True


def _src_root() -> str:
    import hlo_spmd

    return str(Path(hlo_spmd.__file__).resolve().parent.parent)


def _compile_in_subprocess(proto_bytes: bytes, n: int, shardy: bool, regex: str,
                           out_dir: Path, timeout: float) -> str | None:
    module_file = out_dir.parent / "module.pb"
    module_file.write_bytes(proto_bytes)
    env = dict(os.environ)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={max(n, 1)}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        [_src_root()] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [sys.executable, "-m", "hlo_spmd.runtime.xla_reference", "--_dump-worker",
           str(module_file), str(n), "1" if shardy else "0", regex, str(out_dir)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise HloSpmdError(f"XLA dump subprocess timed out after {timeout:.0f} s") from exc
    error_file = out_dir.parent / "error.txt"
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.strip().splitlines()[-4:])
        raise HloSpmdError(f"XLA dump subprocess failed (exit {proc.returncode}): {tail}")
    return error_file.read_text() if error_file.exists() else None


def _worker_main(args: Sequence[str]) -> int:
    module_file, n, shardy, regex, out_dir = args
    out = Path(out_dir)
    try:
        error = _compile_and_dump(Path(module_file).read_bytes(), int(n), shardy == "1",
                                  regex, out)
    except HloSpmdError as exc:
        print(exc, file=sys.stderr)
        return 3
    if error is not None:
        (out.parent / "error.txt").write_text(error)
    return 0


def _write_cache(entry: Path, dumps: XlaDumps) -> None:
    root = entry.parent
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        items = {}
        for key, dump in list(dumps.after.items()) + (
                [("<input>", dumps.input)] if dumps.input is not None else []):
            base = f"{len(items):02d}"
            (tmp / f"{base}.txt").write_text(dump.text)
            (tmp / f"{base}.pb").write_bytes(dump.proto)
            items[base] = {"key": key, "label": dump.label, "stem": dump.file_stem}
        meta = {"format": _CACHE_FORMAT, "num_partitions": dumps.num_partitions,
                "shardy": dumps.shardy, "passes": list(dumps.passes), "error": dumps.error,
                "jaxlib": dumps.jaxlib_version, "seconds": dumps.seconds,
                "mode": dumps.mode, "items": items}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, entry)  # atomic; fails if another process won the race
        except OSError:
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _read_cache(entry: Path) -> XlaDumps | None:
    try:
        meta = json.loads((entry / "meta.json").read_text())
        if meta.get("format") != _CACHE_FORMAT:
            return None
        after: dict[str, PassDump] = {}
        inp = None
        for base, item in meta["items"].items():
            dump = PassDump(item["label"], item["stem"], (entry / f"{base}.txt").read_text(),
                            (entry / f"{base}.pb").read_bytes())
            if item["key"] == "<input>":
                inp = dump
            else:
                after[item["key"]] = dump
    except (OSError, ValueError, KeyError):
        return None
    return XlaDumps(int(meta["num_partitions"]), bool(meta["shardy"]), tuple(meta["passes"]),
                    after, inp, meta["error"], meta["jaxlib"], float(meta["seconds"]),
                    cached=True, cache_path=entry, mode=meta.get("mode", "inprocess"))


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


# ---------------------------------------------------------------------------------------
# convenience views
# ---------------------------------------------------------------------------------------
def module_shardings(module: "Module") -> dict[str, "HloSharding | None"]:
    """Instruction name -> sharding (None if unsharded), every computation."""
    return {inst.name: inst.sharding for inst in module.instructions()}


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
# agreement
# ---------------------------------------------------------------------------------------
def _fully_replicated(s: "HloSharding") -> bool:
    """Every device holds the whole array: replicated, or tiled with all tile dims 1
    and nothing but replication in the subgroup dims."""
    if s.is_tuple:
        return False
    if s.is_replicated:
        return True
    if not s.is_tiled or s.tile_assignment is None:
        return False
    from hlo_spmd.sharding import ShardingType

    if any(t != ShardingType.REPLICATED for t in s.subgroup_types):
        return False
    return all(d == 1 for d in s.tile_dims_for_data())


def semantically_equal(a: "HloSharding | None", b: "HloSharding | None",
                       num_devices: int | None = None) -> bool:
    """Same device placement: ``HloSharding`` equality (metadata ignored; iota and
    explicit device lists compare by value), plus: ``{replicated}`` equals a tiling
    whose data dims are all 1 (``{devices=[1,1]0}``), a tuple sharding equals a
    non-tuple one that every element equals, and with one device ``{maximal device=0}``
    equals replicated."""
    if a is None or b is None:
        return a is None and b is None
    if a == b:
        return True
    if a.is_tuple and b.is_tuple:
        ea, eb = a.tuple_elements, b.tuple_elements
        return len(ea) == len(eb) and all(
            semantically_equal(x, y, num_devices) for x, y in zip(ea, eb))
    if a.is_tuple or b.is_tuple:
        tup, one = (a, b) if a.is_tuple else (b, a)
        return all(semantically_equal(x, one, num_devices) for x in tup.tuple_elements)
    if _fully_replicated(a) and _fully_replicated(b):
        return True
    if num_devices == 1:
        def whole(s: "HloSharding") -> bool:
            return _fully_replicated(s) or (s.is_maximal and s.device == 0)
        return whole(a) and whole(b)
    return False


@dataclass(frozen=True)
class Disagreement:
    """One instruction whose shardings differ (``name`` is ours; ``xla_name`` is set
    when XLA's instruction has another name, e.g. the ``copy`` replacing a ``Sharding``
    custom-call)."""

    name: str
    opcode: str
    ours: str
    xla: str
    xla_name: str = ""

    def row(self) -> str:
        shown = f"{self.name}~{self.xla_name}" if self.xla_name else self.name
        return f"{shown:<32} {self.opcode:<18} ours={self.ours}  xla={self.xla}"


@dataclass
class AgreementReport:
    """Instruction-by-instruction agreement of our shardings with XLA's."""

    compared: int
    agreed: int
    disagreements: list[Disagreement]
    only_ours: list[str] = field(default_factory=list)  # names XLA's module lacks
    only_xla: list[str] = field(default_factory=list)   # names our module lacks
    aliases: dict[str, str] = field(default_factory=dict)  # ours -> xla, matched by structure
    label: str = ""
    # same name, different instruction (opcode or shape differ): not compared, also
    # listed in only_ours / only_xla
    name_clashes: list[str] = field(default_factory=list)
    # XLA gives no reference for these (e.g. ``xla.sdy.*`` custom-calls): not compared
    no_reference: list[str] = field(default_factory=list)

    @property
    def percent(self) -> float:
        return 100.0 * self.agreed / self.compared if self.compared else 100.0

    @property
    def disagreed(self) -> int:
        return len(self.disagreements)

    def summary(self) -> str:
        """One line: counts and percentage."""
        return (f"{self.label + ': ' if self.label else ''}{self.agreed}/{self.compared} "
                f"agree ({self.percent:.1f}%), {self.disagreed} disagree, "
                f"{len(self.only_ours)} only ours, {len(self.only_xla)} only XLA"
                + (f", {len(self.no_reference)} without XLA reference "
                   f"({', '.join(self.no_reference)})" if self.no_reference else ""))

    def table(self, limit: int | None = None) -> str:
        """:meth:`summary` and one row per disagreement (the first ``limit``)."""
        rows = self.disagreements if limit is None else self.disagreements[:limit]
        lines = [self.summary()] + ["  " + d.row() for d in rows]
        if limit is not None and len(self.disagreements) > limit:
            lines.append(f"  ... {len(self.disagreements) - limit} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _replicated() -> "HloSharding":
    from hlo_spmd.sharding import HloSharding

    return HloSharding.replicate()


def _text(s: "HloSharding | None") -> str:
    return "<none>" if s is None else str(s)


def compare_shardings(ours: Mapping[str, "HloSharding | None"],
                      xla: Mapping[str, "HloSharding | None"], *,
                      opcodes: Mapping[str, str] | None = None,
                      num_devices: int | None = None,
                      aliases: Mapping[str, str] | None = None,
                      xla_unsharded_is_replicated: bool = True,
                      clashes: Iterable[str] = (),
                      no_reference: Iterable[str] = (),
                      label: str = "") -> AgreementReport:
    """Compare, by instruction name, over the names both sides have.

    ``clashes``: names both sides use for different instructions; they are not compared
    (listed as only ours / only XLA and in ``name_clashes``). ``no_reference``: XLA
    names whose sharding XLA does not define; not compared (``no_reference``).

    Equality is :func:`semantically_equal`. ``aliases`` maps some of our names to XLA's
    (instructions XLA renamed, such as a ``Sharding`` custom-call its propagation turned
    into a ``copy``). An instruction neither side shards agrees. XLA leaves a few
    instructions unsharded after ``sharding-propagation`` (scalar constants that only
    feed a reduce's init value, the scalar ops of reduce/sort/scatter/all-reduce
    computations, ``topk``, ``xla.sdy.*`` custom-calls); its partitioner then treats
    them as replicated, so with ``xla_unsharded_is_replicated`` (default) XLA's
    ``None`` reads as ``{replicated}``. Our ``None`` against an XLA sharding is always a
    disagreement (shown as ``<none>``): our completion left a hole. ``opcodes``
    (name -> opcode) fills the table's opcode column.
    """
    aliases = dict(aliases or {})
    opcodes = opcodes or {}
    clashes = set(clashes) - set(aliases)
    skipped = set(no_reference)
    xla_used: set[str] = set()
    excluded: list[str] = []
    compared = agreed = 0
    disagreements: list[Disagreement] = []
    only_ours: list[str] = []
    for name, mine in ours.items():
        other = aliases.get(name, name)
        if other not in xla or name in clashes:
            only_ours.append(name)
            continue
        xla_used.add(other)
        if other in skipped:
            excluded.append(name)
            continue
        theirs = xla[other]
        compared += 1
        if theirs is None and mine is not None and xla_unsharded_is_replicated:
            theirs = _replicated()
        if semantically_equal(mine, theirs, num_devices):
            agreed += 1
        else:
            disagreements.append(Disagreement(
                name, opcodes.get(name, opcodes.get(other, "")), _text(mine),
                _text(xla[other]), "" if other == name else other))
    only_xla = [n for n in xla if n not in xla_used]
    return AgreementReport(compared, agreed, disagreements, only_ours, only_xla,
                           {k: v for k, v in aliases.items() if k != v}, label,
                           sorted(n for n in clashes if n in xla and n in ours), excluded)


def _align_names(ours: "Module", xla: "Module") -> dict[str, str]:
    """Pair instructions XLA renamed with ours by structure.

    Starting from instructions with the same name on both sides and the same operand
    count, an operand pair whose names exist on one side only is matched (e.g. our
    ``Sharding`` custom-call ``sharding_constraint.3`` and the ``copy.1`` XLA's
    propagation replaced it with). Roots of same-named computations pair up too.
    """
    ours_by = {i.name: i for i in ours.instructions()}
    xla_by = {i.name: i for i in xla.instructions()}
    aliases: dict[str, str] = {}
    taken: set[str] = set()
    clashes = _name_clashes(ours, xla)
    work = [(n, n) for n in ours_by if n in xla_by and n not in clashes]
    roots = []
    if ours.entry is not None and xla.entry is not None:
        roots.append((ours.entry, xla.entry))
    xla_comps = {c.name: c for c in xla.computations}
    roots += [(c, xla_comps[c.name]) for c in ours.computations
              if c.name in xla_comps and c is not ours.entry]
    for co, cx in roots:
        if co.root is None or cx.root is None:
            continue
        ro, rx = co.root.name, cx.root.name
        if ro != rx and ro not in xla_by and rx not in ours_by and rx not in taken \
                and ro not in aliases:
            aliases[ro] = rx
            taken.add(rx)
            work.append((ro, rx))
    while work:
        a, b = work.pop()
        ia, ib = ours_by[a], xla_by[b]
        if len(ia.operands) != len(ib.operands):
            continue
        for oa, ob in zip(ia.operands, ib.operands):
            if oa.name == ob.name or oa.name in aliases:
                continue
            if oa.name in xla_by or ob.name in ours_by or ob.name in taken:
                continue
            if oa.shape.dims != ob.shape.dims:
                continue
            aliases[oa.name] = ob.name
            taken.add(ob.name)
            work.append((oa.name, ob.name))
    return aliases


def _name_clashes(ours: "Module", xla: "Module") -> set[str]:
    """Names both modules use for different instructions (opcode or dims differ): XLA's
    HLO -> StableHLO -> HLO import renumbers names, so a fixture and XLA's module can
    share a name for unrelated instructions."""
    xla_by = {i.name: i for i in xla.instructions()}
    out = set()
    for inst in ours.instructions():
        other = xla_by.get(inst.name)
        if other is not None and (other.opcode != inst.opcode
                                  or other.shape.dims != inst.shape.dims
                                  or other.shape.is_tuple != inst.shape.is_tuple):
            out.add(inst.name)
    return out


def no_xla_reference(xla: "Module") -> list[str]:
    """Instructions whose sharding XLA's GSPMD completion does not define: ``xla.sdy.*``
    custom-calls (Shardy markers such as ``xla.sdy.FuncResultSharding``). GSPMD's
    propagation leaves them unsharded and its partitioner refuses them ("shouldn't
    appear in the XLA partitioner"), so there is nothing to compare with."""
    return [i.name for i in xla.instructions()
            if i.opcode == "custom-call" and i.custom_call_target.startswith("xla.sdy.")]


def compare_modules(ours: "Module", xla: "Module", *, num_devices: int | None = None,
                    align: bool = True, xla_unsharded_is_replicated: bool = True,
                    skip_no_reference: bool = True, label: str = "") -> AgreementReport:
    """:func:`compare_shardings` of two modules' instructions (by name; with ``align``
    also the instructions XLA renamed, paired by :func:`_align_names`). Same-named
    instructions with different opcodes or shapes are not compared (name clashes), nor,
    with ``skip_no_reference``, those :func:`no_xla_reference` lists."""
    opcodes = {i.name: i.opcode for i in ours.instructions()}
    for i in xla.instructions():
        opcodes.setdefault(i.name, i.opcode)
    aliases = _align_names(ours, xla) if align else {}
    return compare_shardings(module_shardings(ours), module_shardings(xla), opcodes=opcodes,
                             num_devices=num_devices, aliases=aliases,
                             xla_unsharded_is_replicated=xla_unsharded_is_replicated,
                             clashes=_name_clashes(ours, xla),
                             no_reference=no_xla_reference(xla) if skip_no_reference else (),
                             label=label)


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


def _agreement_main(root: str, xla_only: bool, verbose: int, source: str) -> int:
    if not xla_only:
        try:
            from hlo_spmd.passes.propagation import propagate  # noqa: F401
        except ImportError as exc:
            print(f"hlo_spmd.passes.propagation is not available ({exc}); "
                  "use --xla-only to check the comparison machinery", file=sys.stderr)
            return 2
    rows: list[tuple[str, AgreementReport | str]] = []
    for case in fixture_cases(root):
        try:
            rows.append((case.name, agreement_for_case(case, source=source,
                                                       xla_only=xla_only)))
        except Exception as exc:  # report and go on: one table for all fixtures
            rows.append((case.name, f"ERROR {type(exc).__name__}: {_first_lines(exc, 2)}"))
    print(format_agreement_table(rows))
    if verbose:
        for name, rep in rows:
            if isinstance(rep, AgreementReport) and rep.disagreements:
                print()
                print(rep.table(None if verbose > 1 else 20))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--_dump-worker":
        return _worker_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m hlo_spmd.runtime.xla_reference",
        description="Compare our sharding completion with XLA's GSPMD sharding-propagation.")
    parser.add_argument("--agreement", metavar="DIR", required=True,
                        help="fixture directory (e.g. fixtures/hlo)")
    parser.add_argument("--xla-only", action="store_true",
                        help="compare XLA with itself (no propagation needed)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="print disagreements (-vv: all of them)")
    parser.add_argument("--source", choices=SOURCES, default="xla-input",
                        help="propagate XLA's input to sharding-propagation (default) "
                             "or the fixture as stored")
    args = parser.parse_args(argv)
    return _agreement_main(args.agreement, args.xla_only, args.verbose, args.source)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
