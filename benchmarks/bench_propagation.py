"""Time loading and sharding propagation on generated modules of ~1k, 10k, 100k instructions.

For each size: the module is generated if missing (``gen_modules.py``), then loaded and
propagated ``--repeat`` times (every repeat loads a fresh module, since propagation
annotates in place). Reported per size: the MEDIAN load time of the text (our parser) and
of the proto, the median ``propagate`` time, and time per instruction. Printed as a
table and saved as JSON to ``benchmarks/results/`` (``propagation-<UTC time>.json`` and
``propagation-latest.json``). Times are measured, never asserted.

    python -m benchmarks.bench_propagation            # from the repository root
    python benchmarks/bench_propagation.py --sizes 1k,10k --repeat 5
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))
try:
    import hlo_spmd  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent / "src"))

import gen_modules  # noqa: E402


def _propagation() -> tuple[Callable | None, str]:
    try:
        from hlo_spmd.passes.propagation import propagate
    except ImportError as exc:
        return None, f"hlo_spmd.passes.propagation is not available yet ({exc})"
    return propagate, ""


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    t = time.perf_counter()
    value = fn()
    return time.perf_counter() - t, value


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def bench_size(size: str, repeat: int, propagate: Callable | None, formats: list[str],
               regenerate: bool) -> dict:
    from hlo_spmd.ir.io import load_module

    paths = gen_modules.paths_for(size)
    if regenerate or not paths["hlo"].exists() or not paths["json"].exists() or (
            "pb" in formats and not paths["pb"].exists()):
        gen_modules.write(size, pb="pb" in formats)
    meta = json.loads(paths["json"].read_text())
    load_times: dict[str, list[float]] = {f: [] for f in formats if paths[f].exists()}
    prop_times: list[float] = []
    errors: list[str] = []
    sharded_after = None
    first = next(iter(load_times), None)
    for _ in range(repeat):
        module = None
        for fmt in load_times:
            dt, m = _timed(lambda: load_module(paths[fmt]))
            load_times[fmt].append(dt)
            if fmt == first:
                module = m
        if propagate is None or module is None:
            continue
        try:
            dt, _ = _timed(lambda: propagate(module))
        except Exception as exc:  # report, keep timing the other sizes
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            break
        prop_times.append(dt)
        sharded_after = sum(1 for i in module.instructions() if i.sharding is not None)
    n = meta["instructions"]
    med_prop = _median(prop_times)
    return {
        "size": size,
        "instructions": n,
        "blocks": meta["blocks"],
        "annotated": meta["annotated"],
        "repeat": repeat,
        "load_seconds": {f: {"median": _median(v), "all": v} for f, v in load_times.items()},
        "propagate_seconds": {"median": med_prop, "all": prop_times},
        "propagate_us_per_instruction": None if med_prop is None else 1e6 * med_prop / n,
        "sharded_after_propagation": sharded_after,
        "errors": errors,
    }


def _fmt(x: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x * scale:.{digits}f}"


def table(rows: list[dict], formats: list[str]) -> str:
    head = f"{'size':>6} {'instr':>8} {'annot':>6} " + "".join(
        f"{'load ' + f + ' s':>12}" for f in formats) + \
        f"{'propagate s':>13} {'us/instr':>9} {'sharded':>8}"
    lines = [head]
    for r in rows:
        loads = "".join(f"{_fmt(r['load_seconds'].get(f, {}).get('median')):>12}"
                        for f in formats)
        lines.append(f"{r['size']:>6} {r['instructions']:>8} {r['annotated']:>6} {loads}"
                     f"{_fmt(r['propagate_seconds']['median']):>13} "
                     f"{_fmt(r['propagate_us_per_instruction'], 1, 2):>9} "
                     f"{str(r['sharded_after_propagation'] or 'n/a'):>8}")
        for e in r["errors"]:
            lines.append(f"{'':>6} propagate failed: {e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=",".join(gen_modules.DEFAULT_SIZES))
    ap.add_argument("--repeat", type=int, default=3, help="runs per size (median reported)")
    ap.add_argument("--formats", default="hlo,pb",
                    help="which files to time loading: hlo (our text parser), pb (proto); "
                         "propagation runs on the first")
    ap.add_argument("--regenerate", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not set(formats) <= {"hlo", "pb"}:
        ap.error("--formats takes hlo and/or pb")
    propagate, missing = _propagation()
    if missing:
        print(f"NOTE: {missing}; timing loading only.")
    rows = []
    for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        rows.append(bench_size(size, max(1, args.repeat), propagate, formats, args.regenerate))
        print(f"  {size}: done", file=sys.stderr)
    print(table(rows, formats))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    result = {
        "benchmark": "propagation",
        "utc": stamp,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "propagation_available": propagate is not None,
        "note": missing,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name in (f"propagation-{stamp}.json", "propagation-latest.json"):
        (args.out / name).write_text(json.dumps(result, indent=1) + "\n")
    print(f"saved {args.out / f'propagation-{stamp}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
