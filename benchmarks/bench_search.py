"""Time ``hlo-spmd search`` on the L-layer transformer training step of
``gen_train_step.py`` with its annotations stripped (the step as a framework would export
it unannotated), on the 2x4 data x model mesh, with the peak of the generator's own
(expert) annotation as the memory budget. Prints the expert's and the search's bytes per
device and peak, the time, and the chosen specs. Timing only, never asserted.

    python benchmarks/bench_search.py --layers 2,28
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="2,28")
    ap.add_argument("--no-limit", action="store_true",
                    help="search without the expert's peak as the memory budget")
    args = ap.parse_args(argv)
    import gen_train_step as gen

    import hlo_spmd
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.search.heldout import strip_annotations
    from hlo_spmd.ir.io import module_bytes
    from hlo_spmd.search.pricing import price_of
    from hlo_spmd.stats import format_bytes

    for layers in (int(x) for x in args.layers.split(",")):
        path = gen.path_for(layers)
        if not path.exists():
            gen.generate(layers)
        expert = price_of(hlo_spmd.partition(str(path)))
        plain = strip_annotations(hlo_spmd.load(str(path)))
        plain = hlo_spmd.load(module_bytes(plain))
        t0 = time.monotonic()
        try:
            got = hlo_spmd.search(plain, mesh="data=2,model=4",
                                  memory_limit=None if args.no_limit else expert.peak,
                                  progress=lambda s: print(f"  {time.monotonic() - t0:6.1f}s {s}",
                                                           flush=True))
        except HloSpmdError as e:
            print(f"L={layers}: {time.monotonic() - t0:.1f} s: {e}")
            continue
        dt = time.monotonic() - t0
        win = got.report["winner"]
        print(f"L={layers} ({plain.instruction_count()} instructions): expert "
              f"{format_bytes(expert.bytes)} / peak {format_bytes(expert.peak)}; search "
              f"{format_bytes(win['bytes_per_device'])} / peak {format_bytes(win['peak_bytes'])}"
              f"; {dt:.1f} s; {got.report['search']}")
        specs = {}
        for p in got.report["parameters"]:
            specs.setdefault(p["spec"], []).append(p["parameter"])
        print("  chosen:", {s: len(v) for s, v in specs.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
