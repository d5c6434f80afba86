"""CPU time per stage against the device count, in fresh processes taken in turns.

    python benchmarks/bench_devices.py [--repeat 7] [FILE.pb:N ...]

Default: the 7-layer training step on 8 devices (train_step_L7.pb) and the same step on
2048 (train_step_L7_n2048.pb, made by bench_vs_xla.py's device curve). Every repeat runs
each (module, N) once in a fresh process, in turn, so every row sees the same drift of a
shared machine's load. A process reports ``time.process_time`` (CPU, not wall) for:
import, load (with the input verify), complete (inline, normalize, propagate), partition
(with tidy and the output verify) and save. Printed: the median and the minimum of each
stage, and the ratio of every row's total to the first row's. Measured, never asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STAGES = ("import", "load", "complete", "partition", "save")

_WORKER = r"""
import gc, json, sys, time
c0 = time.process_time()
from hlo_spmd.annotations import normalize_annotations
from hlo_spmd.ir.io import load_module, save_module
from hlo_spmd.ir.verifier import verify_module
from hlo_spmd.passes.inline_calls import inline_calls
from hlo_spmd.passes.partition.driver import partition_module
from hlo_spmd.passes.propagation import propagate
gc.disable()  # as the CLI runs its command
t = [time.process_time()]
m = load_module(sys.argv[1], verify=True); t.append(time.process_time())
inline_calls(m); normalize_annotations(m); propagate(m); t.append(time.process_time())
r, _ = partition_module(m, int(sys.argv[2])); verify_module(r); t.append(time.process_time())
save_module(r, sys.argv[3]); t.append(time.process_time())
print(json.dumps([t[0] - c0] + [b - a for a, b in zip(t, t[1:])]))
"""


def run_once(src: str, n: int) -> list[float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src")] + sys.path))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # byte-compiled once, as installed
    with tempfile.TemporaryDirectory(prefix="hlo-spmd-devices-") as d:
        out = subprocess.run([sys.executable, "-c", _WORKER, src, str(n),
                              str(Path(d) / "out.pb")],
                             env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("specs", nargs="*", metavar="FILE.pb:N")
    args = ap.parse_args(argv)
    gen = HERE / "generated"
    specs = args.specs or [f"{gen / 'train_step_L7.pb'}:8",
                           f"{gen / 'train_step_L7_n2048.pb'}:2048"]
    rows = []
    for spec in specs:
        path, _, n = spec.rpartition(":")
        if not Path(path).exists():
            print(f"bench_devices: no such module {path}", file=sys.stderr)
            return 2
        rows.append((path, int(n), []))
    for _ in range(args.repeat):
        for path, n, runs in rows:
            runs.append(run_once(path, n))
    print(f"CPU seconds (time.process_time), {args.repeat} fresh processes per row, "
          "taken in turns: median (min)")
    print("| module | devices | " + " | ".join(STAGES) + " | total | total vs first |")
    print("|---|---|" + "---|" * (len(STAGES) + 2))
    first = None
    for path, n, runs in rows:
        totals = [sum(r) for r in runs]
        med = statistics.median(totals)
        first = med if first is None else first
        cells = [f"{statistics.median(r[i] for r in runs):.3f} ({min(r[i] for r in runs):.3f})"
                 for i in range(len(STAGES))]
        print(f"| {Path(path).name} | {n} | " + " | ".join(cells) +
              f" | {med:.3f} ({min(totals):.3f}) | {med / first:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
