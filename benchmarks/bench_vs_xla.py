"""hlo-spmd against XLA's own GSPMD passes: whole process, stages, device curve, memory.

    python benchmarks/bench_vs_xla.py [--layers 7,28] [--meshes 8,32,128,512,2048]
        [--big 100k] [--repeat 3] [--skip xla,curve,big]

Modules (made on demand in benchmarks/generated/, gitignored):

* the L-layer transformer training step (``gen_train_step.py``: fwd + bwd + Adam-like
  update with weight-update sharding, 2x4 data x model mesh, jax 0.10 lowering);
* the same step re-expressed on larger meshes (``rescale_mesh``) for the device curve;
* the ~100k-instruction transformer-like stack of ``gen_modules.py``.

Per module and repeat this measures, in ONE run so the ratio is fair on a shared machine:

* ``xla``: wall time of XLA's ``sharding-propagation`` + ``spmd-partitioning`` passes,
  read from dump-file mtimes (compile through jaxlib in a fresh subprocess with
  ``xla_dump_hlo_pass_re='.*'``, protos only: the dump written just before
  ``after_sharding-propagation`` to the ``after_spmd-partitioning`` one);
* ``process``: wall time of ``hlo-spmd partition IN -o OUT.pb`` as a fresh process
  (start-up, imports, load, completion, partitioning, verify, save) and its peak RSS;
* ``load`` / ``complete`` / ``partition`` / ``save``: the same stages in this process.

Reported: the median of ``--repeat`` runs of each, and ratio = median(process) /
median(xla). Results go to benchmarks/results/vs_xla-<date>.json. Measured, never
asserted.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GENERATED = HERE / "generated"
sys.path.insert(0, str(HERE))
try:
    import hlo_spmd  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "src"))

import gen_train_step  # noqa: E402


# --------------------------------------------------------------------------- XLA's time

_XLA_WORKER = r"""
import os, sys
n = int(sys.argv[2])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n}"
os.environ["JAX_PLATFORMS"] = "cpu"
from hlo_spmd.runtime._jax import cpu_devices, load_jax
from hlo_spmd.runtime.compile import compile_options
devices = cpu_devices(n)
xc = load_jax(n).xla_client
options = compile_options(n)
build = options.executable_build_options
build.use_spmd_partitioning = True
debug = build.debug_options
debug.xla_dump_to = sys.argv[3]
debug.xla_dump_hlo_pass_re = ".*"
debug.xla_dump_hlo_as_text = False
debug.xla_dump_hlo_as_proto = True
stablehlo = xc._xla.mlir.hlo_to_stablehlo(open(sys.argv[1], "rb").read())
devices[0].client.compile_and_load(stablehlo, xc.DeviceList(tuple(devices)), options)
"""


def xla_pass_seconds(pb: Path, n: int) -> float:
    """Wall time of XLA's sharding-propagation + spmd-partitioning passes on ``pb``."""
    import re

    pat = re.compile(r"^module_\d+\..+\.(?P<seq>\d{4})\.(?P<pipe>[^.]+)"
                     r"\.after_(?P<after>[^.]+)\.before_[^.]+\.hlo\.pb$")
    with tempfile.TemporaryDirectory(prefix="xla-dump-") as d:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        subprocess.run([sys.executable, "-c", _XLA_WORKER, str(pb), str(n), d],
                       check=True, env=env, capture_output=True)
        files = []
        for name in os.listdir(d):
            m = pat.match(name)
            if m:
                files.append((int(m.group("seq")), m.group("pipe"), m.group("after"),
                              os.stat(os.path.join(d, name)).st_mtime_ns))
        files.sort()
        idx = {after: i for i, (_, _, after, _) in reversed(list(enumerate(files)))}
        sp, pt = idx.get("sharding-propagation"), idx.get("spmd-partitioning")
        if sp is None or pt is None or sp == 0:
            raise RuntimeError(f"{pb.name}: XLA dumps lack the GSPMD passes")
        return (files[pt][3] - files[sp - 1][3]) / 1e9


# --------------------------------------------------------------------------- ours

def process_run(src: Path, n: int) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS MB) of ``hlo-spmd partition src -o out.pb -n n``.

    CPU time (user + system of the child) is reported beside the wall time because
    the machine may be shared: it moves much less with other load."""
    with tempfile.TemporaryDirectory(prefix="hlo-spmd-bench-") as d:
        out = Path(d) / "out.pb"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT / "src"), str(ROOT / ".pypath")] + sys.path))
        # As installed: byte-compiled once (this machine sets PYTHONDONTWRITEBYTECODE,
        # which would recompile every module in every run).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        cmd = [sys.executable, "-m", "hlo_spmd_cli", "partition", str(src), "-o", str(out),
               "-n", str(n)]
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode()
        proc.stderr.close()
        if proc.returncode != 0:
            raise RuntimeError(f"hlo-spmd partition {src.name} failed: {err.strip()}")
        return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


def stage_run(src: Path, n: int) -> dict[str, float]:
    """Seconds of load / complete / partition / save, in a fresh process (caches cold,
    as in a real run)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src")] + sys.path))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run([sys.executable, __file__, "--stages-worker", str(src), str(n)],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _stages_here(src: Path, n: int) -> dict[str, float]:
    from hlo_spmd.annotations import normalize_annotations
    from hlo_spmd.ir.io import load_module, save_module
    from hlo_spmd.ir.verifier import verify_module
    from hlo_spmd.passes.inline_calls import inline_calls
    from hlo_spmd.passes.partition.driver import partition_module
    from hlo_spmd.passes.propagation import propagate

    gc.collect()
    out = {}
    t0 = time.perf_counter()
    module = load_module(str(src), verify=True)
    t1 = time.perf_counter()
    inline_calls(module)
    # (normalized once, as the CLI's partition does)
    propagate(module, annotations=normalize_annotations(module))
    t2 = time.perf_counter()
    result, _ = partition_module(module, n)
    verify_module(result)
    t3 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        save_module(result, str(Path(d) / "out.pb"))
    t4 = time.perf_counter()
    out.update(load=t1 - t0, complete=t2 - t1, partition=t3 - t2, save=t4 - t3,
               instructions_out=result.instruction_count())
    return out


# --------------------------------------------------------------------------- modules

def train_step(layers: int, regenerate: bool = False) -> Path:
    p = gen_train_step.path_for(layers)
    if regenerate or not p.exists():
        subprocess.run([sys.executable, str(HERE / "gen_train_step.py"), "--layers",
                        str(layers)], check=True)
    return p


def on_mesh(src: Path, n: int) -> Path:
    """``src`` (a 2x4 module) re-expressed on the ``n``-device mesh of MESHES."""
    if n == 8:
        return src
    dst = src.with_name(f"{src.stem}_n{n}.pb")
    if not dst.exists() or dst.stat().st_mtime < src.stat().st_mtime:
        from hlo_spmd.ir.io import load_module, save_module

        m = load_module(str(src))
        gen_train_step.rescale_mesh(m, *gen_train_step.MESHES[n])
        save_module(m, str(dst))
    return dst


def big_module(size: str) -> Path:
    import gen_modules

    p = GENERATED / f"transformer_{size}.pb"
    if not p.exists():
        gen_modules.write(size)
    return p


def count(src: Path) -> int:
    from hlo_spmd.ir.io import load_module

    return load_module(str(src)).instruction_count()


# --------------------------------------------------------------------------- main

def _med(xs):
    return statistics.median(xs) if xs else float("nan")


def measure(label: str, src: Path, n: int, repeat: int, xla: bool) -> dict:
    return measure_interleaved([(label, src, n)], repeat, xla)[0]


def measure_interleaved(specs: list[tuple[str, Path, int]], repeat: int,
                        xla: bool) -> list[dict]:
    """One row per (label, module, devices). Repeats go round the rows (a, b, a, b, ...),
    so a ratio between rows is taken under the same drift of the machine's load."""
    rows = [{"module": label, "file": src.name, "devices": n, "instructions": count(src),
             "xla": [], "process": [], "process_cpu": [], "rss_mb": [], "stages": []}
            for label, src, n in specs]
    for _ in range(repeat):
        for row, (_, src, n) in zip(rows, specs):
            if xla:
                row["xla"].append(xla_pass_seconds(src, n))
            wall, cpu, rss = process_run(src, n)
            row["process"].append(wall)
            row["process_cpu"].append(cpu)
            row["rss_mb"].append(rss)
            row["stages"].append(stage_run(src, n))
    return [_summarise(row) for row in rows]


def _summarise(row: dict) -> dict:
    for k in ("load", "complete", "partition", "save"):
        row[k] = _med([s[k] for s in row["stages"]])
    row["process_s"] = _med(row["process"])
    row["process_cpu_s"] = _med(row["process_cpu"])
    row["xla_s"] = _med(row["xla"])
    row["ratio"] = row["process_s"] / row["xla_s"] if row["xla"] else float("nan")
    row["peak_rss_mb"] = max(row["rss_mb"])
    return row


HEADER = ("| module | instr | devices | load s | complete s | partition s | save s | "
          "process s (cpu s) | XLA passes s | ratio | peak RSS MB |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def fmt(r: dict) -> str:
    x = f"{r['xla_s']:.2f}" if r["xla"] else "-"
    ratio = f"{r['ratio']:.1f}x" if r["xla"] else "-"
    return (f"| {r['module']} | {r['instructions']} | {r['devices']} | {r['load']:.2f} | "
            f"{r['complete']:.2f} | {r['partition']:.2f} | {r['save']:.2f} | "
            f"{r['process_s']:.2f} ({r['process_cpu_s']:.2f}) | {x} | {ratio} | {r['peak_rss_mb']:.0f} |")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--stages-worker"]:
        print(json.dumps(_stages_here(Path(argv[1]), int(argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="7,28")
    ap.add_argument("--meshes", default="8,32,128,512,2048")
    ap.add_argument("--curve-layers", type=int, default=7)
    ap.add_argument("--big", default="100k")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of: main,xla,curve,big")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    rows = []
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"({os.cpu_count()} cpus)")
    print(HEADER, flush=True)
    if "main" not in skip:
        for L in (int(x) for x in args.layers.split(",")):
            r = measure(f"train step {L} layers", train_step(L), 8, args.repeat,
                        "xla" not in skip)
            rows.append(r)
            print(fmt(r), flush=True)
    if "curve" not in skip:
        base = train_step(args.curve_layers)
        specs = []
        for n in (int(x) for x in args.meshes.split(",")):
            a, b = gen_train_step.MESHES[n]
            specs.append((f"train step {args.curve_layers} layers, {a}x{b}",
                          on_mesh(base, n), n))
        curve = measure_interleaved(specs, args.repeat, False)
        for r in curve:
            rows.append(r)
            print(fmt(r), flush=True)
        if len(curve) > 1:
            first = curve[0]
            for r in curve[1:]:
                print(f"  {r['devices']} vs {first['devices']} devices: process "
                      f"{r['process_s'] / first['process_s']:.2f}x (cpu "
                      f"{r['process_cpu_s'] / first['process_cpu_s']:.2f}x), complete+partition "
                      f"{(r['complete'] + r['partition']) / (first['complete'] + first['partition']):.2f}x")
    if "big" not in skip and args.big:
        src = big_module(args.big)
        r = measure(f"stack {args.big}", src, 8, 1 if args.repeat < 3 else args.repeat, False)
        rows.append(r)
        print(fmt(r), flush=True)
        print(f"  load+complete+partition+save: "
              f"{r['load'] + r['complete'] + r['partition'] + r['save']:.2f} s")
    load = os.getloadavg()
    print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    (out / f"vs_xla-{stamp}.json").write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
