"""XLA's dumps of one compile: the module after each requested pass (and the module XLA's
pipeline received), made by compiling with per-compile dump options, in this process or
in a subprocess with N host devices (see :mod:`hlo_spmd.runtime.xla_reference` for the
whole story). :func:`dump_worker` is the subprocess's work; it returns an exit code and
leaves its error in ``worker_error.txt`` (the library never prints or exits).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.runtime.module_io import ModuleLike, to_proto_bytes

if TYPE_CHECKING:  # pragma: no cover
    from hlo_spmd.ir.module import Module

#: The passes dumped by default: the completion and the partitioner.
DEFAULT_PASSES = ("sharding-propagation", "spmd-partitioning")
#: The completion pass when XLA runs Shardy (``use_shardy_partitioner=True``).
SHARDY_COMPLETION_PASS = "shardy-xla"
GSPMD_COMPLETION_PASS = "sharding-propagation"
PARTITIONING_PASS = "spmd-partitioning"

# module_0001.jit_f.0001.spmd-partitioner.after_sharding-propagation.before_spmd-partitioning.txt
_DUMP_RE = re.compile(
    r"^module_(?P<module>\d+)\.(?P<name>.+)\.(?P<seq>\d{4})\.(?P<pipeline>[^.]+)"
    r"\.after_(?P<after>[^.]+)\.before_(?P<before>[^.]+)\.(?P<ext>txt|hlo\.pb)$")


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
    """The directory holding the ``hlo_spmd`` package (this file is hlo_spmd/runtime/)."""
    return str(Path(__file__).resolve().parent.parent.parent)


# The subprocess's entry point (the process's own script, not library code).
_WORKER_SCRIPT = ("import sys; from hlo_spmd.runtime.xla_dumps import dump_worker; "
                  "sys.exit(dump_worker(sys.argv[1:]))")


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
    cmd = [sys.executable, "-c", _WORKER_SCRIPT,
           str(module_file), str(n), "1" if shardy else "0", regex, str(out_dir)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise HloSpmdError(f"XLA dump subprocess timed out after {timeout:.0f} s") from exc
    error_file = out_dir.parent / "error.txt"
    if proc.returncode != 0:
        worker_error = out_dir.parent / "worker_error.txt"
        tail = worker_error.read_text() if worker_error.exists() else \
            " ".join(proc.stderr.strip().splitlines()[-4:])
        raise HloSpmdError(f"XLA dump subprocess failed (exit {proc.returncode}): {tail}")
    return error_file.read_text() if error_file.exists() else None


def dump_worker(args: Sequence[str]) -> int:
    """The dump subprocess's work (``_compile_in_subprocess`` starts it): compile and dump;
    returns the exit code, its error written to ``worker_error.txt`` beside the module."""
    module_file, n, shardy, regex, out_dir = args
    out = Path(out_dir)
    try:
        error = _compile_and_dump(Path(module_file).read_bytes(), int(n), shardy == "1",
                                  regex, out)
    except HloSpmdError as exc:
        (out.parent / "worker_error.txt").write_text(str(exc))
        return 3
    if error is not None:
        (out.parent / "error.txt").write_text(error)
    return 0
