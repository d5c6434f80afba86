"""Generate the L-layer transformer training step used by ``bench_vs_xla.py``.

The module is ``fixtures/generate.py``'s transformer training step (pre-LN layer,
forward + backward through ``jax.value_and_grad``, Adam-like update with weight-update
sharding on a 2x4 data x model mesh) with ``L`` layers unrolled instead of one, lowered
by jax 0.10 exactly as the fixtures are. Dims are the fixture's ``TL_SCALE`` (every
sharded dim divides a 32x64 mesh), so the same program can be re-expressed on larger
meshes by :func:`rescale_mesh` for the device-count curve.

    python benchmarks/gen_train_step.py --layers 24,96

writes ``benchmarks/generated/train_step_L<L>.pb`` (+ ``.json`` with the counts).
Needs jax; the benchmark itself only reads the files.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GENERATED = HERE / "generated"

# Mesh shapes for the device-count curve: data x model.
MESHES = {8: (2, 4), 32: (4, 8), 128: (8, 16), 512: (16, 32), 2048: (32, 64)}


def path_for(layers: int) -> Path:
    return GENERATED / f"train_step_L{layers}.pb"


def generate(layers: int, out_dir: Path = GENERATED, small: bool = False) -> Path:
    """Lower the ``layers``-layer training step on 2x4 and write its HloModuleProto.
    ``small``: the fixture's small dims (``TL``: runnable on CPU devices in a test)."""
    sys.path.insert(0, str(ROOT / "fixtures"))
    import generate as fx  # noqa: E402  (sets the 8 host devices before importing jax)

    jax, jnp, P = fx.jax, fx.jnp, fx.P
    jax.config.update("jax_use_shardy_partitioner", False)  # classic sharding= (GSPMD)
    tl = fx.TL if small else fx.TL_SCALE
    mesh = fx.make_mesh((2, 4), ("data", "model"))
    B, S, D = tl["B"], tl["S"], tl["D"]
    lr, b1, b2, eps = 1e-2, 0.9, 0.99, 1e-6
    one = fx.transformer_params(weight_spec_data=True, tl=tl)
    specs = [{k: a.spec for k, a in one.items()} for _ in range(layers)]
    params = [dict(one) for _ in range(layers)]

    def loss_fn(ps, x, y):
        for p in ps:
            x = fx.transformer_layer(mesh, p, x, gather_weights=True)
        return jnp.mean(jnp.square(x - y))

    def step(ps, ms, vs, x, y):
        loss, gs = jax.value_and_grad(loss_fn)(ps, x, y)
        new_p, new_m, new_v = [], [], []
        for p, m, v, g, sp in zip(ps, ms, vs, gs, specs):
            np_, nm, nv = {}, {}, {}
            for k in p:
                gk = fx.wsc(g[k], mesh, *sp[k])
                nm[k] = b1 * m[k] + (1 - b1) * gk
                nv[k] = b2 * v[k] + (1 - b2) * gk * gk
                np_[k] = p[k] - lr * nm[k] / (jnp.sqrt(nv[k]) + eps)
            new_p.append(np_)
            new_m.append(nm)
            new_v.append(nv)
        return new_p, new_m, new_v, loss

    tree = jax.tree_util
    args = (params, params, params, fx.Arg((B, S, D), P("data", None, None)),
            fx.Arg((B, S, D), P("data", None, None)))
    leaves, treedef = tree.tree_flatten(args, is_leaf=lambda a: isinstance(a, fx.Arg))
    in_sh = tree.tree_unflatten(treedef, [fx.NamedSharding(mesh, a.spec) for a in leaves])
    structs = tree.tree_unflatten(treedef, [jax.ShapeDtypeStruct(a.shape, a.dtype)
                                            for a in leaves])
    out_specs = (specs, specs, specs, P())
    out_sh = tree.tree_map(lambda s: fx.NamedSharding(mesh, s), out_specs, is_leaf=fx.is_spec)
    lowered = jax.jit(step, in_shardings=in_sh, out_shardings=out_sh).lower(*structs)
    pb = fx.normalize_module_proto(lowered.compiler_ir("hlo").as_serialized_hlo_module_proto())
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"train_step_L{layers}.pb"
    path.write_bytes(pb)
    sys.path.insert(0, str(ROOT / "src"))
    from hlo_spmd.ir.io import load_module

    module = load_module(str(path))
    meta = {"layers": layers, "instructions": module.instruction_count(),
            "num_partitions": 8, "dims": tl, "generator": fx.GENERATOR}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    return path


def rescale_mesh(module, a: int, b: int) -> None:
    """Re-express the 2x4 (data x model) shardings of ``module`` on an ``a`` x ``b`` mesh.

    Every tile assignment of the generated step is an iota over the 2x4 mesh, so its
    dims / reshape dims of 2, 4 and 8 are the data axis, the model axis and both; the
    iota's transpose structure is kept."""
    from hlo_spmd.runtime.rescale import rescale_mesh as rescale

    rescale(module, {2: a, 4: b, 8: a * b})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="24,96")
    args = ap.parse_args(argv)
    for L in (int(x) for x in args.layers.split(",")):
        p = generate(L)
        print(p, json.loads(p.with_suffix(".json").read_text())["instructions"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
