"""Partition time against instruction count and device count.

    python benchmarks/bench_partition.py [--sizes 1k,10k,100k] [--devices 8,64,2048] [--repeat 3]

The generated transformer-like stacks (gen_modules.py, 2x4 data x model mesh) are
re-expressed on larger meshes of the same shape class (8 = 2x4, 64 = 4x16, 2048 =
32x64) by rewriting their sharding texts, then completed and partitioned. Reported per
(size, devices): median seconds of propagate + partition (load excluded), microseconds
per instruction, and the partitioned program's instruction count. Measured, never
asserted. Results also go to benchmarks/results/partition-<date>.json.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import hlo_spmd  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent / "src"))

import gen_modules  # noqa: E402

MESHES = {8: (2, 4), 64: (4, 16), 2048: (32, 64)}


def rescale(text: str, n: int) -> str:
    """Rewrite the 2x4 mesh shardings of a generated module for ``n`` devices."""
    a, b = MESHES[n]
    subs = {
        "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}":
            f"{{devices=[{a},1,1,{b}]<=[{n}] last_tile_dim_replicate}}",
        "{devices=[1,1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}":
            f"{{devices=[1,1,{b},{a}]<=[{a},{b}]T(1,0) last_tile_dim_replicate}}",
        "{devices=[1,4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}":
            f"{{devices=[1,{b},1,{a}]<=[{a},{b}]T(1,0) last_tile_dim_replicate}}",
        "num_partitions=8": f"num_partitions={n}",
    }
    for old, new in subs.items():
        text = text.replace(old, new)
    return text


def bench(size: str, n: int, repeat: int) -> dict:
    from hlo_spmd.ir.text_parser import parse_module
    from hlo_spmd.passes.partition import partition_in_place

    text, meta = gen_modules.generate(gen_modules.parse_size(size))
    text = rescale(text, n)
    times, out_count = [], None
    for _ in range(repeat):
        module = parse_module(text)
        gc.collect()
        t = time.perf_counter()
        result = partition_in_place(module, n, verify=False)
        times.append(time.perf_counter() - t)
        out_count = result.module.instruction_count()
    med = statistics.median(times)
    return {"size": size, "devices": n, "instructions": meta["instructions"],
            "median_s": med, "us_per_instruction": 1e6 * med / meta["instructions"],
            "partitioned_instructions": out_count, "runs": times}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1k,10k,100k")
    ap.add_argument("--devices", default="8,64,2048")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    print("| size | instructions | devices | median s (complete + partition) | us/instr | "
          "partitioned instructions |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        for n in (int(d) for d in args.devices.split(",")):
            repeat = 1 if gen_modules.parse_size(size) >= 100000 else args.repeat
            r = bench(size, n, repeat)
            rows.append(r)
            print(f"| {size} | {r['instructions']} | {n} | {r['median_s']:.2f} | "
                  f"{r['us_per_instruction']:.0f} | {r['partitioned_instructions']} |", flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    (out / f"partition-{stamp}.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
