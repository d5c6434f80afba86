"""The external suite: XLA's own partitioner tests, partitioned by hlo-spmd and by XLA.

    python benchmarks/external_suite.py PATH/spmd_partitioner_test.cc [--out DIR]
        [--jobs 2] [--timeout 120] [--only REGEX] [--json results.json] [--ours-only]

1. Extraction: every ``TEST_P`` / ``TEST_F`` of the file is scanned for raw string
   literals (``R"(...)"``, ``R"delim(...)delim"``) assigned to a variable and for the
   ``PartitionComputation(var, /*num_devices=*/N, ...)`` calls that use them. Each such
   (module, N) pair becomes ``DIR/modules/<Test>[_k].hlo``; a test with no call, a module
   not given as a raw string literal, or a device count that is not a literal is listed
   with the reason it was skipped (``DIR/index.json``).
2. Measurement, one subprocess per module and side (a hung or crashing module cannot take
   the run down; ``--timeout`` seconds each): hlo-spmd's in-process API, and XLA's own
   partitioner through jaxlib (``hlo_spmd.runtime.xla_reference``; its dumps are cached on
   disk under ``DIR/xla_cache`` so reruns only re-partition with hlo-spmd). Both programs
   are counted with the one cost model (:func:`hlo_spmd.stats.module_stats`): bytes per
   device over all collectives, and the largest array.
3. Summary: per module ours/XLA ratio and status (ok, refused by us, refused by XLA,
   timeout, error). Ratio is 1 when both move 0 bytes; a module where XLA moves 0 and we
   move more is listed separately and left out of the geometric mean (its ratio is
   infinite). The geometric mean is over the modules both sides partitioned; a ratio of 0
   (we move nothing, XLA moves bytes) is floored at 1e-9 (``geomean_finite``) and at 0.01
   (``geomean_finite_floor_0.01``, which a few such modules cannot dominate).

The file and the modules cut from it are XLA's (fetched public material): keep them out of
this repository; DIR defaults to ``/work/ext/suite``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_TEST = re.compile(r"^TEST_[PF]\(\s*(\w+)\s*,\s*(\w+)\s*\)", re.M)
_RAW = re.compile(r'(\w+)\s*=\s*R"(\w*)\(', re.S)
_CALL = re.compile(r"\bPartitionComputation\s*\(")
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_FORMAT = re.compile(r"%s(?![\w.])|\$\d")  # StrFormat / Substitute placeholders


# -- extraction -------------------------------------------------------------------------------
def _call_args(text: str, start: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose '(' ends at ``start``."""
    depth, args, cur, i = 1, [], [], start
    while i < len(text) and depth:
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                break
        if c == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    args.append("".join(cur).strip())
    return [_COMMENT.sub("", a).strip() for a in args]


def extract(cc_path: str, out_dir: Path) -> list[dict]:
    """Cut the modules out of ``cc_path`` into ``out_dir/modules``; returns the index rows
    (name, num_devices, file or skip reason)."""
    text = Path(cc_path).read_text()
    heads = list(_TEST.finditer(text))
    mod_dir = out_dir / "modules"
    mod_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for k, head in enumerate(heads):
        body = text[head.end(): heads[k + 1].start() if k + 1 < len(heads) else len(text)]
        name = head.group(2)
        strings: dict[str, str] = {}
        for m in _RAW.finditer(body):
            end = body.find(f'){m.group(2)}"', m.end())
            if end >= 0:
                strings[m.group(1)] = body[m.end():end]
        calls = [_call_args(body, m.end()) for m in _CALL.finditer(body)]
        if not calls:
            rows.append({"name": name, "skip": "no PartitionComputation call"})
            continue
        for j, args in enumerate(calls):
            row = {"name": name if len(calls) == 1 else f"{name}_{j}"}
            var = args[0]
            n = args[1] if len(args) > 1 else ""
            if var not in strings:
                row["skip"] = f"module {var!r} is not a raw string literal of the test"
            elif not n.isdigit():
                row["skip"] = f"num_devices {n!r} is not a literal"
            elif _FORMAT.search(strings[var]):
                row["skip"] = "module is a format string (substituted at run time)"
            else:
                row["num_devices"] = int(n)
                extra = [a for a in args[2:] if a]
                if extra:  # non-default partitioner options: XLA's default pipeline differs
                    row["options"] = extra
                f = mod_dir / f"{row['name']}.hlo"
                f.write_text(strings[var].strip() + "\n")
                row["file"] = str(f)
            rows.append(row)
    (out_dir / "index.json").write_text(json.dumps(rows, indent=1))
    return rows


# -- measurement (runs in a subprocess per module and side) ----------------------------------
def _summary(module, n: int) -> dict:
    from hlo_spmd.stats import module_stats

    s = module_stats(module, n)
    top = sorted(s.records, key=lambda r: -r.bytes_per_device)[:4]
    return {"bytes": s.total_bytes_per_device,
            "largest": s.largest_array.bytes if s.largest_array else 0,
            "largest_shape": s.largest_array.shape if s.largest_array else "",
            "collectives": {k: c.count for k, c in s.collectives.items() if c.count},
            "top": [[r.kind, r.name, r.bytes_per_device] for r in top]}


def measure_ours(path: str, n: int) -> dict:
    import hlo_spmd
    from hlo_spmd.errors import HloSpmdError

    start = time.perf_counter()
    try:
        r = hlo_spmd.partition(Path(path).read_text(), n)
    except HloSpmdError as e:
        return {"status": "refused", "reason": str(e).splitlines()[0][:300]}
    out = _summary(r.module, n)
    out["status"] = "ok"
    out["seconds"] = round(time.perf_counter() - start, 2)
    out["remats"] = len(r.warnings)
    return out


def measure_xla(path: str, n: int, cache: str) -> dict:
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.ir.io import load_module_bytes
    from hlo_spmd.runtime.xla_reference import xla_pass_dumps

    try:
        dumps = xla_pass_dumps(Path(path).read_text(), n, shardy=False, cache=cache,
                               mode="inprocess")
    except HloSpmdError as e:
        return {"status": "refused", "reason": str(e).splitlines()[0][:300]}
    if "spmd-partitioning" not in dumps.after:
        return {"status": "refused", "reason": (dumps.error or "no partitioned dump")[:300]}
    out = _summary(load_module_bytes(dumps.partitioned.proto, "xla"), n)
    out["status"] = "ok"
    return out


def _worker(argv: list[str]) -> int:
    """A batch worker: measure every module of the job file in turn, announcing each in
    ``current`` before it starts (so the parent can time it out) and writing its result
    to ``results/<name>.json``. One process per batch: jax starts once."""
    side, job, res_dir, cache = argv[:4]
    rows = json.loads(Path(job).read_text())
    if side == "xla":
        from hlo_spmd.runtime.devices import ensure_host_devices

        ensure_host_devices(max(r["num_devices"] for r in rows))
    current = Path(job).with_suffix(".current")
    for row in rows:
        current.write_text(row["name"])
        if side == "xla":
            res = measure_xla(row["file"], row["num_devices"], cache)
        else:
            res = measure_ours(row["file"], row["num_devices"])
        Path(res_dir, row["name"] + ".json").write_text(json.dumps(res))
    current.unlink(missing_ok=True)
    return 0


def _device_bucket(n: int) -> int:
    """The host device count of the XLA worker that compiles an N-partition module (one
    jax process serves every N up to its device count)."""
    for b in (16, 128):
        if n <= b:
            return b
    return n


def _run_batch(side: str, rows: list[dict], out_dir: Path, timeout: float, tag: str) -> None:
    """Measure ``rows`` on ``side`` in a worker subprocess, restarting it past a module
    that exceeds ``timeout`` seconds (recorded as timeout) or crashes it (error)."""
    res_dir = out_dir / f"{side}_results"
    res_dir.mkdir(exist_ok=True)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join([src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    job = out_dir / "jobs" / f"{side}_{tag}.json"
    job.parent.mkdir(exist_ok=True)
    current = job.with_suffix(".current")
    todo = [r for r in rows if not (res_dir / f"{r['name']}.json").exists()]
    while todo:
        job.write_text(json.dumps(todo))
        current.unlink(missing_ok=True)
        log = open(job.with_suffix(".log"), "w")
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", side,
                                 str(job), str(res_dir), str(out_dir / "xla_cache")],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        seen, since = None, time.monotonic()
        while proc.poll() is None:
            time.sleep(0.5)
            now = current.read_text() if current.exists() else None
            if now != seen:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since > timeout:  # a module, or the start-up, hangs
                proc.kill()
                proc.wait()
                break
        log.close()
        stuck = current.read_text() if current.exists() else None
        if stuck is not None and not (res_dir / f"{stuck}.json").exists():
            if proc.returncode is not None and proc.returncode < 0 and \
                    time.monotonic() - since > timeout:
                res = {"status": "timeout", "reason": f"> {timeout:.0f} s"}
            else:
                tail = [ln for ln in job.with_suffix(".log").read_text().splitlines()
                        if ln.strip()][-1:] or ["?"]
                res = {"status": "error", "reason": f"exit {proc.returncode}: {tail[0][:300]}"}
            (res_dir / f"{stuck}.json").write_text(json.dumps(res))
        left = [r for r in todo if not (res_dir / f"{r['name']}.json").exists()]
        if len(left) == len(todo):  # the worker died before its first module
            for r in left:
                (res_dir / f"{r['name']}.json").write_text(json.dumps(
                    {"status": "error", "reason": f"worker exit {proc.returncode} before its "
                                                  f"first module (start-up > {timeout:.0f} s?)"}))
            left = []
        todo = left


# -- summary -----------------------------------------------------------------------------------
def ratio(ours: float, xla: float) -> float:
    """ours / XLA bytes: 1 when both move nothing, inf when only we move bytes."""
    if xla == 0:
        return 1.0 if ours == 0 else math.inf
    return ours / xla


def summarize(results: list[dict]) -> dict:
    both = [r for r in results if r["ours"]["status"] == "ok" and r["xla"]["status"] == "ok"]
    ratios = [ratio(r["ours"]["bytes"], r["xla"]["bytes"]) for r in both]
    finite = [x for x in ratios if math.isfinite(x)]
    # A module where we move 0 bytes and XLA more has ratio 0: its log is floored (at
    # 1e-9, and at 0.01 for a mean that a few such modules cannot dominate).
    logs = [math.log(max(x, 1e-9)) for x in finite]
    logs_01 = [math.log(max(x, 0.01)) for x in finite]
    status = {}
    for r in results:
        key = f"ours {r['ours']['status']} / xla {r['xla']['status']}"
        status[key] = status.get(key, 0) + 1
    return {
        "modules": len(results), "both_ok": len(both),
        "at_or_below_xla": sum(1 for x in ratios if x <= 1.0),
        "above_xla": sum(1 for x in ratios if x > 1.0),
        "above_1.5x": sum(1 for x in ratios if x > 1.5),
        "xla_zero_ours_positive": sorted(r["name"] for r, x in zip(both, ratios)
                                         if math.isinf(x)),
        "ours_zero_xla_positive": sum(1 for x in finite if x == 0),
        "geomean_finite": math.exp(sum(logs) / len(logs)) if logs else None,
        "geomean_finite_floor_0.01": math.exp(sum(logs_01) / len(logs_01)) if logs else None,
        "status": status,
    }


def format_table(results: list[dict]) -> str:
    lines = ["| module | N | ours B/dev | XLA B/dev | ratio | largest ours / XLA | status |",
             "|---|---|---|---|---|---|---|"]

    def key(r):
        if r["ours"]["status"] == "ok" and r["xla"]["status"] == "ok":
            return (0, -ratio(r["ours"]["bytes"], r["xla"]["bytes"]))
        return (1, 0)

    for r in sorted(results, key=key):
        o, x = r["ours"], r["xla"]
        if o["status"] == "ok" and x["status"] == "ok":
            q = ratio(o["bytes"], x["bytes"])
            lines.append(f"| {r['name']} | {r['n']} | {o['bytes']:.0f} | {x['bytes']:.0f} | "
                         f"{q:.3g} | {o['largest']} / {x['largest']} | ok |")
        else:
            why = o.get("reason") if o["status"] != "ok" else x.get("reason")
            st = f"ours {o['status']}, xla {x['status']}: {why}"
            lines.append(f"| {r['name']} | {r['n']} | {o.get('bytes', '-')} | "
                         f"{x.get('bytes', '-')} | - | - | {st} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        return _worker(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cc", help="path of XLA's spmd_partitioner_test.cc")
    p.add_argument("--out", default="/work/ext/suite", help="modules, caches and results")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per module and side")
    p.add_argument("--only", default=None, help="regex on module names")
    p.add_argument("--json", default=None, help="write the results and summary here")
    p.add_argument("--ours-only", action="store_true",
                   help="skip modules whose XLA result is not cached yet")
    args = p.parse_args(argv)
    out_dir = Path(args.out)
    if not os.path.isfile(args.cc):
        print(f"external_suite: no such file: {args.cc}", file=sys.stderr)
        return 2
    rows = extract(args.cc, out_dir)
    todo = [r for r in rows if "file" in r and (not args.only or re.search(args.only, r["name"]))]
    if args.ours_only:
        todo = [r for r in todo if (out_dir / "xla_results" / f"{r['name']}.json").exists()]
    skipped = [r for r in rows if "skip" in r]

    # XLA's results do not change between runs (kept); ours are measured afresh.
    for r in todo:
        (out_dir / "ours_results" / f"{r['name']}.json").unlink(missing_ok=True)
    batches = [("ours", f"ours{k}", todo[k::max(1, args.jobs)]) for k in range(max(1, args.jobs))]
    if not args.ours_only:
        by_bucket: dict[int, list[dict]] = {}
        for r in todo:
            by_bucket.setdefault(_device_bucket(r["num_devices"]), []).append(r)
        xla = [("xla", f"xla{b}", rs) for b, rs in sorted(by_bucket.items())]
        batches = [j for pair in zip(xla, batches) for j in pair] + xla[len(batches):] \
            + batches[len(xla):]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(lambda job: _run_batch(job[0], job[2], out_dir, args.timeout, job[1]),
                      [b for b in batches if b[2]]))
    results = []
    for row in todo:
        res = {"name": row["name"], "n": row["num_devices"]}
        for side in ("ours", "xla"):
            f = out_dir / f"{side}_results" / f"{row['name']}.json"
            res[side] = json.loads(f.read_text()) if f.exists() else {
                "status": "missing", "reason": "not measured"}
        if "options" in row:
            res["options"] = row["options"]
        results.append(res)
    summary = summarize(results)
    print(format_table(results))
    print()
    print(f"skipped at extraction: {len(skipped)}")
    for r in skipped:
        print(f"  {r['name']}: {r['skip']}")
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "results": results,
                                               "skipped": skipped}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
