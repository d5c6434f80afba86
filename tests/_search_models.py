"""Small JAX programs lowered without any sharding, for the sharding search tests, each with
an expert annotation written by hand (Megatron, FSDP, expert parallel, spatial) on a 2x4
``data`` x ``model`` mesh. The search gets the expert program's peak as its budget and must
move no more bytes than the expert's program.

``build(name)`` -> ``Case(hlo, inputs, expert)``: serialized HloModuleProto (no sharding),
inputs (numpy, so the differential test runs the same values on 1 and on 8 devices) and the
expert's ``--shard`` dict. Learning rates are large enough that every updated weight moves
by far more than the comparison tolerance.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from hlo_spmd.runtime.devices import ensure_host_devices

ensure_host_devices(8)

MESH = "data=2,model=4"


class Case(NamedTuple):
    hlo: bytes
    inputs: list
    expert: dict


def _lower(fn: Callable, args: list) -> bytes:
    import jax

    return jax.jit(fn).lower(*args).compiler_ir("hlo").as_serialized_hlo_module_proto()


def _rng():
    return np.random.default_rng(0)


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def mlp() -> Case:
    import jax.numpy as jnp

    def f(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2

    r = _rng()
    args = [_f32(r, 32, 64), _f32(r, 64, 128, scale=0.1), _f32(r, 128, 64, scale=0.1)]
    expert = {"#0": "data,_", "#1": "_,model", "#2": "model,_"}  # Megatron
    return Case(_lower(f, args), args, expert)


def transformer_step() -> Case:
    """One pre-LN-free attention + MLP block, summed squared loss, SGD with momentum."""
    import jax
    import jax.numpy as jnp

    lr, mu = 0.5, 0.9

    def loss(p, x, y):
        wq, wk, wv, wo, w1, w2 = p
        q = jnp.einsum("bsd,dhk->bshk", x, wq)
        k = jnp.einsum("bsd,dhk->bshk", x, wk)
        v = jnp.einsum("bsd,dhk->bshk", x, wv)
        a = jax.nn.softmax(jnp.einsum("bshk,bthk->bhst", q, k) * 0.25, axis=-1)
        o = jnp.einsum("bhst,bthk->bshk", a, v)
        h = x + jnp.einsum("bshk,hkd->bsd", o, wo)
        z = h + jnp.tanh(h @ w1) @ w2
        return jnp.sum((z - y) ** 2)

    def step(p, m, x, y):
        val, g = jax.value_and_grad(loss)(p, x, y)
        m = tuple(mu * mi + gi for mi, gi in zip(m, g))
        p = tuple(pi - lr * 1e-3 * mi for pi, mi in zip(p, m))
        return val, p, m

    B, S, D, H, K, F = 8, 16, 32, 4, 8, 64
    r = _rng()
    p = (_f32(r, D, H, K, scale=0.2), _f32(r, D, H, K, scale=0.2), _f32(r, D, H, K, scale=0.2),
         _f32(r, H, K, D, scale=0.2), _f32(r, D, F, scale=0.2), _f32(r, F, D, scale=0.2))
    m = tuple(_f32(r, *w.shape, scale=0.1) for w in p)
    x, y = _f32(r, B, S, D), _f32(r, B, S, D)

    def flat(wq, wk, wv, wo, w1, w2, mq, mk, mv, mo, m1, m2, x, y):
        return step((wq, wk, wv, wo, w1, w2), (mq, mk, mv, mo, m1, m2), x, y)

    args = [*p, *m, x, y]
    # Megatron: heads / MLP hidden on "model", batch on "data"; momenta like their weights.
    w = ["_,model,_", "_,model,_", "_,model,_", "model,_,_", "_,model", "model,_"]
    expert = {f"#{i}": s for i, s in enumerate(w + w)}
    expert.update({"#12": "data,_,_", "#13": "data,_,_"})
    return Case(_lower(flat, args), args, expert)


def moe() -> Case:
    """Top-1 mixture of experts with dense dispatch (one-hot), forward only."""
    import jax
    import jax.numpy as jnp

    def f(x, wr, win, wout):
        logits = x @ wr
        gate = jax.nn.softmax(logits, axis=-1)
        onehot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), wr.shape[1], dtype=x.dtype)
        xe = jnp.einsum("te,td->etd", onehot, x)
        h = jax.nn.relu(jnp.einsum("etd,edf->etf", xe, win))
        ye = jnp.einsum("etf,efd->etd", h, wout)
        return jnp.einsum("etd,te->td", ye, onehot * gate)

    T, D, E, F = 64, 32, 4, 64
    r = _rng()
    args = [_f32(r, T, D), _f32(r, D, E), _f32(r, E, D, F, scale=0.2),
            _f32(r, E, F, D, scale=0.2)]
    # Expert parallel: experts on "model", tokens on "data".
    expert = {"#0": "data,_", "#1": "_,_", "#2": "model,_,_", "#3": "model,_,_"}
    return Case(_lower(f, args), args, expert)


def embed_xent_step() -> Case:
    """Embedding lookup + projection to the vocabulary + cross entropy, one SGD step."""
    import jax
    import jax.numpy as jnp

    lr = 0.5

    def loss(emb, wout, tokens, labels):
        h = jnp.take(emb, tokens, axis=0)  # [B, S, D]
        logits = h @ wout  # [B, S, V]
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.sum(jnp.take_along_axis(logp, labels[..., None], axis=-1))

    def step(emb, wout, tokens, labels):
        val, (ge, gw) = jax.value_and_grad(loss, argnums=(0, 1))(emb, wout, tokens, labels)
        return val, emb - lr * ge, wout - lr * gw

    B, S, V, D = 8, 16, 256, 32
    r = _rng()
    args = [_f32(r, V, D, scale=0.3), _f32(r, D, V, scale=0.3),
            r.integers(0, V, (B, S)).astype(np.int32), r.integers(0, V, (B, S)).astype(np.int32)]
    # FSDP / ZeRO-3: weights sharded on their largest dim over every device, batch on data.
    expert = {"#0": "data+model,_", "#1": "_,data+model", "#2": "data,_", "#3": "data,_"}
    return Case(_lower(step, args), args, expert)


def cnn_step() -> Case:
    """Two 3x3 convolutions, global mean pool, dense head, squared loss, one SGD step."""
    import jax
    import jax.numpy as jnp

    lr = 0.05

    def conv(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def loss(p, x, y):
        k1, k2, wd = p
        h = jax.nn.relu(conv(x, k1))
        h = jax.nn.relu(conv(h, k2))
        z = jnp.mean(h, axis=(1, 2)) @ wd
        return jnp.sum((z - y) ** 2)

    def step(k1, k2, wd, x, y):
        val, g = jax.value_and_grad(loss)((k1, k2, wd), x, y)
        return (val, *(p - lr * gp for p, gp in zip((k1, k2, wd), g)))

    N, H, W, C, K, O = 4, 32, 32, 4, 8, 10
    r = _rng()
    args = [_f32(r, 3, 3, C, K, scale=0.3), _f32(r, 3, 3, K, K, scale=0.3),
            _f32(r, K, O, scale=0.3), _f32(r, N, H, W, C), _f32(r, N, O)]
    # Spatial: batch on "data", image rows on "model"; kernels replicated.
    expert = {"#0": "_,_,_,_", "#1": "_,_,_,_", "#2": "_,_", "#3": "data,model,_,_",
              "#4": "data,_"}
    return Case(_lower(step, args), args, expert)


MODELS = {"mlp": mlp, "transformer_step": transformer_step, "moe": moe,
          "embed_xent_step": embed_xent_step, "cnn_step": cnn_step}


def build(name: str) -> Case:
    return MODELS[name]()
