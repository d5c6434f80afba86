"""Skipped inferences (``passes/propagation/unchanged.py``) change nothing.

Completion skips an inference whose inputs are those of its last no-change run.  In
check mode (``HLO_SPMD_CHECK_SKIPS=1``) every skipped inference runs anyway and must
change no sharding and record no new alternative: here on every fixture (with and
without propagation to parameters / output) and on random graphs annotated only at
their parameters.  A rule that reads something the memo does not know about is caught.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.ir.io import load_module
from hlo_spmd.passes.inline_calls import inline_calls
from hlo_spmd.passes.propagation import engine, propagate
from hlo_spmd.passes.propagation import forward as fw

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hlo"
ALL_FIXTURES = sorted(FIXTURES.glob("*.pb")) + sorted((FIXTURES / "handwritten").glob("*.hlo"))


def _skipped(module, **kw) -> tuple[int, int]:
    """Propagate ``module``; how many inferences the memo skipped as unchanged, and as
    having nothing sharded to read."""
    counts = []
    original = engine.Propagator.finish

    def finish(self):
        counts.append((self.unchanged.skipped, self.unchanged.trivial))
        original(self)

    engine.Propagator.finish = finish
    try:
        propagate(module, **kw)
    finally:
        engine.Propagator.finish = original
    return counts[0]


@pytest.fixture
def check_skips(monkeypatch):
    monkeypatch.setenv("HLO_SPMD_CHECK_SKIPS", "1")


@pytest.mark.parametrize("to_edges", [False, True], ids=["defaults", "to-params-output"])
@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.stem)
def test_skipped_inferences_change_nothing_on_every_fixture(path, to_edges, check_skips):
    # Any error fails: check mode raises when a skipped inference would have changed
    # something, and every fixture propagates without error otherwise.
    module = load_module(path)
    inline_calls(module)
    _skipped(module, propagate_to_parameters=to_edges, propagate_to_output=to_edges)


def test_the_memo_skips_something(check_skips):
    # Not vacuous: on a real training step most inferences after level 1 are skipped,
    # and some early ones have nothing sharded around them yet.
    module = load_module(FIXTURES / "transformer_train_step.pb")
    inline_calls(module)
    unchanged, trivial = _skipped(module)
    assert unchanged > 0 and trivial > 0


def test_a_rule_reading_more_than_declared_is_caught(check_skips, monkeypatch):
    # A forward rule that depends on the level beyond what the memo knows (here: a
    # reshape that only propagates from level 2) must make check mode fail.
    original = fw.FORWARD_RULES["reshape"]

    def level_gated(p, inst):
        return original.infer(p, inst) if p.level >= 2 else False

    monkeypatch.setitem(fw.FORWARD_RULES, "reshape", original._replace(infer=level_gated))
    _check_mode_fails("skipped an inference")


def test_a_level_answer_the_memo_does_not_note_is_caught(check_skips, monkeypatch):
    # A no-change inference that asked ``at_least`` holds only at levels giving the same
    # answers; if an answer went unnoted, a skip at another level must be caught.
    def unnoted(self, k, level=None):
        return (self._level if level is None else level) >= k

    monkeypatch.setattr(engine.Propagator, "at_least", unnoted)
    _check_mode_fails("skipped an inference")


def test_a_change_the_dirty_set_misses_is_caught(check_skips, monkeypatch):
    # The memo is asked only about inferences whose inputs changed (``DirtySet.changed``);
    # if a change went unreported, check mode must notice the stale instruction.
    from hlo_spmd.passes.propagation.dirty import DirtySet

    original = DirtySet.changed

    def forgetful(self, inst):
        if self.p.rec.level < 1:
            original(self, inst)

    monkeypatch.setattr(DirtySet, "changed", forgetful)
    _check_mode_fails("dirty set misses")


def _check_mode_fails(message: str) -> None:
    """Completing the training step under check mode raises ``message``."""
    module = load_module(FIXTURES / "transformer_train_step.pb")
    inline_calls(module)
    with pytest.raises(HloSpmdError, match=message):
        propagate(module)


def test_the_dirty_set_gives_the_decisions_of_asking_the_memo_always():
    # Same shardings, rules, sources, levels, iterations and alternatives as asking the
    # memo about every inference the walk reaches (everything flagged, all the time).
    from hlo_spmd.passes.propagation.dirty import DirtySet

    def run(always_ask: bool):
        module = load_module(FIXTURES / "transformer_train_step.pb")
        inline_calls(module)
        patched = {}
        if always_ask:
            def flag_all(self, *args):
                ids = [id(i) for i in self.p.graph.instructions()]
                self.flagged[0].update(ids)
                self.flagged[1].update(ids)
            patched = {"start_level": flag_all, "changed": flag_all}
        originals = {k: getattr(DirtySet, k) for k in patched}
        for k, f in patched.items():
            setattr(DirtySet, k, f)
        try:
            r = propagate(module)
        finally:
            for k, f in originals.items():
                setattr(DirtySet, k, f)
        return r.iterations, [(k, str(d.sharding), d.rule, d.sources, d.level, d.iteration,
                               [str(a) for a in d.alternatives])
                              for k, d in r.decisions.items()]

    assert run(False) == run(True)


def _graphs():
    pytest.importorskip("jax")
    from test_partition_random_graphs import graphs

    return graphs(annotate_all=False)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_graphs())
def test_skipped_inferences_change_nothing_on_random_graphs(case):
    # (hypothesis and function-scoped fixtures do not mix: the variable is set here)
    module, _n = case
    old = os.environ.get("HLO_SPMD_CHECK_SKIPS")
    os.environ["HLO_SPMD_CHECK_SKIPS"] = "1"
    try:
        propagate(module)
    finally:
        if old is None:
            del os.environ["HLO_SPMD_CHECK_SKIPS"]
        else:
            os.environ["HLO_SPMD_CHECK_SKIPS"] = old


