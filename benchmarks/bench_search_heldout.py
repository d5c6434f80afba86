"""The sharding search on held-out models: fixtures annotated by their authors (JAX
exports from ``fixtures/generate.py``, a PyTorch/XLA-style handwritten step), stripped
of every annotation, searched on their own mesh with the peak of their own program as
the memory budget. Prints, per model: the author's bytes per device / peak, the
search's, the time and the chosen specs. Figures only, never asserted (the fast ones
are tests in tests/test_search.py).

    python benchmarks/bench_search_heldout.py [--only mlp_2d_megatron,...]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

MODELS = ["mlp_2d_megatron", "layernorm_batch_norm_train_step", "moe_einsum",
          "llm_embed_tied_2d", "cnn_train_step", "transformer_layer_fwd",
          "transformer_train_step", "gpt_train_step_tied"]


def fixture(name: str) -> tuple[Path, dict]:
    for d in (ROOT / "fixtures" / "hlo", ROOT / "fixtures" / "hlo" / "handwritten"):
        meta = d / f"{name}.json"
        if meta.exists():
            src = d / f"{name}.pb"
            return (src if src.exists() else d / f"{name}.hlo"), json.loads(meta.read_text())
    raise SystemExit(f"no fixture {name}")


def run(name: str) -> dict:
    import hlo_spmd
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.ir.io import module_bytes
    from hlo_spmd.search.heldout import strip_annotations
    from hlo_spmd.search.pricing import price_of

    path, meta = fixture(name)
    mesh = ",".join(f"{a}={n}" for a, n in meta["mesh"]["axes"].items())
    expert = price_of(hlo_spmd.partition(str(path)))
    plain = hlo_spmd.load(module_bytes(strip_annotations(hlo_spmd.load(str(path)))))
    t0 = time.monotonic()
    row = {"model": name, "mesh": mesh, "expert_bytes": expert.bytes,
           "expert_peak": expert.peak}
    try:
        got = hlo_spmd.search(plain, mesh=mesh, memory_limit=expert.peak)
    except HloSpmdError as e:
        row.update(error=str(e), seconds=round(time.monotonic() - t0, 1))
        return row
    win = got.report["winner"]
    row.update(search_bytes=win["bytes_per_device"], search_peak=win["peak_bytes"],
               seconds=round(time.monotonic() - t0, 1),
               specs=[p["spec"] for p in got.report["parameters"]])
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(MODELS))
    args = ap.parse_args(argv)
    for name in args.only.split(","):
        print(json.dumps(run(name)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
