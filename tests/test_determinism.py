"""The same input gives a byte-identical output: every fixture partitioned in two
separate processes (different hash seeds) gives the same bytes, and the same report."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures", "hlo")

_SCRIPT = r"""
import hashlib, json, os, sys
import hlo_spmd
out = {}
for path in sys.argv[1:]:
    meta = path[: -len(os.path.splitext(path)[1])] + ".json"
    n = json.load(open(meta)).get("num_partitions") if os.path.exists(meta) else None
    r = hlo_spmd.partition(path, n)
    out[path] = [hashlib.sha256(r.serialize()).hexdigest(),
                 hashlib.sha256(r.text().encode()).hexdigest(),
                 hashlib.sha256(json.dumps(r.report).encode()).hexdigest()]
print(json.dumps(out))
"""


def _fixtures() -> list[str]:
    paths = sorted(glob.glob(os.path.join(FIX, "*.pb")))
    paths += sorted(p for p in glob.glob(os.path.join(FIX, "handwritten", "*.hlo")))
    return paths


def _run(seed: str) -> dict:
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = seed
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    p = subprocess.run([sys.executable, "-c", _SCRIPT, *_fixtures()], capture_output=True,
                       text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def test_partition_is_byte_identical_across_processes():
    a, b = _run("1"), _run("2")
    assert set(a) == set(_fixtures()) and len(a) >= 23
    differ = [os.path.relpath(k, FIX) for k in a if a[k] != b[k]]
    assert not differ, f"outputs differ between processes: {differ}"
