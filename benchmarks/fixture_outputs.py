"""Partition every fixture and write the outputs; compare two such directories byte by byte.

An optimization must not change any result: run ``write`` before the change (reference)
and after it, then ``compare``. Nothing is pinned in the tests (other issues' handler
work changes outputs on purpose); this is a tool for one change at a time.

    python benchmarks/fixture_outputs.py write /tmp/ref
    python benchmarks/fixture_outputs.py write /tmp/new
    python benchmarks/fixture_outputs.py compare /tmp/ref /tmp/new

``write`` partitions ``fixtures/hlo/*.pb`` and ``fixtures/hlo/handwritten/*.hlo`` for
every partition count of their sidecar, plus the scale fixture re-expressed on 32x64
(2048 devices) and the generated training step (``--train-step L``, if present), and
writes each partitioned module as HLO text (``.hlo``) and proto (``.pb``), plus the
completed (propagated) module's text (``.completed.hlo``). A failure is written as
``.error`` with its one-line message, so failures are compared too.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
try:
    import hlo_spmd  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "src"))


def cases() -> list[tuple[str, str, int, tuple[int, int] | None]]:
    """(case name, path, partitions, mesh to re-express the 2x4 mesh on, or None)."""
    out = []
    fx = ROOT / "fixtures" / "hlo"
    paths = sorted(glob.glob(str(fx / "*.pb"))) + sorted(glob.glob(str(fx / "handwritten" / "*.hlo")))
    for path in paths:
        meta = json.loads(Path(path[: path.rindex(".")] + ".json").read_text())
        stem = Path(path).stem
        for n in meta.get("partition_counts") or [meta["num_partitions"]]:
            out.append((f"{stem}-{n}", path, n, None))
    scale = fx / "transformer_train_step_scale.pb"
    if scale.exists():
        out.append(("transformer_train_step_scale-2048", str(scale), 2048, (32, 64)))
    return out


def write(out_dir: Path, train_step: list[int]) -> int:
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.ir.io import load_module, save_module
    from hlo_spmd.ir.text_printer import print_module
    from hlo_spmd.passes.partition import partition_in_place
    import gen_train_step

    todo = cases()
    for L in train_step:
        p = gen_train_step.path_for(L)
        if p.exists():
            todo.append((f"train_step_L{L}-8", str(p), 8, None))
            todo.append((f"train_step_L{L}-2048", str(p), 2048, (32, 64)))
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, path, n, mesh in todo:
        base = out_dir / name
        try:
            module = load_module(path)
            if mesh is not None:
                gen_train_step.rescale_mesh(module, *mesh)
            result = partition_in_place(module, n)
            (out_dir / f"{name}.completed.hlo").write_text(print_module(module))
            save_module(result.module, str(base) + ".hlo")
            save_module(result.module, str(base) + ".pb")
        except HloSpmdError as e:
            (out_dir / f"{name}.error").write_text(str(e) + "\n")
        print(name, flush=True)
    print(f"{len(todo)} cases written to {out_dir}")
    return 0


def compare(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    bad = []
    for nm in names:
        pa, pb = a / nm, b / nm
        if not pa.exists() or not pb.exists():
            bad.append(f"{nm}: only in {a if pa.exists() else b}")
        elif pa.read_bytes() != pb.read_bytes():
            bad.append(f"{nm}: differs")
    for line in bad:
        print(line)
    print(f"{len(names) - len(bad)}/{len(names)} files byte-identical")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir")
    w.add_argument("--train-step", default="7", help="comma list of generated layer counts")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args(argv)
    if args.cmd == "write":
        return write(Path(args.dir), [int(x) for x in args.train_step.split(",") if x])
    return compare(Path(args.a), Path(args.b))


if __name__ == "__main__":
    sys.exit(main())
