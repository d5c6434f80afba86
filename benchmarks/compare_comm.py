"""Communicated bytes per device: hlo-spmd vs XLA's own GSPMD, per fixture.

    python benchmarks/compare_comm.py [fixtures/hlo] [--json out.json] [--combine-threshold MiB]

Partitions every fixture with hlo-spmd, gets XLA's partitioned module for the same
input (after its spmd-partitioning pass, through jaxlib), and prints collectives per
kind and bytes per device for both, and the largest array and peak-live estimate
(hlo_spmd.stats) of each program. A figure, not a test: see tests/test_comm_vs_xla.py
for the assertion that ours is never more than XLA's.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def compare_fixture(path: str, options=None) -> dict:
    from hlo_spmd.ir.io import load_module, load_module_bytes, module_bytes
    from hlo_spmd.passes.partition import partition_in_place
    from hlo_spmd.runtime.xla_reference import xla_partitioned_module
    from hlo_spmd.stats import module_stats

    meta = json.load(open(path[:-3] + ".json"))
    n = meta["num_partitions"]
    data = open(path, "rb").read()
    ours = partition_in_place(load_module(path), n, options=options).module
    row = {"fixture": os.path.basename(path)[:-3], "n": n}
    a = module_stats(ours, n)
    row["ours"] = {k: (a.collectives[k].count, a.collectives[k].bytes_per_device) for k in KINDS}
    row["ours_total"] = a.total_bytes_per_device
    row["ours_largest"] = a.largest_array.bytes if a.largest_array else 0
    row["ours_peak"] = a.peak_live_bytes
    try:
        xla = load_module_bytes(xla_partitioned_module(data, n), "xla")
    except Exception as e:  # XLA cannot partition it (e.g. Shardy custom-calls)
        row["xla"] = None
        row["xla_error"] = str(e).splitlines()[0][:120]
        return row
    b = module_stats(xla, n)
    row["xla"] = {k: (b.collectives[k].count, b.collectives[k].bytes_per_device) for k in KINDS}
    row["xla_total"] = b.total_bytes_per_device
    row["xla_largest"] = b.largest_array.bytes if b.largest_array else 0
    row["xla_peak"] = b.peak_live_bytes
    return row


def main(argv=None) -> int:
    from hlo_spmd.runtime.devices import ensure_host_devices

    ensure_host_devices(8)
    p = argparse.ArgumentParser()
    p.add_argument("root", nargs="?", default="fixtures/hlo")
    p.add_argument("--json", default=None)
    p.add_argument("--combine-threshold", type=float, default=None, metavar="MiB",
                   help="ours with this collective-combining threshold (0: off; default: "
                        "the partitioner's default)")
    args = p.parse_args(argv)
    from hlo_spmd.passes.partition import PartitionOptions

    options = (PartitionOptions(combine_threshold_mib=args.combine_threshold)
               if args.combine_threshold is not None else None)
    rows = []
    for path in sorted(glob.glob(os.path.join(args.root, "*.pb"))):
        meta = json.load(open(path[:-3] + ".json"))
        if meta.get("partition_only"):
            continue
        rows.append(compare_fixture(path, options))
    short = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS",
             "all-to-all": "A2A", "collective-permute": "CP"}

    def counts(d):
        return " ".join(f"{short[k]}{d[k][0]}" for k in KINDS if d[k][0]) or "-"

    print("| fixture | N | ours: collectives | ours bytes/dev | XLA: collectives | XLA bytes/dev "
          "| largest ours / XLA (B) | peak live ours / XLA (B) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        xla = (counts(r["xla"]), f"{r['xla_total']:.0f}") if r["xla"] else ("n/a", r.get("xla_error", ""))
        lx, px = (r["xla_largest"], r["xla_peak"]) if r["xla"] else ("-", "-")
        print(f"| {r['fixture']} | {r['n']} | {counts(r['ours'])} | {r['ours_total']:.0f} | "
              f"{xla[0]} | {xla[1]} | {r['ours_largest']} / {lx} | {r['ours_peak']} / {px} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
