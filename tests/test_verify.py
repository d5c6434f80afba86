"""``verify``: the verdict on right and wrong partitioned programs.

Right programs (64-bit parameters, text outputs, reassociated sums) must say OK; broken
controls, built by mutating a right partitioned program (an all-reduce that takes the
maximum, a dropped collective, a shifted collective-permute), must say NOT OK.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hlo"

GATHER_S64 = """HloModule g64

ENTRY main {
  t = f32[64,16] parameter(0), sharding={devices=[4,1]<=[4]}
  ids = s64[16,4] parameter(1), sharding={devices=[4,1]<=[4]}
  b = s64[16,4,1] reshape(ids)
  ROOT g = f32[16,4,16] gather(t, b), offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,16}, sharding={devices=[4,1,1]<=[4]}
}
"""

DOT_F64 = """HloModule f64

ENTRY main {
  x = f64[16,32] parameter(0), sharding={devices=[1,4]<=[4]}
  w = f64[32,8] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT d = f64[16,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
}
"""


def partitioned(text: str, n: int) -> tuple[bytes, bytes]:
    module = parse_module(text)
    original = module_bytes(module)
    return original, module_bytes(partition_in_place(module, n).module)


def test_s64_indices_run_as_they_are():
    original, part = partitioned(GATHER_S64, 4)
    rng = np.random.default_rng(0)
    table = rng.normal(size=(64, 16)).astype(np.float32)
    ids = rng.integers(0, 64, size=(16, 4)).astype(np.int64)
    ids[0, 0] = 2 ** 33 + 5  # does not fit 32 bits: out of range, clamped by gather
    report = verify(original, part, 4, inputs=[table, ids])
    assert report.ok, str(report)
    assert report.outputs[0].size == 16 * 4 * 16


def test_f64_program_keeps_its_precision():
    original, part = partitioned(DOT_F64, 4)
    report = verify(original, part, 4)
    assert report.ok, str(report)
    assert report.outputs[0].expected_dtype == "float64"
    # f64 arithmetic: a reassociated 32-term sum differs by ~1e-15, not f32's ~1e-7
    assert report.outputs[0].max_abs_error < 1e-12


# -- item 8: a partitioned module written as HLO text -----------------------------------------
def test_text_output_takes_its_interface_from_the_original(tmp_path):
    from click.testing import CliRunner

    from hlo_spmd.ir.io import load_module, module_text
    from hlo_spmd_cli.main import _register, cli

    _register()
    src = FIXTURES / "mlp_2d_megatron.pb"
    out = tmp_path / "p.hlo"
    r = CliRunner().invoke(cli, ["partition", str(src), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "spmd_parameters_shardings" not in out.read_text()  # text cannot carry it
    r = CliRunner().invoke(cli, ["verify", str(src), str(out)])
    assert r.exit_code == 0 and r.output.splitlines()[-1].startswith("OK (worst: "), r.output
    # the library too, given the text as a string (parsed by XLA's own parser)
    original = src.read_bytes()
    report = verify(original, module_text(load_module(out)), 8)
    assert report.ok, str(report)


# -- item 6: the verdict on reassociated sums and on broken programs ---------------------------
MAX_F32 = """
%max.f32 (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %m = f32[] maximum(%x, %y)
}

ENTRY"""


def partition_text(name: str, n: int = 8) -> tuple[bytes, str]:
    from hlo_spmd.ir.io import load_module, module_text

    src = FIXTURES / f"{name}.pb"
    return src.read_bytes(), module_text(partition_in_place(load_module(src), n).module)


def mutate(text: str, pattern: str, repl) -> str:
    import re

    new, count = re.subn(pattern, repl, text, count=1)
    assert count == 1 and new != text, pattern
    return new


def run_text(original: bytes, text: str, n: int = 8):
    return verify(original, module_bytes(parse_module(text)), n)


def test_partial_sum_all_reduce_is_ok_within_tolerance():
    original, text = partition_text("mlp_2d_megatron")
    assert "all-reduce(" in text
    report = run_text(original, text)
    assert report.ok, str(report)
    worst = report.worst
    assert 0 < worst.worst < 1  # reassociated: not bit-identical, well inside the bound
    assert f"OK (worst: {worst.worst:.2g} of tolerance at out0[" in str(report)


def test_all_reduce_taking_the_maximum_is_not_ok():
    original, text = partition_text("mlp_2d_megatron")
    text = text.replace("\nENTRY", MAX_F32, 1)
    text = mutate(text, r"(all-reduce\([^\n]*?to_apply=)%add\.f32", r"\1%max.f32")
    report = run_text(original, text)
    assert not report.ok
    assert report.worst.worst > 100, str(report)  # far outside, not a borderline call
    assert str(report).splitlines()[-1].startswith("NOT OK (worst: ")


def test_dropped_all_reduce_is_not_ok():
    original, text = partition_text("mlp_2d_megatron")
    text = mutate(text, r"all-reduce\((%[\w.\-]+)\)[^\n]*?to_apply=%[\w.]+", r"copy(\1)")
    assert "all-reduce(" not in text
    report = run_text(original, text)
    assert not report.ok and report.worst.worst > 100, str(report)


def test_shifted_halo_is_not_ok():
    import re

    original, text = partition_text("conv_spatial")
    assert run_text(original, text).ok

    def shift(match):  # every halo comes from one device further away
        pairs = re.findall(r"\{(\d+),(\d+)\}", match.group(1))
        return "source_target_pairs={" + ",".join(
            f"{{{s},{(int(t) + 1) % 8}}}" for s, t in pairs) + "}"

    text = mutate(text, r"source_target_pairs=\{((?:\{\d+,\d+\},?)+)\}", shift)
    report = run_text(original, text)
    assert not report.ok and report.worst.worst > 100, str(report)


# -- the rule itself, on simulated reassociations ----------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hlo_spmd.runtime.compare import compare, machine_eps  # noqa: E402


def _dtype(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name) if name == "bfloat16" else name)


def _blocked_sum(a: np.ndarray, b: np.ndarray, blocks: int, dtype: np.dtype,
                 order: list[int]) -> np.ndarray:
    """A partitioned dot as a device computes it: each block's partial sum accumulated
    wide and rounded to ``dtype`` (XLA-CPU's dot), then the partials added in ``dtype``
    one at a time in ``order`` (the all-reduce)."""
    k = a.shape[1]
    parts = [(a[:, i * k // blocks:(i + 1) * k // blocks].astype(np.float64)
              @ b[i * k // blocks:(i + 1) * k // blocks].astype(np.float64)).astype(dtype)
             for i in range(blocks)]
    total = parts[order[0]]
    for i in order[1:]:
        total = (total.astype(np.float64) + parts[i].astype(np.float64)).astype(dtype)
    return total


@settings(max_examples=60)
@given(dtype=st.sampled_from(["float64", "float32", "float16", "bfloat16"]),
       k_log=st.integers(1, 12), blocks_log=st.integers(1, 3), seed=st.integers(0, 2 ** 16),
       mean=st.sampled_from([0.0, 1.0]), data=st.data())
def test_rule_accepts_reassociated_sums(dtype, k_log, blocks_log, seed, mean, data):
    dt = _dtype(dtype)
    k, blocks = 2 ** k_log, min(2 ** blocks_log, 2 ** k_log)
    rng = np.random.default_rng(seed)
    a = rng.normal(mean, 1, size=(8, k)).astype(dt)
    b = rng.normal(mean, 1, size=(k, 8)).astype(dt)
    reference = _blocked_sum(a, b, 1, dt, [0])  # one device: one wide sum, one rounding
    order = data.draw(st.permutations(list(range(blocks))))
    depth = _depth(dt, k, blocks)
    report = compare([reference], [_blocked_sum(a, b, blocks, dt, order)], depth=depth)
    assert report.ok, str(report)
    # the bound is the rule of the module docstring, nothing looser
    tol = report.outputs[0].tolerance
    assert tol.rtol == 8 * machine_eps(dt) and tol.norm == 16 * machine_eps(dt) * np.sqrt(depth)


def _depth(dt: np.dtype, k: int, blocks: int) -> int:
    """The depth program_precision gives such a dot: below 32 bits XLA-CPU sums in f32, so
    only the partial sums added in ``dt`` count."""
    return k if machine_eps(dt) <= np.finfo(np.float32).eps else blocks


@settings(max_examples=60)
@given(dtype=st.sampled_from(["float64", "float32", "float16", "bfloat16"]),
       k_log=st.integers(1, 12), blocks_log=st.integers(1, 3), seed=st.integers(0, 2 ** 16),
       wrong=st.sampled_from(["drop", "max"]))
def test_rule_rejects_wrong_combinations(dtype, k_log, blocks_log, seed, wrong):
    dt = _dtype(dtype)
    k, blocks = 2 ** k_log, min(2 ** blocks_log, 2 ** k_log)
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(8, k)).astype(dt)
    b = rng.normal(size=(k, 8)).astype(dt)
    reference = _blocked_sum(a, b, 1, dt, [0])
    kb = k // blocks
    parts = [(a[:, i * kb:(i + 1) * kb].astype(np.float64)
              @ b[i * kb:(i + 1) * kb].astype(np.float64)) for i in range(blocks)]
    if wrong == "drop":  # one partial sum missing (a collective left out)
        actual = np.sum(parts[1:], axis=0) if blocks > 1 else np.zeros_like(parts[0])
    else:  # the all-reduce took the maximum
        actual = np.max(parts, axis=0) if blocks > 1 else -parts[0]
    report = compare([reference], [actual.astype(dt)], depth=_depth(dt, k, blocks))
    assert not report.ok, str(report)


def test_integers_and_pred_compare_exactly():
    ids = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert compare([ids], [ids.copy()]).ok
    off = ids.copy()
    off[2, 1] += 1
    report = compare([ids], [off], depth=4096)
    assert not report.ok and report.worst.worst == np.inf and report.worst.worst_at == (2, 1)
    mask = np.array([True, False])
    assert not compare([mask], [~mask]).ok


def test_cancelled_element_is_judged_by_the_output_scale():
    # a reassociated sum that cancels to ~0: relative error is huge, absolute tiny
    ref = np.array([100.0, -100.0, 3e-6], np.float32)
    out = ref + np.array([0, 0, 4e-6], np.float32)
    assert compare([ref], [out], depth=256).ok
    assert not compare([ref], [ref + np.array([0, 0, 1.0], np.float32)], depth=256).ok


# -- issue 24 item 4: verify --processes K --------------------------------------------------
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute",
               "reduce-scatter")


def _fixtures_with_collectives():
    import json

    for path in sorted(FIXTURES.glob("*.pb")):
        meta = json.loads(path.with_suffix(".json").read_text())
        if meta.get("partition_only"):
            continue
        n = (meta.get("partition_counts") or [meta["num_partitions"]])[0]
        yield path, n, meta


#: One fixture per collective kind and a 4-device training step: the default run.
QUICK = {"mlp_2d_megatron", "conv_spatial", "moe_gather_scatter", "cnn_train_step_4"}


def test_two_processes_verify_fixtures_with_collectives():
    check_two_processes(lambda name: name in QUICK, 4)


@pytest.mark.slow
def test_two_processes_verify_every_fixture_with_collectives():
    check_two_processes(lambda name: True, 30)


def check_two_processes(chosen, at_least: int) -> None:
    """Fixtures whose partitioned program has collectives run as 2 processes x N/2 devices
    joined through jax.distributed, and match; one group serves all of one device count."""
    from hlo_spmd.ir.io import load_module
    from hlo_spmd.runtime.distributed import ProcessGroup
    from hlo_spmd.runtime.inputs import sidecar_inputs

    cases = []
    for path, n, meta in _fixtures_with_collectives():
        if not chosen(path.stem):
            continue
        out = partition_in_place(load_module(path), n).module
        kinds = {i.opcode for i in out.instructions() if i.opcode in COLLECTIVES}
        if kinds:
            ref = meta.get("reference")
            original = (FIXTURES / f"{ref}.pb" if ref else path).read_bytes()
            cases.append((path.stem, n, original, module_bytes(out), meta, kinds))
    assert len(cases) >= at_least and set().union(*(c[5] for c in cases)) == set(COLLECTIVES)
    failures = []
    for devices in sorted({c[1] for c in cases}):
        with ProcessGroup(devices, 2) as group:
            for name, n, original, part, meta, _ in (c for c in cases if c[1] == devices):
                report = verify(original, part, n, inputs=sidecar_inputs(meta),
                                poison_padding=True, processes=group)
                if not report.ok:
                    failures.append(f"{name}:\n{report}")
                assert "2 processes x" in report.reference
    assert not failures, "\n".join(failures)


def test_two_processes_catch_a_broken_program(tmp_path):
    from click.testing import CliRunner

    from hlo_spmd_cli.main import _register, cli

    original, text = partition_text("mlp_2d_megatron")
    text = text.replace("\nENTRY", MAX_F32, 1)
    text = mutate(text, r"(all-reduce\([^\n]*?to_apply=)%add\.f32", r"\1%max.f32")
    broken = tmp_path / "broken.hlo"
    broken.write_text(text)
    src = FIXTURES / "mlp_2d_megatron.pb"
    _register()
    r = CliRunner().invoke(cli, ["verify", str(src), str(broken), "--processes", "2"])
    assert r.exit_code == 1, r.output
    assert "2 processes x 4 devices" in r.output and "\nNOT OK (worst: " in r.output
    r = CliRunner().invoke(cli, ["verify", str(src), str(broken), "--processes", "3"])
    assert r.exit_code == 2 and "do not divide the 8 devices" in r.output


def test_process_group_timeout_kills_its_children():
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.runtime.distributed import ProcessGroup

    original, part = partitioned(DOT_F64, 4)
    group = ProcessGroup(4, 2, timeout=0.01)  # cannot even start jax in that time
    with group:
        children = list(group._children)
        assert len(children) == 2
        with pytest.raises(HloSpmdError, match="did not finish within"):
            verify(original, part, 4, processes=group)
        assert all(c.poll() is not None for c in children)  # killed, not left running
    with pytest.raises(HloSpmdError, match="closed"):
        group.execute(part, [])


# -- item 9: shapes too large for XLA are bad input, named ------------------------------------
@pytest.mark.parametrize("dims,message", [
    ("9223372036854775807,2", "instruction x: shape f32[9223372036854775807,2]{1,0} is too "
                              "large"),
    ("4294967296,4294967296", "is too large"),                # a product past int64
    ("9223372036854775808", "does not fit in 64 bits"),       # not even an int64
])
@pytest.mark.parametrize("command", ["partition", "verify", "stats"])
def test_huge_dims_are_one_line_errors(tmp_path, dims, message, command):
    from click.testing import CliRunner

    from hlo_spmd_cli.main import _register, cli

    _register()
    src = tmp_path / "huge.hlo"
    src.write_text(f"""HloModule m

ENTRY main {{
  x = f32[{dims}] parameter(0), sharding={{replicated}}
  ROOT n = f32[{dims}] negate(x), sharding={{replicated}}
}}
""")
    out = tmp_path / "out.pb"
    args = {"partition": ["partition", str(src), "-o", str(out)],
            "verify": ["verify", str(src), str(src), "-n", "2"],
            "stats": ["stats", str(src)]}[command]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hlo-spmd: error: ") and message in lines[0]
    assert not out.exists()


def test_module_too_large_for_memory_is_refused_by_name():
    from hlo_spmd.errors import HloSpmdError

    text = """HloModule m

ENTRY main {
  x = f32[1099511627776,2] parameter(0)
  ROOT n = f32[1099511627776,2] negate(x)
}
"""
    with pytest.raises(HloSpmdError, match="too large to run"):
        verify(text, text, 1)


def test_rule_widened_by_the_error_of_xlas_own_partitioning(monkeypatch):
    """With the rule made exact, a right program is still OK when XLA's own partitioning
    of the module rounds as much on the same inputs; a broken one stays NOT OK."""
    cmp = sys.modules["hlo_spmd.runtime.compare"]  # (the package exports a function of that name)

    original, text = partition_text("mlp_2d_megatron")
    monkeypatch.setattr(cmp, "C_REL", 0.0)
    monkeypatch.setattr(cmp, "C_NORM", 1e-9)
    report = run_text(original, text)
    assert report.ok, str(report)
    tol = report.outputs[0].tolerance
    assert tol.xla_error > 0 and "x XLA's own error" in str(report)
    broken = mutate(text.replace("\nENTRY", MAX_F32, 1),
                    r"(all-reduce\([^\n]*?to_apply=)%add\.f32", r"\1%max.f32")
    report = run_text(original, broken)
    assert not report.ok and report.worst.worst > 100, str(report)


BF16_SUMS = """HloModule b

add {
  a = bf16[] parameter(0)
  b = bf16[] parameter(1)
  ROOT c = bf16[] add(a, b)
}

ENTRY main {
  x = bf16[32,256] parameter(0), sharding={devices=[1,4]<=[4]}
  w = bf16[256,32] parameter(1), sharding={devices=[4,1]<=[4]}
  d = bf16[32,32] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  z = bf16[] constant(0)
  r = bf16[32] reduce(x, z), dimensions={1}, to_apply=add, sharding={replicated}
  ROOT t = (bf16[32,32], bf16[32]) tuple(d, r), sharding={{replicated}, {replicated}}
}
"""


def test_bf16_partial_sums_ok_and_max_not_ok():
    """bf16: XLA-CPU's dot sums in f32 (K counts for little), its reduce in bf16 (K counts
    fully); the partial sums of 4 devices are added in bf16. Right: OK; a maximum: NOT OK."""
    from hlo_spmd.ir.io import module_text
    from hlo_spmd.runtime.precision import program_precision

    module = parse_module(BF16_SUMS)
    precision = program_precision(module, 4)
    assert precision.output_depths == (4, 256)  # the dot: 4 bf16 partials; the bf16 reduce
    original, part = partitioned(BF16_SUMS, 4)
    for seed in (0, 1, 2):
        report = verify(original, part, 4, seed=seed)
        assert report.ok, str(report)
    text = module_text(parse_module_proto_text(part))
    text = text.replace("\nENTRY", MAX_F32.replace("f32", "bf16"), 1)
    broken = mutate(text, r"(all-reduce\([^\n]*?to_apply=)%[\w.]+", r"\1%max.bf16")
    report = run_text(original, broken, 4)
    assert not report.ok and report.outputs[0].worst > 4, str(report)


def parse_module_proto_text(data: bytes):
    from hlo_spmd.ir.io import load_module_bytes

    return load_module_bytes(data, "partitioned")
