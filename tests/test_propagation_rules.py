"""Propagation rules checked against XLA's own sharding propagation.

``XLA_CASES`` are small modules (one or two rules each) that were compiled with XLA
(jax/jaxlib 0.10.2, ``--xla_dump_hlo_pass_re=sharding-propagation``, N CPU devices):
the text is XLA's module right before its ``sharding-propagation`` pass (metadata
dropped) and the expectations are every instruction's sharding right after it
(``None``: XLA left it unsharded, which its partitioner treats as replicated).
The cases re-express the kinds of situations XLA's sharding_propagation_test.cc
covers (elementwise, broadcast at levels 2/3, reduce incl. variadic, reshape incl. the
gcd rule, dot batch/contracting/partial-merge/lookahead, convolution spatial and
dot-like, reduce-window / select-and-scatter, gather / scatter incl. iota-parallel and
batching dims, sort, while / conditional, Sharding custom-calls with open dims, manual
and subgroup-manual regions, shard_as / shard_like, ...).

Further down: readable single-rule tests (with provenance), and property tests of the
sharding operations the propagation package adds (``sharding_ops``), checked against
the holder model of ``test_sharding_model``.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from test_sharding_model import SETTINGS, holder_mask, tiled_shardings

from hlo_spmd.ir.opcodes import ALL_OPCODES
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.passes.propagation import propagate
from hlo_spmd.passes.propagation import sharding_ops as ops
from hlo_spmd.passes.propagation.coverage import rule_coverage
from hlo_spmd.sharding import HloSharding, parse_sharding, transpose_sharding


def _expected(text: str | None, shape) -> HloSharding | None:
    if shape.is_token:
        return None
    s = HloSharding.replicate() if text is None else parse_sharding(text)
    return ops.normalize_tuple(s, shape)


XLA_CASES = {
    'ew_fwd_bwd': (8, '''
HloModule ew_fwd_bwd
ENTRY %main.1 (p0.1: f32[16,32], p1.1: f32[16,32]) -> f32[16,32] {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %p1.1 = f32[16,32]{1,0} parameter(1)
  %a.1 = f32[16,32]{1,0} add(%p0.1, %p1.1)
  %e.1 = f32[16,32]{1,0} exponential(%a.1)
  ROOT %r.1 = f32[16,32]{1,0} negate(%e.1)
}
''', {
        'p0.1': '{devices=[8,1]<=[8]}',
        'p1.1': None,
        'a.1': '{devices=[8,1]<=[8]}',
        'e.1': '{devices=[8,1]<=[8]}',
        'r.1': None,
    }),
    'bcast_fwd_bwd': (8, '''
HloModule bcast_fwd_bwd
ENTRY %main.1 (p0.1: f32[16], p1.1: f32[32], p2.1: f32[16,32]) -> f32[16,32] {
  %p0.1 = f32[16]{0} parameter(0), sharding={devices=[8]<=[8]}
  %b.1 = f32[16,32]{1,0} broadcast(%p0.1), dimensions={0}
  %p1.1 = f32[32]{0} parameter(1)
  %b1.1 = f32[16,32]{1,0} broadcast(%p1.1), dimensions={1}
  %a.1 = f32[16,32]{1,0} add(%b.1, %b1.1)
  %p2.1 = f32[16,32]{1,0} parameter(2), sharding={devices=[2,4]<=[8]}
  ROOT %m.1 = f32[16,32]{1,0} multiply(%a.1, %p2.1)
}
''', {
        'p0.1': '{devices=[8]<=[8]}',
        'b.1': '{devices=[8,1]<=[8]}',
        'p1.1': None,
        'b1.1': '{devices=[8,1]<=[8]}',
        'a.1': '{devices=[8,1]<=[8]}',
        'p2.1': '{devices=[2,4]<=[8]}',
        'm.1': None,
    }),
    'reduce_basic': (8, '''
HloModule reduce_basic
%region_0.1 (r0.2: f32[], r0.3: f32[]) -> f32[] {
  %r0.2 = f32[] parameter(0)
  %r0.3 = f32[] parameter(1)
  ROOT %s.1 = f32[] add(%r0.2, %r0.3)
}
%region_1.2 (r1.2: f32[], r1.3: f32[]) -> f32[] {
  %r1.2 = f32[] parameter(0)
  %r1.3 = f32[] parameter(1)
  ROOT %s.3 = f32[] add(%r1.2, %r1.3)
}
ENTRY %main.3 (p0.1: f32[16,32]) -> (f32[16], f32[32]) {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}
  %constant.1 = f32[] constant(0)
  %r0.5 = f32[16]{0} reduce(%p0.1, %constant.1), dimensions={1}, to_apply=%region_0.1
  %n0.1 = f32[16]{0} negate(%r0.5)
  %r1.5 = f32[32]{0} reduce(%p0.1, %constant.1), dimensions={0}, to_apply=%region_1.2
  ROOT %tuple.1 = (f32[16]{0}, f32[32]{0}) tuple(%n0.1, %r1.5)
}
''', {
        'r0.2': None,
        'r0.3': None,
        's.1': None,
        'r1.2': None,
        'r1.3': None,
        's.3': None,
        'p0.1': '{devices=[2,4]<=[8]}',
        'constant.1': None,
        'r0.5': '{devices=[2,4]<=[8] last_tile_dim_replicate}',
        'n0.1': '{devices=[2,4]<=[8] last_tile_dim_replicate}',
        'r1.5': '{devices=[4,2]<=[2,4]T(1,0) last_tile_dim_replicate}',
        'tuple.1': None,
    }),
    'reduce_variadic': (4, '''
HloModule reduce_variadic
%region_0.1 (r.4: f32[], r.5: s32[], r.6: f32[], r.7: s32[]) -> (f32[], s32[]) {
  %r.4 = f32[] parameter(0)
  %r.6 = f32[] parameter(2)
  %gt.1 = pred[] compare(%r.4, %r.6), direction=GT
  %v.1 = f32[] select(%gt.1, %r.4, %r.6)
  %r.5 = s32[] parameter(1)
  %r.7 = s32[] parameter(3)
  %vi.1 = s32[] select(%gt.1, %r.5, %r.7)
  ROOT %tuple.1 = (f32[], s32[]) tuple(%v.1, %vi.1)
}
ENTRY %main.2 (p0.1: f32[8,16]) -> (f32[8], s32[8]) {
  %p0.1 = f32[8,16]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %i.2 = s32[16]{0} iota(), iota_dimension=0
  %i.3 = s32[8,16]{1,0} broadcast(%i.2), dimensions={1}
  %constant.3 = f32[] constant(-inf)
  %constant.2 = s32[] constant(0)
  %r.11 = (f32[8]{0}, s32[8]{0}) reduce(%p0.1, %i.3, %constant.3, %constant.2), dimensions={1}, to_apply=%region_0.1
  %r.12 = f32[8]{0} get-tuple-element(%r.11), index=0
  %r.13 = s32[8]{0} get-tuple-element(%r.11), index=1
  ROOT %tuple.3 = (f32[8]{0}, s32[8]{0}) tuple(%r.12, %r.13)
}
''', {
        'r.4': None,
        'r.6': None,
        'gt.1': None,
        'v.1': None,
        'r.5': None,
        'r.7': None,
        'vi.1': None,
        'tuple.1': None,
        'p0.1': '{devices=[4,1]<=[4]}',
        'i.2': '{replicated}',
        'i.3': '{devices=[4,1]<=[4]}',
        'constant.3': None,
        'constant.2': None,
        'r.11': '{{devices=[4]<=[4]}, {devices=[4]<=[4]}}',
        'r.12': '{devices=[4]<=[4]}',
        'r.13': '{devices=[4]<=[4]}',
        'tuple.3': None,
    }),
    'reshape_split_merge': (8, '''
HloModule reshape_split_merge
ENTRY %main.1 (p0.1: f32[8,32], p1.1: f32[16,6], p2.1: f32[6,4], p3.1: f32[64]) -> (f32[2,4,32], f32[256], f32[96], f32[4,4,6], f32[4,6], /*index=5*/f32[8,8]) {
  %p0.1 = f32[8,32]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %r0.1 = f32[2,4,32]{2,1,0} reshape(%p0.1)
  %r1.1 = f32[256]{0} reshape(%p0.1)
  %p1.1 = f32[16,6]{1,0} parameter(1), sharding={devices=[4,2]<=[8]}
  %r2.1 = f32[96]{0} reshape(%p1.1)
  %r3.1 = f32[4,4,6]{2,1,0} reshape(%p1.1)
  %p2.1 = f32[6,4]{1,0} parameter(2), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  %r4.1 = f32[4,6]{1,0} reshape(%p2.1)
  %p3.1 = f32[64]{0} parameter(3)
  %r5.1 = f32[8,8]{1,0} reshape(%p3.1)
  %n5.1 = f32[8,8]{1,0} negate(%r5.1), sharding={devices=[8,1]<=[8]}
  ROOT %tuple.1 = (f32[2,4,32]{2,1,0}, f32[256]{0}, f32[96]{0}, f32[4,4,6]{2,1,0}, f32[4,6]{1,0}, /*index=5*/f32[8,8]{1,0}) tuple(%r0.1, %r1.1, %r2.1, %r3.1, %r4.1, /*index=5*/%n5.1)
}
''', {
        'p0.1': '{devices=[8,1]<=[8]}',
        'r0.1': '{devices=[2,4,1]<=[8]}',
        'r1.1': '{devices=[8]<=[8]}',
        'p1.1': '{devices=[4,2]<=[8]}',
        'r2.1': '{devices=[4,2]<=[8] last_tile_dim_replicate}',
        'r3.1': '{devices=[4,1,2]<=[8]}',
        'p2.1': '{devices=[2,1,4]<=[8] last_tile_dim_replicate}',
        'r4.1': '{devices=[2,1,4]<=[8] last_tile_dim_replicate}',
        'p3.1': None,
        'r5.1': '{devices=[8,1]<=[8]}',
        'n5.1': '{devices=[8,1]<=[8]}',
        'tuple.1': None,
    }),
    'transpose_slice_pad': (8, '''
HloModule transpose_slice_pad
ENTRY %main.1 (p0.1: f32[16,32]) -> f32[40,8] {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}
  %t.1 = f32[32,16]{0,1} transpose(%p0.1), dimensions={1,0}
  %s.1 = f32[32,8]{1,0} slice(%t.1), slice={[0:32], [0:8]}
  %constant.1 = f32[] constant(0)
  %pd.1 = f32[40,8]{1,0} pad(%s.1, %constant.1), padding=0_8x0_0
  %rv.1 = f32[40,8]{1,0} reverse(%pd.1), dimensions={0}
  ROOT %n.1 = f32[40,8]{1,0} negate(%rv.1)
}
''', {
        'p0.1': '{devices=[2,4]<=[8]}',
        't.1': '{devices=[4,2]<=[2,4]T(1,0)}',
        's.1': '{devices=[4,2]<=[2,4]T(1,0)}',
        'constant.1': None,
        'pd.1': '{devices=[4,2]<=[2,4]T(1,0)}',
        'rv.1': '{devices=[4,2]3,7,2,6,1,5,0,4}',
        'n.1': None,
    }),
    'concat_level': (8, '''
HloModule concat_level
ENTRY %main.1 (p0.1: f32[8,16], p1.1: f32[8,16], p2.1: f32[4,16], p3.1: f32[4,16]) -> (f32[8,32], f32[8,16]) {
  %p0.1 = f32[8,16]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %p1.1 = f32[8,16]{1,0} parameter(1)
  %c.1 = f32[8,32]{1,0} concatenate(%p0.1, %p1.1), dimensions={1}
  %p2.1 = f32[4,16]{1,0} parameter(2)
  %p3.1 = f32[4,16]{1,0} parameter(3)
  %c2.1 = f32[8,16]{1,0} concatenate(%p2.1, %p3.1), dimensions={0}
  %m.1 = f32[8,16]{1,0} multiply(%c2.1, %p0.1)
  ROOT %tuple.1 = (f32[8,32]{1,0}, f32[8,16]{1,0}) tuple(%c.1, %m.1)
}
''', {
        'p0.1': '{devices=[8,1]<=[8]}',
        'p1.1': None,
        'c.1': '{devices=[8,1]<=[8]}',
        'p2.1': None,
        'p3.1': None,
        'c2.1': '{devices=[8,1]<=[8]}',
        'm.1': '{devices=[8,1]<=[8]}',
        'tuple.1': None,
    }),
    'dynamic_slicing': (8, '''
HloModule dynamic_slicing
ENTRY %main.1 (p0.1: f32[16,32], i.1: s32[], p2.1: f32[16,32]) -> f32[16,32] {
  %p2.1 = f32[16,32]{1,0} parameter(2)
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}
  %i.1 = s32[] parameter(1)
  %constant.1 = s32[] constant(0)
  %ds.1 = f32[4,32]{1,0} dynamic-slice(%p0.1, %i.1, %constant.1), dynamic_slice_sizes={4,32}
  %n.1 = f32[4,32]{1,0} negate(%ds.1)
  %dus.1 = f32[16,32]{1,0} dynamic-update-slice(%p2.1, %n.1, %i.1, %constant.1)
  ROOT %a.1 = f32[16,32]{1,0} add(%dus.1, %p0.1)
}
''', {
        'p2.1': None,
        'p0.1': '{devices=[2,4]<=[8]}',
        'i.1': None,
        'constant.1': None,
        'ds.1': '{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}',
        'n.1': '{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}',
        'dus.1': '{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}',
        'a.1': None,
    }),
    'dot_batch': (8, '''
HloModule dot_batch
ENTRY %main.1 (p0.1: f32[8,16,32], p1.1: f32[8,32,64]) -> f32[8,16,64] {
  %p0.1 = f32[8,16,32]{2,1,0} parameter(0), sharding={devices=[8,1,1]<=[8]}
  %p1.1 = f32[8,32,64]{2,1,0} parameter(1)
  %d.1 = f32[8,16,64]{2,1,0} dot(%p0.1, %p1.1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT %n.1 = f32[8,16,64]{2,1,0} negate(%d.1)
}
''', {
        'p0.1': '{devices=[8,1,1]<=[8]}',
        'p1.1': None,
        'd.1': '{devices=[8,1,1]<=[8]}',
        'n.1': None,
    }),
    'dot_contracting': (4, '''
HloModule dot_contracting
ENTRY %main.1 (p0.1: f32[16,32], p1.1: f32[32,64]) -> f32[16,64] {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[1,4]<=[4]}
  %p1.1 = f32[32,64]{1,0} parameter(1), sharding={devices=[4,1]<=[4]}
  %d.1 = f32[16,64]{1,0} dot(%p0.1, %p1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %n.1 = f32[16,64]{1,0} negate(%d.1)
}
''', {
        'p0.1': '{devices=[1,4]<=[4]}',
        'p1.1': '{devices=[4,1]<=[4]}',
        'd.1': '{replicated}',
        'n.1': None,
    }),
    'dot_two_sided': (8, '''
HloModule dot_two_sided
ENTRY %main.1 (p0.1: f32[16,32], p1.1: f32[32,64]) -> f32[16,64] {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  %p1.1 = f32[32,64]{1,0} parameter(1), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  %d.1 = f32[16,64]{1,0} dot(%p0.1, %p1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %n.1 = f32[16,64]{1,0} negate(%d.1)
}
''', {
        'p0.1': '{devices=[2,1,4]<=[8] last_tile_dim_replicate}',
        'p1.1': '{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}',
        'd.1': '{devices=[2,4]<=[8]}',
        'n.1': None,
    }),
    'dot_conflict_size': (8, '''
HloModule dot_conflict_size
ENTRY %main.1 (p0.1: f32[64,32], p1.1: f32[32,16]) -> f32[64,16] {
  %p0.1 = f32[64,32]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %p1.1 = f32[32,16]{1,0} parameter(1), sharding={devices=[1,8]<=[8]}
  %d.1 = f32[64,16]{1,0} dot(%p0.1, %p1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %n.1 = f32[64,16]{1,0} negate(%d.1)
}
''', {
        'p0.1': '{devices=[8,1]<=[8]}',
        'p1.1': '{devices=[1,8]<=[8]}',
        'd.1': '{devices=[8,1]<=[8]}',
        'n.1': None,
    }),
    'dot_lookahead': (8, '''
HloModule dot_lookahead
ENTRY %main.1 (p0.1: f32[16,32], p1.1: f32[32,64]) -> f32[16,64] {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %p1.1 = f32[32,64]{1,0} parameter(1), sharding={devices=[1,8]<=[8]}
  %d.1 = f32[16,64]{1,0} dot(%p0.1, %p1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %n.1 = f32[16,64]{1,0} negate(%d.1)
  %e.1 = f32[16,64]{1,0} exponential(%n.1), sharding={devices=[8,1]<=[8]}
  %tuple.1 = (f32[16,64]{1,0}) tuple(%e.1), sharding={{devices=[8,1]<=[8]}}
  ROOT %get-tuple-element.1 = f32[16,64]{1,0} get-tuple-element(%tuple.1), index=0, sharding={devices=[8,1]<=[8]}
}
''', {
        'p0.1': '{devices=[8,1]<=[8]}',
        'p1.1': '{devices=[1,8]<=[8]}',
        'd.1': '{devices=[8,1]<=[8]}',
        'n.1': '{devices=[8,1]<=[8]}',
        'e.1': '{devices=[8,1]<=[8]}',
        'tuple.1': '{{devices=[8,1]<=[8]}}',
        'get-tuple-element.1': '{devices=[8,1]<=[8]}',
    }),
    'dot_backward': (8, '''
HloModule dot_backward
ENTRY %main.1 (p0.1: f32[16,32], p1.1: f32[32,64]) -> f32[16,64] {
  %p0.1 = f32[16,32]{1,0} parameter(0)
  %p1.1 = f32[32,64]{1,0} parameter(1)
  %d.1 = f32[16,64]{1,0} dot(%p0.1, %p1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %n.1 = f32[16,64]{1,0} negate(%d.1), sharding={devices=[2,4]<=[8]}
  %tuple.1 = (f32[16,64]{1,0}) tuple(%n.1), sharding={{devices=[2,4]<=[8]}}
  ROOT %get-tuple-element.1 = f32[16,64]{1,0} get-tuple-element(%tuple.1), index=0, sharding={devices=[2,4]<=[8]}
}
''', {
        'p0.1': None,
        'p1.1': None,
        'd.1': '{devices=[2,4]<=[8]}',
        'n.1': '{devices=[2,4]<=[8]}',
        'tuple.1': '{{devices=[2,4]<=[8]}}',
        'get-tuple-element.1': '{devices=[2,4]<=[8]}',
    }),
    'conv_spatial': (4, '''
HloModule conv_spatial
ENTRY %main.1 (p0.1: f32[8,32,32,16], p1.1: f32[3,3,16,32]) -> f32[8,32,32,32] {
  %p0.1 = f32[8,32,32,16]{3,2,1,0} parameter(0), sharding={devices=[1,4,1,1]<=[4]}
  %p1.1 = f32[3,3,16,32]{3,2,1,0} parameter(1)
  %c.1 = f32[8,32,32,32]{3,2,1,0} convolution(%p0.1, %p1.1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  ROOT %n.1 = f32[8,32,32,32]{3,2,1,0} negate(%c.1)
}
''', {
        'p0.1': '{devices=[1,4,1,1]<=[4]}',
        'p1.1': None,
        'c.1': '{devices=[1,4,1,1]<=[4]}',
        'n.1': None,
    }),
    'conv_dotlike': (4, '''
HloModule conv_dotlike
ENTRY %main.1 (p0.1: f32[8,4,4,16], p1.1: f32[1,1,16,32]) -> f32[8,4,4,32] {
  %p0.1 = f32[8,4,4,16]{3,2,1,0} parameter(0), sharding={devices=[4,1,1,1]<=[4]}
  %p1.1 = f32[1,1,16,32]{3,2,1,0} parameter(1)
  %c.1 = f32[8,4,4,32]{3,2,1,0} convolution(%p0.1, %p1.1), window={size=1x1}, dim_labels=b01f_01io->b01f
  ROOT %n.1 = f32[8,4,4,32]{3,2,1,0} negate(%c.1)
}
''', {
        'p0.1': '{devices=[4,1,1,1]<=[4]}',
        'p1.1': None,
        'c.1': '{devices=[4,1,1,1]<=[4]}',
        'n.1': None,
    }),
    'conv_backward': (4, '''
HloModule conv_backward
ENTRY %main.1 (p0.1: f32[8,32,32,16], p1.1: f32[1,1,16,32]) -> f32[8,32,32,32] {
  %p0.1 = f32[8,32,32,16]{3,2,1,0} parameter(0)
  %p1.1 = f32[1,1,16,32]{3,2,1,0} parameter(1)
  %c.1 = f32[8,32,32,32]{3,2,1,0} convolution(%p0.1, %p1.1), window={size=1x1}, dim_labels=b01f_01io->b01f
  %n.1 = f32[8,32,32,32]{3,2,1,0} negate(%c.1), sharding={devices=[4,1,1,1]<=[4]}
  %tuple.1 = (f32[8,32,32,32]{3,2,1,0}) tuple(%n.1), sharding={{devices=[4,1,1,1]<=[4]}}
  ROOT %get-tuple-element.1 = f32[8,32,32,32]{3,2,1,0} get-tuple-element(%tuple.1), index=0, sharding={devices=[4,1,1,1]<=[4]}
}
''', {
        'p0.1': None,
        'p1.1': None,
        'c.1': '{devices=[4,1,1,1]<=[4]}',
        'n.1': '{devices=[4,1,1,1]<=[4]}',
        'tuple.1': '{{devices=[4,1,1,1]<=[4]}}',
        'get-tuple-element.1': '{devices=[4,1,1,1]<=[4]}',
    }),
    'reduce_window_sas': (4, '''
HloModule reduce_window_sas
%region_0.1 (rw.2: f32[], rw.3: f32[]) -> f32[] {
  %rw.2 = f32[] parameter(0)
  %rw.3 = f32[] parameter(1)
  ROOT %s.1 = f32[] maximum(%rw.2, %rw.3)
}
%region_1.2 (sas.2: f32[], sas.3: f32[]) -> pred[] {
  %sas.2 = f32[] parameter(0)
  %sas.3 = f32[] parameter(1)
  ROOT %g.1 = pred[] compare(%sas.2, %sas.3), direction=GE
}
%region_2.3 (sas.6: f32[], sas.7: f32[]) -> f32[] {
  %sas.6 = f32[] parameter(0)
  %sas.7 = f32[] parameter(1)
  ROOT %s.3 = f32[] add(%sas.6, %sas.7)
}
ENTRY %main.4 (p0.1: f32[8,32,32,16]) -> (f32[8,16,16,16], f32[8,32,32,16]) {
  %p0.1 = f32[8,32,32,16]{3,2,1,0} parameter(0), sharding={devices=[1,4,1,1]<=[4]}
  %constant.3 = f32[] constant(-inf)
  %rw.5 = f32[8,16,16,16]{3,2,1,0} reduce-window(%p0.1, %constant.3), window={size=1x2x2x1 stride=1x2x2x1}, to_apply=%region_0.1
  %src.1 = f32[8,16,16,16]{3,2,1,0} negate(%rw.5)
  %constant.2 = f32[] constant(0)
  %sas.9 = f32[8,32,32,16]{3,2,1,0} select-and-scatter(%p0.1, %src.1, %constant.2), window={size=1x2x2x1 stride=1x2x2x1}, select=%region_1.2, scatter=%region_2.3
  ROOT %tuple.1 = (f32[8,16,16,16]{3,2,1,0}, f32[8,32,32,16]{3,2,1,0}) tuple(%rw.5, %sas.9)
}
''', {
        'rw.2': None,
        'rw.3': None,
        's.1': None,
        'sas.2': None,
        'sas.3': None,
        'g.1': None,
        'sas.6': None,
        'sas.7': None,
        's.3': None,
        'p0.1': '{devices=[1,4,1,1]<=[4]}',
        'constant.3': None,
        'rw.5': '{devices=[1,4,1,1]<=[4]}',
        'src.1': '{devices=[1,4,1,1]<=[4]}',
        'constant.2': None,
        'sas.9': '{devices=[1,4,1,1]<=[4]}',
        'tuple.1': None,
    }),
    'gather_iota': (4, '''
HloModule gather_iota
ENTRY %main.1 (p0.1: f32[8,16], idx.1: s32[8]) -> f32[8] {
  %p0.1 = f32[8,16]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %io.2 = s32[8]{0} iota(), iota_dimension=0
  %io.3 = s32[8,1]{1,0} reshape(%io.2)
  %idx.1 = s32[8]{0} parameter(1)
  %r.1 = s32[8,1]{1,0} reshape(%idx.1)
  %ci.1 = s32[8,2]{1,0} concatenate(%io.3, %r.1), dimensions={1}
  %g.1 = f32[8]{0} gather(%p0.1, %ci.1), offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}
  ROOT %n.1 = f32[8]{0} negate(%g.1)
}
''', {
        'p0.1': '{devices=[4,1]<=[4]}',
        'io.2': None,
        'io.3': None,
        'idx.1': None,
        'r.1': None,
        'ci.1': None,
        'g.1': None,
        'n.1': None,
    }),
    'gather_embed': (4, '''
HloModule gather_embed
ENTRY %main.1 (tbl.1: f32[64,16], idx.1: s32[8,1]) -> f32[8,16] {
  %tbl.1 = f32[64,16]{1,0} parameter(0), sharding={devices=[1,4]<=[4]}
  %idx.1 = s32[8,1]{1,0} parameter(1), sharding={devices=[4,1]<=[4]}
  %g.1 = f32[8,16]{1,0} gather(%tbl.1, %idx.1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,16}
  ROOT %n.1 = f32[8,16]{1,0} negate(%g.1)
}
''', {
        'tbl.1': '{devices=[1,4]<=[4]}',
        'idx.1': '{devices=[4,1]<=[4]}',
        'g.1': '{devices=[4,1]<=[4]}',
        'n.1': None,
    }),
    'gather_backward': (4, '''
HloModule gather_backward
ENTRY %main.1 (tbl.1: f32[64,16], idx.1: s32[8,1]) -> f32[8,16] {
  %tbl.1 = f32[64,16]{1,0} parameter(0)
  %idx.1 = s32[8,1]{1,0} parameter(1)
  %g.1 = f32[8,16]{1,0} gather(%tbl.1, %idx.1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,16}
  %n.1 = f32[8,16]{1,0} negate(%g.1), sharding={devices=[2,2]<=[4]}
  %tuple.1 = (f32[8,16]{1,0}) tuple(%n.1), sharding={{devices=[2,2]<=[4]}}
  ROOT %get-tuple-element.1 = f32[8,16]{1,0} get-tuple-element(%tuple.1), index=0, sharding={devices=[2,2]<=[4]}
}
''', {
        'tbl.1': None,
        'idx.1': None,
        'g.1': '{devices=[2,2]<=[4]}',
        'n.1': '{devices=[2,2]<=[4]}',
        'tuple.1': '{{devices=[2,2]<=[4]}}',
        'get-tuple-element.1': '{devices=[2,2]<=[4]}',
    }),
    'scatter_add': (4, '''
HloModule scatter_add
%region_0.1 (s.3: f32[], s.4: f32[]) -> f32[] {
  %s.3 = f32[] parameter(0)
  %s.4 = f32[] parameter(1)
  ROOT %s.5 = f32[] add(%s.3, %s.4)
}
ENTRY %main.2 (buf.1: f32[64,16], idx.1: s32[8,1], upd.1: f32[8,16]) -> f32[64,16] {
  %buf.1 = f32[64,16]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %idx.1 = s32[8,1]{1,0} parameter(1)
  %upd.1 = f32[8,16]{1,0} parameter(2), sharding={devices=[1,4]<=[4]}
  %s.7 = f32[64,16]{1,0} scatter(%buf.1, %idx.1, %upd.1), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%region_0.1
  ROOT %n.1 = f32[64,16]{1,0} negate(%s.7)
}
''', {
        's.3': None,
        's.4': None,
        's.5': None,
        'buf.1': '{devices=[4,1]<=[4]}',
        'idx.1': None,
        'upd.1': '{devices=[1,4]<=[4]}',
        's.7': '{devices=[4,1]<=[4]}',
        'n.1': None,
    }),
    'scatter_backward': (4, '''
HloModule scatter_backward
%region_0.1 (s.3: f32[], s.4: f32[]) -> f32[] {
  %s.3 = f32[] parameter(0)
  %s.4 = f32[] parameter(1)
  ROOT %s.5 = f32[] add(%s.3, %s.4)
}
ENTRY %main.2 (buf.1: f32[64,16], idx.1: s32[8,1], upd.1: f32[8,16]) -> f32[64,16] {
  %buf.1 = f32[64,16]{1,0} parameter(0)
  %idx.1 = s32[8,1]{1,0} parameter(1)
  %upd.1 = f32[8,16]{1,0} parameter(2)
  %s.7 = f32[64,16]{1,0} scatter(%buf.1, %idx.1, %upd.1), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%region_0.1
  %n.1 = f32[64,16]{1,0} negate(%s.7), sharding={devices=[2,2]<=[4]}
  %tuple.1 = (f32[64,16]{1,0}) tuple(%n.1), sharding={{devices=[2,2]<=[4]}}
  ROOT %get-tuple-element.1 = f32[64,16]{1,0} get-tuple-element(%tuple.1), index=0, sharding={devices=[2,2]<=[4]}
}
''', {
        's.3': None,
        's.4': None,
        's.5': None,
        'buf.1': None,
        'idx.1': None,
        'upd.1': None,
        's.7': '{devices=[2,2]<=[4]}',
        'n.1': '{devices=[2,2]<=[4]}',
        'tuple.1': '{{devices=[2,2]<=[4]}}',
        'get-tuple-element.1': '{devices=[2,2]<=[4]}',
    }),
    'sort_tuple': (4, '''
HloModule sort_tuple
%region_0.1 (s.4: f32[], s.5: f32[], s.6: s32[], s.7: s32[]) -> pred[] {
  %s.6 = s32[] parameter(2)
  %s.7 = s32[] parameter(3)
  %s.4 = f32[] parameter(0)
  %s.5 = f32[] parameter(1)
  ROOT %l.1 = pred[] compare(%s.4, %s.5), direction=LT
}
ENTRY %main.2 (p0.1: f32[8,16]) -> (f32[8,16], s32[8,16]) {
  %p0.1 = f32[8,16]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %i.2 = s32[16]{0} iota(), iota_dimension=0
  %i.3 = s32[8,16]{1,0} broadcast(%i.2), dimensions={1}
  %s.11 = (f32[8,16]{1,0}, s32[8,16]{1,0}) sort(%p0.1, %i.3), dimensions={1}, to_apply=%region_0.1
  %s.12 = f32[8,16]{1,0} get-tuple-element(%s.11), index=0
  %s.13 = s32[8,16]{1,0} get-tuple-element(%s.11), index=1
  ROOT %tuple.1 = (f32[8,16]{1,0}, s32[8,16]{1,0}) tuple(%s.12, %s.13)
}
''', {
        's.6': None,
        's.7': None,
        's.4': None,
        's.5': None,
        'l.1': None,
        'p0.1': '{devices=[4,1]<=[4]}',
        'i.2': '{replicated}',
        'i.3': '{devices=[4,1]<=[4]}',
        's.11': '{{devices=[4,1]<=[4]}, {devices=[4,1]<=[4]}}',
        's.12': '{devices=[4,1]<=[4]}',
        's.13': '{devices=[4,1]<=[4]}',
        'tuple.1': None,
    }),
    'sort_sharded_dim': (4, '''
HloModule sort_sharded_dim
%region_0.1 (s.2: f32[], s.3: f32[]) -> pred[] {
  %s.2 = f32[] parameter(0)
  %s.3 = f32[] parameter(1)
  ROOT %l.1 = pred[] compare(%s.2, %s.3), direction=LT
}
ENTRY %main.2 (p0.1: f32[8,16]) -> f32[8,16] {
  %p0.1 = f32[8,16]{1,0} parameter(0), sharding={devices=[1,4]<=[4]}
  %s.5 = f32[8,16]{1,0} sort(%p0.1), dimensions={1}, to_apply=%region_0.1
  ROOT %n.1 = f32[8,16]{1,0} negate(%s.5)
}
''', {
        's.2': None,
        's.3': None,
        'l.1': None,
        'p0.1': '{devices=[1,4]<=[4]}',
        's.5': '{devices=[1,4]<=[4]}',
        'n.1': None,
    }),
    'while_carry': (4, '''
HloModule while_carry
%region_0.1 (arg_tuple.1: (s32[], f32[16,8], f32[8,8])) -> (s32[], f32[16,8], f32[8,8]) {
  %arg_tuple.1 = (s32[], f32[16,8]{1,0}, f32[8,8]{1,0}) parameter(0)
  %get-tuple-element.3 = s32[] get-tuple-element(%arg_tuple.1), index=0
  %constant.2 = s32[] constant(1)
  %i2.1 = s32[] add(%get-tuple-element.3, %constant.2)
  %get-tuple-element.4 = f32[16,8]{1,0} get-tuple-element(%arg_tuple.1), index=1
  %get-tuple-element.5 = f32[8,8]{1,0} get-tuple-element(%arg_tuple.1), index=2
  %d.1 = f32[16,8]{1,0} dot(%get-tuple-element.4, %get-tuple-element.5), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %tuple.1 = (s32[], f32[16,8]{1,0}, f32[8,8]{1,0}) tuple(%i2.1, %d.1, %get-tuple-element.5)
}
%region_1.2 (arg_tuple.3: (s32[], f32[16,8], f32[8,8])) -> pred[] {
  %arg_tuple.3 = (s32[], f32[16,8]{1,0}, f32[8,8]{1,0}) parameter(0)
  %get-tuple-element.10 = f32[16,8]{1,0} get-tuple-element(%arg_tuple.3), index=1
  %get-tuple-element.11 = f32[8,8]{1,0} get-tuple-element(%arg_tuple.3), index=2
  %get-tuple-element.9 = s32[] get-tuple-element(%arg_tuple.3), index=0
  %constant.4 = s32[] constant(4)
  ROOT %l.1 = pred[] compare(%get-tuple-element.9, %constant.4), direction=LT
}
ENTRY %main.3 (x.1: f32[16,8], w.1: f32[8,8]) -> f32[16,8] {
  %constant.5 = s32[] constant(0)
  %x.1 = f32[16,8]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %w.1 = f32[8,8]{1,0} parameter(1)
  %wl.4 = (s32[], f32[16,8]{1,0}, f32[8,8]{1,0}) tuple(%constant.5, %x.1, %w.1)
  %wl.5 = (s32[], f32[16,8]{1,0}, f32[8,8]{1,0}) while(%wl.4), condition=%region_1.2, body=%region_0.1
  %wl.6 = s32[] get-tuple-element(%wl.5), index=0
  ROOT %wl.7 = f32[16,8]{1,0} get-tuple-element(%wl.5), index=1
}
''', {
        'arg_tuple.1': '{{replicated}, {devices=[4,1]<=[4]}, {replicated}}',
        'get-tuple-element.3': '{replicated}',
        'constant.2': '{replicated}',
        'i2.1': '{replicated}',
        'get-tuple-element.4': '{devices=[4,1]<=[4]}',
        'get-tuple-element.5': '{replicated}',
        'd.1': '{devices=[4,1]<=[4]}',
        'tuple.1': '{{replicated}, {devices=[4,1]<=[4]}, {replicated}}',
        'arg_tuple.3': '{{replicated}, {devices=[4,1]<=[4]}, {replicated}}',
        'get-tuple-element.10': '{devices=[4,1]<=[4]}',
        'get-tuple-element.11': '{replicated}',
        'get-tuple-element.9': '{replicated}',
        'constant.4': '{replicated}',
        'l.1': '{replicated}',
        'constant.5': '{replicated}',
        'x.1': '{devices=[4,1]<=[4]}',
        'w.1': None,
        'wl.4': '{{replicated}, {devices=[4,1]<=[4]}, {replicated}}',
        'wl.5': '{{replicated}, {devices=[4,1]<=[4]}, {replicated}}',
        'wl.6': '{replicated}',
        'wl.7': None,
    }),
    'conditional_branches': (4, '''
HloModule conditional_branches
%region_0.1 (x.0: (f32[16,8])) -> (f32[16,8]) {
  %x.0 = (f32[16,8]{1,0}) parameter(0)
  %get-tuple-element = f32[16,8]{1,0} get-tuple-element(%x.0), index=0
  %e.1 = f32[16,8]{1,0} exponential(%get-tuple-element)
  ROOT %tuple.0 = (f32[16,8]{1,0}) tuple(%e.1)
}
%region_1.2 (y.0: (f32[16,8])) -> (f32[16,8]) {
  %y.0 = (f32[16,8]{1,0}) parameter(0)
  %get-tuple-element.1 = f32[16,8]{1,0} get-tuple-element(%y.0), index=0
  %l.1 = f32[16,8]{1,0} log(%get-tuple-element.1)
  ROOT %tuple.1 = (f32[16,8]{1,0}) tuple(%l.1)
}
ENTRY %main.3 (p.1: pred[], x.3: f32[16,8], y.3: f32[16,8]) -> f32[16,8] {
  %p.1 = pred[] parameter(0)
  %x.3 = f32[16,8]{1,0} parameter(1), sharding={devices=[4,1]<=[4]}
  %tuple.2 = (f32[16,8]{1,0}) tuple(%x.3)
  %y.3 = f32[16,8]{1,0} parameter(2)
  %tuple.3 = (f32[16,8]{1,0}) tuple(%y.3)
  %c.1.clone = (f32[16,8]{1,0}) conditional(%p.1, %tuple.2, %tuple.3), true_computation=%region_0.1, false_computation=%region_1.2
  %get-tuple-element.2 = f32[16,8]{1,0} get-tuple-element(%c.1.clone), index=0
  ROOT %n.1 = f32[16,8]{1,0} negate(%get-tuple-element.2)
}
''', {
        'x.0': '{{devices=[4,1]<=[4]}}',
        'get-tuple-element': '{devices=[4,1]<=[4]}',
        'e.1': '{devices=[4,1]<=[4]}',
        'tuple.0': '{{devices=[4,1]<=[4]}}',
        'y.0': '{{devices=[4,1]<=[4]}}',
        'get-tuple-element.1': '{devices=[4,1]<=[4]}',
        'l.1': '{devices=[4,1]<=[4]}',
        'tuple.1': '{{devices=[4,1]<=[4]}}',
        'p.1': None,
        'x.3': '{devices=[4,1]<=[4]}',
        'tuple.2': '{{devices=[4,1]<=[4]}}',
        'y.3': None,
        'tuple.3': '{{devices=[4,1]<=[4]}}',
        'c.1.clone': '{{devices=[4,1]<=[4]}}',
        'get-tuple-element.2': '{devices=[4,1]<=[4]}',
        'n.1': None,
    }),
    'sharding_cc_unspecified': (8, '''
HloModule sharding_cc_unspecified
ENTRY %main.1 (p0.1: f32[16,32]) -> f32[16,32] {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  %e.1 = f32[16,32]{1,0} exponential(%p0.1)
  %s.1 = f32[16,32]{1,0} custom-call(%e.1), custom_call_target="Sharding", sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}, backend_config="unspecified_dims=[0]"
  %n.1 = f32[16,32]{1,0} negate(%s.1)
  ROOT %r.1 = f32[16,32]{1,0} sqrt(%n.1)
}
''', {
        'p0.1': '{devices=[2,1,4]<=[8] last_tile_dim_replicate}',
        'e.1': '{devices=[2,4]<=[8]}',
        's.1': '{devices=[2,4]<=[8]}',
        'n.1': '{devices=[2,4]<=[8]}',
        'r.1': None,
    }),
    'sharding_cc_full': (8, '''
HloModule sharding_cc_full
ENTRY %main.1 (p0.1: f32[16,32]) -> f32[16,32] {
  %p0.1 = f32[16,32]{1,0} parameter(0)
  %e.1 = f32[16,32]{1,0} exponential(%p0.1)
  %s.1 = f32[16,32]{1,0} custom-call(%e.1), custom_call_target="Sharding", sharding={devices=[8,1]<=[8]}
  %n.1 = f32[16,32]{1,0} negate(%s.1)
  ROOT %r.1 = f32[16,32]{1,0} sqrt(%n.1)
}
''', {
        'p0.1': None,
        'e.1': '{devices=[8,1]<=[8]}',
        's.1': '{devices=[8,1]<=[8]}',
        'n.1': '{devices=[8,1]<=[8]}',
        'r.1': None,
    }),
    'manual_region': (4, '''
HloModule manual_region
%region_0.1 (ar.2: f32[], ar.3: f32[]) -> f32[] {
  %ar.2 = f32[] parameter(0)
  %ar.3 = f32[] parameter(1)
  ROOT %s.2 = f32[] add(%ar.2, %ar.3)
}
ENTRY %main.2 (p0.1: f32[16,8]) -> f32[16,8] {
  %p0.1 = f32[16,8]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %s.3 = f32[16,8]{1,0} custom-call(%p0.1), custom_call_target="Sharding", sharding={devices=[4,1]<=[4]}
  %f.1 = f32[4,8]{1,0} custom-call(%s.3), custom_call_target="SPMDFullToShardShape", sharding={manual}
  %e.1 = f32[4,8]{1,0} exponential(%f.1)
  %ar.5 = f32[4,8]{1,0} all-reduce(%e.1), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%region_0.1
  %n.1 = f32[4,8]{1,0} negate(%ar.5)
  %sc2.1 = f32[4,8]{1,0} custom-call(%n.1), custom_call_target="Sharding", sharding={manual}
  %t.1 = f32[16,8]{1,0} custom-call(%sc2.1), custom_call_target="SPMDShardToFullShape", sharding={devices=[4,1]<=[4]}
  ROOT %r.1 = f32[16,8]{1,0} sqrt(%t.1)
}
''', {
        'ar.2': None,
        'ar.3': None,
        's.2': None,
        'p0.1': '{devices=[4,1]<=[4]}',
        's.3': '{devices=[4,1]<=[4]}',
        'f.1': '{manual}',
        'e.1': '{manual}',
        'ar.5': '{manual}',
        'n.1': '{manual}',
        'sc2.1': '{manual}',
        't.1': '{devices=[4,1]<=[4]}',
        'r.1': None,
    }),
    'partial_merge': (8, '''
HloModule partial_merge
ENTRY %main.1 (p0.1: f32[16,32], p1.1: f32[16,32]) -> f32[16,32] {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  %p1.1 = f32[16,32]{1,0} parameter(1), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  %a.1 = f32[16,32]{1,0} add(%p0.1, %p1.1)
  ROOT %n.1 = f32[16,32]{1,0} negate(%a.1)
}
''', {
        'p0.1': '{devices=[2,1,4]<=[8] last_tile_dim_replicate}',
        'p1.1': '{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}',
        'a.1': '{devices=[2,4]<=[8]}',
        'n.1': None,
    }),
    'maximal_dev': (4, '''
HloModule maximal_dev
ENTRY %main.1 (p0.1: f32[16,8], p1.1: f32[16,8]) -> f32[16,8] {
  %p0.1 = f32[16,8]{1,0} parameter(0), sharding={maximal device=1}
  %n.1 = f32[16,8]{1,0} negate(%p0.1)
  %p1.1 = f32[16,8]{1,0} parameter(1), sharding={replicated}
  %a.1 = f32[16,8]{1,0} add(%n.1, %p1.1)
  ROOT %r.1 = f32[16,8]{1,0} sqrt(%a.1)
}
''', {
        'p0.1': '{maximal device=1}',
        'n.1': '{replicated}',
        'p1.1': '{replicated}',
        'a.1': '{replicated}',
        'r.1': None,
    }),
    'rng_bits': (4, '''
HloModule rng_bits
ENTRY %main.1 (p0.1: u64[2], p1.1: u32[16,8]) -> u32[16,8] {
  %p0.1 = u64[2]{0} parameter(0)
  %r.3 = (u64[2]{0}, u32[16,8]{1,0}) rng-bit-generator(%p0.1), algorithm=rng_default
  %r.4 = u64[2]{0} get-tuple-element(%r.3), index=0
  %r.5 = u32[16,8]{1,0} get-tuple-element(%r.3), index=1
  %p1.1 = u32[16,8]{1,0} parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT %a.1 = u32[16,8]{1,0} add(%r.5, %p1.1)
}
''', {
        'p0.1': None,
        'r.3': None,
        'r.4': None,
        'r.5': None,
        'p1.1': '{devices=[4,1]<=[4]}',
        'a.1': None,
    }),
    'iota_constant': (4, '''
HloModule iota_constant
ENTRY %main.1 (p0.1: s32[16,8]) -> s32[16,8] {
  %i.2 = s32[16]{0} iota(), iota_dimension=0
  %i.3 = s32[16,8]{1,0} broadcast(%i.2), dimensions={0}
  %p0.1 = s32[16,8]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %a.1 = s32[16,8]{1,0} add(%i.3, %p0.1)
  %constant.1 = s32[16,8]{1,0} constant({...})
  ROOT %b.1 = s32[16,8]{1,0} add(%a.1, %constant.1)
}
''', {
        'i.2': '{devices=[4]<=[4]}',
        'i.3': '{devices=[4,1]<=[4]}',
        'p0.1': '{devices=[4,1]<=[4]}',
        'a.1': '{devices=[4,1]<=[4]}',
        'constant.1': None,
        'b.1': None,
    }),
    'opt_barrier_tuple': (4, '''
HloModule opt_barrier_tuple
ENTRY %main.1 (p0.1: f32[16,8], p1.1: f32[8]) -> f32[16,8] {
  %p0.1 = f32[16,8]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %p1.1 = f32[8]{0} parameter(1)
  %ob.4 = (f32[16,8]{1,0}, f32[8]{0}) tuple(%p0.1, %p1.1)
  %ob.5 = (f32[16,8]{1,0}, f32[8]{0}) opt-barrier(%ob.4)
  %ob.6 = f32[16,8]{1,0} get-tuple-element(%ob.5), index=0
  %ob.7 = f32[8]{0} get-tuple-element(%ob.5), index=1
  %b.1 = f32[16,8]{1,0} broadcast(%ob.7), dimensions={1}
  ROOT %a.1 = f32[16,8]{1,0} add(%ob.6, %b.1)
}
''', {
        'p0.1': '{devices=[4,1]<=[4]}',
        'p1.1': None,
        'ob.4': '{{devices=[4,1]<=[4]}, {replicated}}',
        'ob.5': '{{devices=[4,1]<=[4]}, {replicated}}',
        'ob.6': '{devices=[4,1]<=[4]}',
        'ob.7': '{replicated}',
        'b.1': None,
        'a.1': None,
    }),
    'select_clamp_convert': (4, '''
HloModule select_clamp_convert
ENTRY %main.1 (p0.1: f32[16,8]) -> f32[16,8] {
  %constant.4 = f32[] constant(-1)
  %c.3 = f32[16,8]{1,0} broadcast(%constant.4), dimensions={}
  %p0.1 = f32[16,8]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}
  %constant.5 = f32[] constant(0)
  %zb.1 = f32[16,8]{1,0} broadcast(%constant.5), dimensions={}
  %gt.1 = pred[16,8]{1,0} compare(%p0.1, %zb.1), direction=GT
  %s.1 = f32[16,8]{1,0} select(%gt.1, %p0.1, %zb.1)
  %constant.3 = f32[] constant(1)
  %c.4 = f32[16,8]{1,0} broadcast(%constant.3), dimensions={}
  %c.5 = f32[16,8]{1,0} clamp(%c.3, %s.1, %c.4)
  %cv.1 = s32[16,8]{1,0} convert(%c.5)
  %bc.1 = f32[16,8]{1,0} bitcast-convert(%cv.1)
  ROOT %r.1 = f32[16,8]{1,0} negate(%bc.1)
}
''', {
        'constant.4': '{replicated}',
        'c.3': '{devices=[2,2]<=[4]}',
        'p0.1': '{devices=[2,2]<=[4]}',
        'constant.5': '{replicated}',
        'zb.1': '{devices=[2,2]<=[4]}',
        'gt.1': '{devices=[2,2]<=[4]}',
        's.1': '{devices=[2,2]<=[4]}',
        'constant.3': '{replicated}',
        'c.4': '{devices=[2,2]<=[4]}',
        'c.5': '{devices=[2,2]<=[4]}',
        'cv.1': '{devices=[2,2]<=[4]}',
        'bc.1': '{devices=[2,2]<=[4]}',
        'r.1': None,
    }),
    'conflicting_users': (8, '''
HloModule conflicting_users
ENTRY %main.1 (p0.1: f32[16,32]) -> (f32[16,32], f32[16,32]) {
  %p0.1 = f32[16,32]{1,0} parameter(0)
  %n.1 = f32[16,32]{1,0} negate(%p0.1)
  %a.1 = f32[16,32]{1,0} exponential(%n.1), sharding={devices=[8,1]<=[8]}
  %b.1 = f32[16,32]{1,0} log(%n.1), sharding={devices=[1,8]<=[8]}
  ROOT %tuple.1 = (f32[16,32]{1,0}, f32[16,32]{1,0}) tuple(%a.1, %b.1)
}
''', {
        'p0.1': None,
        'n.1': '{devices=[8,1]<=[8]}',
        'a.1': '{devices=[8,1]<=[8]}',
        'b.1': '{devices=[1,8]<=[8]}',
        'tuple.1': None,
    }),
    'conflicting_operands': (8, '''
HloModule conflicting_operands
ENTRY %main.1 (p0.1: f32[16,32], p1.1: f32[16,32]) -> f32[16,32] {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %p1.1 = f32[16,32]{1,0} parameter(1), sharding={devices=[1,8]<=[8]}
  %a.1 = f32[16,32]{1,0} add(%p0.1, %p1.1)
  ROOT %n.1 = f32[16,32]{1,0} negate(%a.1)
}
''', {
        'p0.1': '{devices=[8,1]<=[8]}',
        'p1.1': '{devices=[1,8]<=[8]}',
        'a.1': '{devices=[8,1]<=[8]}',
        'n.1': None,
    }),
    'partial_dims_combine': (8, '''
HloModule partial_dims_combine
ENTRY %main.1 (p0.1: f32[16,32,8], p1.1: f32[16,32,8], p2.1: f32[16,32,8]) -> f32[16,32,8] {
  %p0.1 = f32[16,32,8]{2,1,0} parameter(0), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
  %p1.1 = f32[16,32,8]{2,1,0} parameter(1), sharding={devices=[1,2,1,4]<=[8] last_tile_dim_replicate}
  %a.1 = f32[16,32,8]{2,1,0} add(%p0.1, %p1.1)
  %p2.1 = f32[16,32,8]{2,1,0} parameter(2), sharding={devices=[1,1,2,4]<=[8] last_tile_dim_replicate}
  %b.1 = f32[16,32,8]{2,1,0} add(%a.1, %p2.1)
  ROOT %n.1 = f32[16,32,8]{2,1,0} negate(%b.1)
}
''', {
        'p0.1': '{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}',
        'p1.1': '{devices=[1,2,1,4]<=[8] last_tile_dim_replicate}',
        'a.1': '{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}',
        'p2.1': '{devices=[1,1,2,4]<=[8] last_tile_dim_replicate}',
        'b.1': '{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}',
        'n.1': None,
    }),
    'uneven_reshape': (4, '''
HloModule uneven_reshape
ENTRY %main.1 (p0.1: f32[10,7]) -> (f32[70], f32[7,10], f32[5,2,7]) {
  %p0.1 = f32[10,7]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %r.1 = f32[70]{0} reshape(%p0.1)
  %t.1 = f32[7,10]{0,1} transpose(%p0.1), dimensions={1,0}
  %r2.1 = f32[5,2,7]{2,1,0} reshape(%p0.1)
  ROOT %tuple.1 = (f32[70]{0}, f32[7,10]{0,1}, f32[5,2,7]{2,1,0}) tuple(%r.1, %t.1, %r2.1)
}
''', {
        'p0.1': '{devices=[4,1]<=[4]}',
        'r.1': '{replicated}',
        't.1': '{devices=[1,4]<=[4]}',
        'r2.1': '{replicated}',
        'tuple.1': None,
    }),
    'reshape_backward': (8, '''
HloModule reshape_backward
ENTRY %main.1 (p0.1: f32[4,8,32], p1.1: f32[64,16]) -> (f32[32,32], f32[8,8,16]) {
  %p0.1 = f32[4,8,32]{2,1,0} parameter(0)
  %r.1 = f32[32,32]{1,0} reshape(%p0.1)
  %n.1 = f32[32,32]{1,0} negate(%r.1), sharding={devices=[8,1]<=[8]}
  %p1.1 = f32[64,16]{1,0} parameter(1)
  %r1.1 = f32[8,8,16]{2,1,0} reshape(%p1.1)
  %n1.1 = f32[8,8,16]{2,1,0} negate(%r1.1), sharding={devices=[2,4,1]<=[8]}
  ROOT %tuple.1 = (f32[32,32]{1,0}, f32[8,8,16]{2,1,0}) tuple(%n.1, %n1.1)
}
''', {
        'p0.1': None,
        'r.1': '{devices=[8,1]<=[8]}',
        'n.1': '{devices=[8,1]<=[8]}',
        'p1.1': None,
        'r1.1': '{devices=[2,4,1]<=[8]}',
        'n1.1': '{devices=[2,4,1]<=[8]}',
        'tuple.1': None,
    }),
    'transpose_subgroup': (8, '''
HloModule transpose_subgroup
ENTRY %main.1 (p0.1: f32[16,32,8]) -> f32[8,16,32] {
  %p0.1 = f32[16,32,8]{2,1,0} parameter(0), sharding={devices=[2,1,2,2]<=[8] last_tile_dim_replicate}
  %t.1 = f32[8,16,32]{0,2,1} transpose(%p0.1), dimensions={2,0,1}
  ROOT %n.1 = f32[8,16,32]{0,2,1} negate(%t.1)
}
''', {
        'p0.1': '{devices=[2,1,2,2]<=[8] last_tile_dim_replicate}',
        't.1': '{devices=[2,2,1,2]<=[2,2,2]T(1,0,2) last_tile_dim_replicate}',
        'n.1': None,
    }),
    'broadcast_partial': (8, '''
HloModule broadcast_partial
ENTRY %main.1 (p0.1: f32[16]) -> f32[16,32] {
  %p0.1 = f32[16]{0} parameter(0), sharding={devices=[2,4]<=[8] last_tile_dim_replicate}
  %b.1 = f32[16,32]{1,0} broadcast(%p0.1), dimensions={0}
  ROOT %n.1 = f32[16,32]{1,0} negate(%b.1)
}
''', {
        'p0.1': '{devices=[2,4]<=[8] last_tile_dim_replicate}',
        'b.1': '{devices=[2,1,4]<=[8] last_tile_dim_replicate}',
        'n.1': None,
    }),
    'bcast_backward_partial': (8, '''
HloModule bcast_backward_partial
ENTRY %main.1 (p0.1: f32[32]) -> f32[16,32] {
  %p0.1 = f32[32]{0} parameter(0)
  %b.1 = f32[16,32]{1,0} broadcast(%p0.1), dimensions={1}
  %n.1 = f32[16,32]{1,0} negate(%b.1), sharding={devices=[2,4]<=[8]}
  %tuple.1 = (f32[16,32]{1,0}) tuple(%n.1), sharding={{devices=[2,4]<=[8]}}
  ROOT %get-tuple-element.1 = f32[16,32]{1,0} get-tuple-element(%tuple.1), index=0, sharding={devices=[2,4]<=[8]}
}
''', {
        'p0.1': None,
        'b.1': '{devices=[2,4]<=[8]}',
        'n.1': '{devices=[2,4]<=[8]}',
        'tuple.1': '{{devices=[2,4]<=[8]}}',
        'get-tuple-element.1': '{devices=[2,4]<=[8]}',
    }),
    'reduce_partial': (8, '''
HloModule reduce_partial
%region_0.1 (r.2: f32[], r.3: f32[]) -> f32[] {
  %r.2 = f32[] parameter(0)
  %r.3 = f32[] parameter(1)
  ROOT %s.1 = f32[] add(%r.2, %r.3)
}
ENTRY %main.2 (p0.1: f32[16,32,4]) -> f32[16,4] {
  %p0.1 = f32[16,32,4]{2,1,0} parameter(0), sharding={devices=[2,2,1,2]<=[8] last_tile_dim_replicate}
  %constant.1 = f32[] constant(0)
  %r.5 = f32[16,4]{1,0} reduce(%p0.1, %constant.1), dimensions={1}, to_apply=%region_0.1
  ROOT %n.1 = f32[16,4]{1,0} negate(%r.5)
}
''', {
        'r.2': None,
        'r.3': None,
        's.1': None,
        'p0.1': '{devices=[2,2,1,2]<=[8] last_tile_dim_replicate}',
        'constant.1': None,
        'r.5': '{devices=[2,1,4]<=[8] last_tile_dim_replicate}',
        'n.1': None,
    }),
    'reduce_backward': (8, '''
HloModule reduce_backward
%region_0.1 (r.2: f32[], r.3: f32[]) -> f32[] {
  %r.2 = f32[] parameter(0)
  %r.3 = f32[] parameter(1)
  ROOT %s.1 = f32[] add(%r.2, %r.3)
}
ENTRY %main.2 (p0.1: f32[16,32,4]) -> f32[16,4] {
  %p0.1 = f32[16,32,4]{2,1,0} parameter(0)
  %constant.1 = f32[] constant(0)
  %r.5 = f32[16,4]{1,0} reduce(%p0.1, %constant.1), dimensions={1}, to_apply=%region_0.1
  %n.1 = f32[16,4]{1,0} negate(%r.5), sharding={devices=[2,4]<=[8]}
  %tuple.1 = (f32[16,4]{1,0}) tuple(%n.1), sharding={{devices=[2,4]<=[8]}}
  ROOT %get-tuple-element.1 = f32[16,4]{1,0} get-tuple-element(%tuple.1), index=0, sharding={devices=[2,4]<=[8]}
}
''', {
        'r.2': None,
        'r.3': None,
        's.1': None,
        'p0.1': None,
        'constant.1': None,
        'r.5': '{devices=[2,4]<=[8]}',
        'n.1': '{devices=[2,4]<=[8]}',
        'tuple.1': '{{devices=[2,4]<=[8]}}',
        'get-tuple-element.1': '{devices=[2,4]<=[8]}',
    }),
    'nested_while': (4, '''
HloModule nested_while
%region_1.1 (arg_tuple.2: (s32[], f32[16,8])) -> (s32[], f32[16,8]) {
  %arg_tuple.2 = (s32[], f32[16,8]{1,0}) parameter(0)
  %get-tuple-element.4 = s32[] get-tuple-element(%arg_tuple.2), index=0
  %constant.4 = s32[] constant(1)
  %i2.2 = s32[] add(%get-tuple-element.4, %constant.4)
  %get-tuple-element.5 = f32[16,8]{1,0} get-tuple-element(%arg_tuple.2), index=1
  %e.1 = f32[16,8]{1,0} exponential(%get-tuple-element.5)
  ROOT %tuple.1 = (s32[], f32[16,8]{1,0}) tuple(%i2.2, %e.1)
}
%region_2.2 (arg_tuple.4: (s32[], f32[16,8])) -> pred[] {
  %arg_tuple.4 = (s32[], f32[16,8]{1,0}) parameter(0)
  %get-tuple-element.9 = f32[16,8]{1,0} get-tuple-element(%arg_tuple.4), index=1
  %get-tuple-element.8 = s32[] get-tuple-element(%arg_tuple.4), index=0
  %constant.6 = s32[] constant(3)
  ROOT %l.1 = pred[] compare(%get-tuple-element.8, %constant.6), direction=LT
}
%region_0.3 (arg_tuple.5: (s32[], f32[16,8])) -> (s32[], f32[16,8]) {
  %constant.7 = s32[] constant(0)
  %arg_tuple.5 = (s32[], f32[16,8]{1,0}) parameter(0)
  %get-tuple-element.11 = f32[16,8]{1,0} get-tuple-element(%arg_tuple.5), index=1
  %wi.4 = (s32[], f32[16,8]{1,0}) tuple(%constant.7, %get-tuple-element.11)
  %wi.5 = (s32[], f32[16,8]{1,0}) while(%wi.4), condition=%region_2.2, body=%region_1.1
  %wi.6 = s32[] get-tuple-element(%wi.5), index=0
  %get-tuple-element.10 = s32[] get-tuple-element(%arg_tuple.5), index=0
  %constant.8 = s32[] constant(1)
  %i2.3 = s32[] add(%get-tuple-element.10, %constant.8)
  %wi.7 = f32[16,8]{1,0} get-tuple-element(%wi.5), index=1
  ROOT %tuple.3 = (s32[], f32[16,8]{1,0}) tuple(%i2.3, %wi.7)
}
%region_3.4 (arg_tuple.7: (s32[], f32[16,8])) -> pred[] {
  %arg_tuple.7 = (s32[], f32[16,8]{1,0}) parameter(0)
  %get-tuple-element.15 = f32[16,8]{1,0} get-tuple-element(%arg_tuple.7), index=1
  %get-tuple-element.14 = s32[] get-tuple-element(%arg_tuple.7), index=0
  %constant.10 = s32[] constant(4)
  ROOT %l.3 = pred[] compare(%get-tuple-element.14, %constant.10), direction=LT
}
ENTRY %main.5 (x.1: f32[16,8]) -> f32[16,8] {
  %constant.11 = s32[] constant(0)
  %x.1 = f32[16,8]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %wl.4 = (s32[], f32[16,8]{1,0}) tuple(%constant.11, %x.1)
  %wl.5 = (s32[], f32[16,8]{1,0}) while(%wl.4), condition=%region_3.4, body=%region_0.3
  %wl.6 = s32[] get-tuple-element(%wl.5), index=0
  ROOT %wl.7 = f32[16,8]{1,0} get-tuple-element(%wl.5), index=1
}
''', {
        'arg_tuple.2': '{{replicated}, {devices=[4,1]<=[4]}}',
        'get-tuple-element.4': '{replicated}',
        'constant.4': '{replicated}',
        'i2.2': '{replicated}',
        'get-tuple-element.5': '{devices=[4,1]<=[4]}',
        'e.1': '{devices=[4,1]<=[4]}',
        'tuple.1': '{{replicated}, {devices=[4,1]<=[4]}}',
        'arg_tuple.4': '{{replicated}, {devices=[4,1]<=[4]}}',
        'get-tuple-element.9': '{devices=[4,1]<=[4]}',
        'get-tuple-element.8': '{replicated}',
        'constant.6': '{replicated}',
        'l.1': '{replicated}',
        'constant.7': '{replicated}',
        'arg_tuple.5': '{{replicated}, {devices=[4,1]<=[4]}}',
        'get-tuple-element.11': '{devices=[4,1]<=[4]}',
        'wi.4': '{{replicated}, {devices=[4,1]<=[4]}}',
        'wi.5': '{{replicated}, {devices=[4,1]<=[4]}}',
        'wi.6': '{replicated}',
        'get-tuple-element.10': '{replicated}',
        'constant.8': '{replicated}',
        'i2.3': '{replicated}',
        'wi.7': '{devices=[4,1]<=[4]}',
        'tuple.3': '{{replicated}, {devices=[4,1]<=[4]}}',
        'arg_tuple.7': '{{replicated}, {devices=[4,1]<=[4]}}',
        'get-tuple-element.15': '{devices=[4,1]<=[4]}',
        'get-tuple-element.14': '{replicated}',
        'constant.10': '{replicated}',
        'l.3': '{replicated}',
        'constant.11': '{replicated}',
        'x.1': '{devices=[4,1]<=[4]}',
        'wl.4': '{{replicated}, {devices=[4,1]<=[4]}}',
        'wl.5': '{{replicated}, {devices=[4,1]<=[4]}}',
        'wl.6': '{replicated}',
        'wl.7': None,
    }),
    'while_backward': (4, '''
HloModule while_backward
%region_0.1 (arg_tuple.1: (s32[], f32[16,8])) -> (s32[], f32[16,8]) {
  %arg_tuple.1 = (s32[], f32[16,8]{1,0}) parameter(0)
  %get-tuple-element.2 = s32[] get-tuple-element(%arg_tuple.1), index=0
  %constant.2 = s32[] constant(1)
  %i2.1 = s32[] add(%get-tuple-element.2, %constant.2)
  %get-tuple-element.3 = f32[16,8]{1,0} get-tuple-element(%arg_tuple.1), index=1
  %e.1 = f32[16,8]{1,0} exponential(%get-tuple-element.3)
  ROOT %tuple.1 = (s32[], f32[16,8]{1,0}) tuple(%i2.1, %e.1)
}
%region_1.2 (arg_tuple.3: (s32[], f32[16,8])) -> pred[] {
  %arg_tuple.3 = (s32[], f32[16,8]{1,0}) parameter(0)
  %get-tuple-element.7 = f32[16,8]{1,0} get-tuple-element(%arg_tuple.3), index=1
  %get-tuple-element.6 = s32[] get-tuple-element(%arg_tuple.3), index=0
  %constant.4 = s32[] constant(4)
  ROOT %l.1 = pred[] compare(%get-tuple-element.6, %constant.4), direction=LT
}
ENTRY %main.3 (x.1: f32[16,8]) -> f32[16,8] {
  %constant.5 = s32[] constant(0)
  %x.1 = f32[16,8]{1,0} parameter(0)
  %wl.4 = (s32[], f32[16,8]{1,0}) tuple(%constant.5, %x.1)
  %wl.5 = (s32[], f32[16,8]{1,0}) while(%wl.4), condition=%region_1.2, body=%region_0.1
  %wl.6 = s32[] get-tuple-element(%wl.5), index=0
  %wl.7 = f32[16,8]{1,0} get-tuple-element(%wl.5), index=1
  %r.1 = f32[16,8]{1,0} negate(%wl.7), sharding={devices=[4,1]<=[4]}
  %tuple.3 = (f32[16,8]{1,0}) tuple(%r.1), sharding={{devices=[4,1]<=[4]}}
  ROOT %get-tuple-element.9 = f32[16,8]{1,0} get-tuple-element(%tuple.3), index=0, sharding={devices=[4,1]<=[4]}
}
''', {
        'arg_tuple.1': '{{replicated}, {devices=[4,1]<=[4]}}',
        'get-tuple-element.2': '{replicated}',
        'constant.2': '{replicated}',
        'i2.1': '{replicated}',
        'get-tuple-element.3': '{devices=[4,1]<=[4]}',
        'e.1': '{devices=[4,1]<=[4]}',
        'tuple.1': '{{replicated}, {devices=[4,1]<=[4]}}',
        'arg_tuple.3': '{{replicated}, {devices=[4,1]<=[4]}}',
        'get-tuple-element.7': '{devices=[4,1]<=[4]}',
        'get-tuple-element.6': '{replicated}',
        'constant.4': '{replicated}',
        'l.1': '{replicated}',
        'constant.5': '{replicated}',
        'x.1': None,
        'wl.4': '{{replicated}, {devices=[4,1]<=[4]}}',
        'wl.5': '{{replicated}, {devices=[4,1]<=[4]}}',
        'wl.6': '{replicated}',
        'wl.7': '{devices=[4,1]<=[4]}',
        'r.1': '{devices=[4,1]<=[4]}',
        'tuple.3': '{{devices=[4,1]<=[4]}}',
        'get-tuple-element.9': '{devices=[4,1]<=[4]}',
    }),
    'while_body_annot': (4, '''
HloModule while_body_annot
%region_0.1 (arg_tuple.1: (s32[], f32[16,8])) -> (s32[], f32[16,8]) {
  %arg_tuple.1 = (s32[], f32[16,8]{1,0}) parameter(0)
  %get-tuple-element.2 = s32[] get-tuple-element(%arg_tuple.1), index=0
  %constant.2 = s32[] constant(1)
  %i2.1 = s32[] add(%get-tuple-element.2, %constant.2)
  %get-tuple-element.3 = f32[16,8]{1,0} get-tuple-element(%arg_tuple.1), index=1
  %e.1 = f32[16,8]{1,0} exponential(%get-tuple-element.3), sharding={devices=[1,4]<=[4]}
  ROOT %tuple.1 = (s32[], f32[16,8]{1,0}) tuple(%i2.1, %e.1)
}
%region_1.2 (arg_tuple.3: (s32[], f32[16,8])) -> pred[] {
  %arg_tuple.3 = (s32[], f32[16,8]{1,0}) parameter(0)
  %get-tuple-element.7 = f32[16,8]{1,0} get-tuple-element(%arg_tuple.3), index=1
  %get-tuple-element.6 = s32[] get-tuple-element(%arg_tuple.3), index=0
  %constant.4 = s32[] constant(4)
  ROOT %l.1 = pred[] compare(%get-tuple-element.6, %constant.4), direction=LT
}
ENTRY %main.3 (x.1: f32[16,8]) -> f32[16,8] {
  %constant.5 = s32[] constant(0)
  %x.1 = f32[16,8]{1,0} parameter(0)
  %wl.4 = (s32[], f32[16,8]{1,0}) tuple(%constant.5, %x.1)
  %wl.5 = (s32[], f32[16,8]{1,0}) while(%wl.4), condition=%region_1.2, body=%region_0.1
  %wl.6 = s32[] get-tuple-element(%wl.5), index=0
  ROOT %wl.7 = f32[16,8]{1,0} get-tuple-element(%wl.5), index=1
}
''', {
        'arg_tuple.1': '{{replicated}, {devices=[1,4]<=[4]}}',
        'get-tuple-element.2': '{replicated}',
        'constant.2': '{replicated}',
        'i2.1': '{replicated}',
        'get-tuple-element.3': '{devices=[1,4]<=[4]}',
        'e.1': '{devices=[1,4]<=[4]}',
        'tuple.1': '{{replicated}, {devices=[1,4]<=[4]}}',
        'arg_tuple.3': '{{replicated}, {devices=[1,4]<=[4]}}',
        'get-tuple-element.7': '{devices=[1,4]<=[4]}',
        'get-tuple-element.6': '{replicated}',
        'constant.4': '{replicated}',
        'l.1': '{replicated}',
        'constant.5': '{replicated}',
        'x.1': None,
        'wl.4': '{{replicated}, {devices=[1,4]<=[4]}}',
        'wl.5': '{{replicated}, {devices=[1,4]<=[4]}}',
        'wl.6': '{replicated}',
        'wl.7': None,
    }),
    'cond_tuple_ops': (4, '''
HloModule cond_tuple_ops
%region_0.1 (x.0: (f32[16,8])) -> (f32[16,8]) {
  %x.0 = (f32[16,8]{1,0}) parameter(0)
  %get-tuple-element = f32[16,8]{1,0} get-tuple-element(%x.0), index=0
  %e.1 = f32[16,8]{1,0} exponential(%get-tuple-element)
  ROOT %tuple.0 = (f32[16,8]{1,0}) tuple(%e.1)
}
%region_1.2 (y.0: (f32[8])) -> (f32[16,8]) {
  %y.0 = (f32[8]{0}) parameter(0)
  %get-tuple-element.1 = f32[8]{0} get-tuple-element(%y.0), index=0
  %bb.1 = f32[16,8]{1,0} broadcast(%get-tuple-element.1), dimensions={1}
  ROOT %tuple.1 = (f32[16,8]{1,0}) tuple(%bb.1)
}
ENTRY %main.3 (p.1: s32[], x.3: f32[16,8], y.3: f32[8]) -> f32[16,8] {
  %p.1 = s32[] parameter(0)
  %x.3 = f32[16,8]{1,0} parameter(1), sharding={devices=[4,1]<=[4]}
  %tuple.2 = (f32[16,8]{1,0}) tuple(%x.3)
  %y.3 = f32[8]{0} parameter(2)
  %tuple.3 = (f32[8]{0}) tuple(%y.3)
  %c.1.clone = (f32[16,8]{1,0}) conditional(%p.1, %tuple.2, %tuple.3), branch_computations={%region_0.1, %region_1.2}
  %get-tuple-element.2 = f32[16,8]{1,0} get-tuple-element(%c.1.clone), index=0
  ROOT %n.1 = f32[16,8]{1,0} negate(%get-tuple-element.2)
}
''', {
        'x.0': '{{devices=[4,1]<=[4]}}',
        'get-tuple-element': '{devices=[4,1]<=[4]}',
        'e.1': '{devices=[4,1]<=[4]}',
        'tuple.0': '{{devices=[4,1]<=[4]}}',
        'y.0': '{{replicated}}',
        'get-tuple-element.1': '{replicated}',
        'bb.1': '{devices=[4,1]<=[4]}',
        'tuple.1': '{{devices=[4,1]<=[4]}}',
        'p.1': None,
        'x.3': '{devices=[4,1]<=[4]}',
        'tuple.2': '{{devices=[4,1]<=[4]}}',
        'y.3': None,
        'tuple.3': '{{replicated}}',
        'c.1.clone': '{{devices=[4,1]<=[4]}}',
        'get-tuple-element.2': '{devices=[4,1]<=[4]}',
        'n.1': None,
    }),
    'subgroup_manual': (8, '''
HloModule subgroup_manual
%region_0.1 (r.2: f32[], r.3: f32[]) -> f32[] {
  %r.2 = f32[] parameter(0)
  %r.3 = f32[] parameter(1)
  ROOT %s.2 = f32[] add(%r.2, %r.3)
}
ENTRY %main.2 (p0.1: f32[16,8]) -> f32[16,8] {
  %p0.1 = f32[16,8]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}
  %s.3 = f32[16,8]{1,0} custom-call(%p0.1), custom_call_target="Sharding", sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}, backend_config="unspecified_dims=[0]"
  %f.1 = f32[16,2]{1,0} custom-call(%s.3), custom_call_target="SPMDFullToShardShape", sharding={devices=[1,1,4,2]<=[2,4]T(1,0) last_tile_dims={manual, replicated}}, backend_config="unspecified_dims=[0]"
  %e.1 = f32[16,2]{1,0} exponential(%f.1)
  %constant.1 = f32[] constant(0)
  %r.5 = f32[16]{0} reduce(%e.1, %constant.1), dimensions={1}, to_apply=%region_0.1
  %rs.1 = f32[16,1]{1,0} reshape(%r.5)
  %b.3 = f32[16,1]{1,0} broadcast(%rs.1), dimensions={0,1}
  %b.4 = f32[16]{0} reshape(%b.3)
  %b.5 = f32[16,2]{1,0} broadcast(%b.4), dimensions={0}
  %d.1 = f32[16,2]{1,0} divide(%e.1, %b.5)
  %sc.1 = f32[16,2]{1,0} custom-call(%d.1), custom_call_target="Sharding", sharding={devices=[1,1,4,2]<=[2,4]T(1,0) last_tile_dims={manual, replicated}}, backend_config="unspecified_dims=[0]"
  %t.1 = f32[16,8]{1,0} custom-call(%sc.1), custom_call_target="SPMDShardToFullShape", sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}, backend_config="unspecified_dims=[0]"
  ROOT %n.1 = f32[16,8]{1,0} negate(%t.1)
}
''', {
        'r.2': None,
        'r.3': None,
        's.2': None,
        'p0.1': '{devices=[2,4]<=[8]}',
        's.3': '{devices=[2,4]<=[8]}',
        'f.1': '{devices=[2,1,4]<=[8] last_tile_dims={manual}}',
        'e.1': '{devices=[2,1,4]<=[8] last_tile_dims={manual}}',
        'constant.1': None,
        'r.5': '{devices=[2,4]<=[8] last_tile_dims={manual}}',
        'rs.1': '{devices=[2,1,4]<=[8] last_tile_dims={manual}}',
        'b.3': '{devices=[2,1,4]<=[8] last_tile_dims={manual}}',
        'b.4': '{devices=[2,4]<=[8] last_tile_dims={manual}}',
        'b.5': '{devices=[2,1,4]<=[8] last_tile_dims={manual}}',
        'd.1': '{devices=[2,1,4]<=[8] last_tile_dims={manual}}',
        'sc.1': '{devices=[2,1,4]<=[8] last_tile_dims={manual}}',
        't.1': '{devices=[2,4]<=[8]}',
        'n.1': None,
    }),
    'gather_batching_dims': (4, '''
HloModule gather_batching_dims
ENTRY %main.1 (op.1: f32[4,16,8], idx.1: s32[4,3,1]) -> f32[4,3,8] {
  %op.1 = f32[4,16,8]{2,1,0} parameter(0), sharding={devices=[4,1,1]<=[4]}
  %idx.1 = s32[4,3,1]{2,1,0} parameter(1)
  %g.1 = f32[4,3,8]{2,1,0} gather(%op.1, %idx.1), offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1,8}
  ROOT %n.1 = f32[4,3,8]{2,1,0} negate(%g.1)
}
''', {
        'op.1': '{devices=[4,1,1]<=[4]}',
        'idx.1': None,
        'g.1': '{devices=[4,1,1]<=[4]}',
        'n.1': None,
    }),
    'scatter_iota': (4, '''
HloModule scatter_iota
%region_0.1 (s.3: f32[], s.4: f32[]) -> f32[] {
  %s.3 = f32[] parameter(0)
  %s.4 = f32[] parameter(1)
  ROOT %s.5 = f32[] add(%s.3, %s.4)
}
ENTRY %main.2 (buf.1: f32[8,16], idx.1: s32[8,1], upd.1: f32[8]) -> f32[8,16] {
  %buf.1 = f32[8,16]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %io.2 = s32[8]{0} iota(), iota_dimension=0
  %io.3 = s32[8,1]{1,0} reshape(%io.2)
  %idx.1 = s32[8,1]{1,0} parameter(1)
  %ci.1 = s32[8,2]{1,0} concatenate(%io.3, %idx.1), dimensions={1}
  %upd.1 = f32[8]{0} parameter(2)
  %s.7 = f32[8,16]{1,0} scatter(%buf.1, %ci.1, %upd.1), update_window_dims={}, inserted_window_dims={0,1}, scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, to_apply=%region_0.1
  ROOT %n.1 = f32[8,16]{1,0} negate(%s.7)
}
''', {
        's.3': None,
        's.4': None,
        's.5': None,
        'buf.1': '{devices=[4,1]<=[4]}',
        'io.2': None,
        'io.3': None,
        'idx.1': None,
        'ci.1': None,
        'upd.1': None,
        's.7': '{devices=[4,1]<=[4]}',
        'n.1': None,
    }),
    'dot_partial_merge_out': (8, '''
HloModule dot_partial_merge_out
ENTRY %main.1 (p0.1: f32[8,16,32], p1.1: f32[8,32,64]) -> f32[8,16,64] {
  %p0.1 = f32[8,16,32]{2,1,0} parameter(0), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
  %p1.1 = f32[8,32,64]{2,1,0} parameter(1), sharding={devices=[1,1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  %d.1 = f32[8,16,64]{2,1,0} dot(%p0.1, %p1.1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT %n.1 = f32[8,16,64]{2,1,0} negate(%d.1)
}
''', {
        'p0.1': '{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}',
        'p1.1': '{devices=[1,1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}',
        'd.1': '{devices=[2,1,4]<=[8]}',
        'n.1': None,
    }),
    'dot_operand_from_other': (8, '''
HloModule dot_operand_from_other
ENTRY %main.1 (p0.1: f32[16,32], p1.1: f32[32,64]) -> f32[16,64] {
  %p0.1 = f32[16,32]{1,0} parameter(0)
  %p1.1 = f32[32,64]{1,0} parameter(1), sharding={devices=[2,4]<=[8]}
  %d.1 = f32[16,64]{1,0} dot(%p0.1, %p1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %n.1 = f32[16,64]{1,0} negate(%d.1), sharding={devices=[2,4]<=[8]}
  %tuple.1 = (f32[16,64]{1,0}) tuple(%n.1), sharding={{devices=[2,4]<=[8]}}
  ROOT %get-tuple-element.1 = f32[16,64]{1,0} get-tuple-element(%tuple.1), index=0, sharding={devices=[2,4]<=[8]}
}
''', {
        'p0.1': None,
        'p1.1': '{devices=[2,4]<=[8]}',
        'd.1': '{devices=[2,4]<=[8]}',
        'n.1': '{devices=[2,4]<=[8]}',
        'tuple.1': '{{devices=[2,4]<=[8]}}',
        'get-tuple-element.1': '{devices=[2,4]<=[8]}',
    }),
    'einsum_moe_like': (8, '''
HloModule einsum_moe_like
ENTRY %main.1 (x.1: f32[8,16,32], w.1: f32[8,32,64]) -> f32[8,16,64] {
  %x.1 = f32[8,16,32]{2,1,0} parameter(0), sharding={devices=[8,1,1]<=[8]}
  %t.1 = f32[16,8,32]{2,0,1} transpose(%x.1), dimensions={1,0,2}
  %w.1 = f32[8,32,64]{2,1,0} parameter(1), sharding={devices=[8,1,1]<=[8]}
  %d.1 = f32[8,16,64]{2,1,0} dot(%t.1, %w.1), lhs_batch_dims={1}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT %n.1 = f32[8,16,64]{2,1,0} negate(%d.1)
}
''', {
        'x.1': '{devices=[8,1,1]<=[8]}',
        't.1': '{devices=[1,8,1]<=[8]}',
        'w.1': '{devices=[8,1,1]<=[8]}',
        'd.1': '{devices=[8,1,1]<=[8]}',
        'n.1': None,
    }),
    'concat_sharded_dim': (4, '''
HloModule concat_sharded_dim
ENTRY %main.1 (p0.1: f32[8,16], p1.1: f32[8,16]) -> f32[16,16] {
  %p0.1 = f32[8,16]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %p1.1 = f32[8,16]{1,0} parameter(1), sharding={devices=[4,1]<=[4]}
  %c.1 = f32[16,16]{1,0} concatenate(%p0.1, %p1.1), dimensions={0}
  ROOT %n.1 = f32[16,16]{1,0} negate(%c.1)
}
''', {
        'p0.1': '{devices=[4,1]<=[4]}',
        'p1.1': '{devices=[4,1]<=[4]}',
        'c.1': '{devices=[4,1]<=[4]}',
        'n.1': None,
    }),
    'pad_backward': (4, '''
HloModule pad_backward
ENTRY %main.1 (p0.1: f32[14,8]) -> f32[16,8] {
  %p0.1 = f32[14,8]{1,0} parameter(0)
  %constant.1 = f32[] constant(0)
  %pd.1 = f32[16,8]{1,0} pad(%p0.1, %constant.1), padding=1_1x0_0
  %n.1 = f32[16,8]{1,0} negate(%pd.1), sharding={devices=[4,1]<=[4]}
  %tuple.1 = (f32[16,8]{1,0}) tuple(%n.1), sharding={{devices=[4,1]<=[4]}}
  ROOT %get-tuple-element.1 = f32[16,8]{1,0} get-tuple-element(%tuple.1), index=0, sharding={devices=[4,1]<=[4]}
}
''', {
        'p0.1': None,
        'constant.1': None,
        'pd.1': '{devices=[4,1]<=[4]}',
        'n.1': '{devices=[4,1]<=[4]}',
        'tuple.1': '{{devices=[4,1]<=[4]}}',
        'get-tuple-element.1': '{devices=[4,1]<=[4]}',
    }),
    'dus_update_sharded': (4, '''
HloModule dus_update_sharded
ENTRY %main.1 (buf.1: f32[16,8], upd.1: f32[4,8], i.1: s32[]) -> f32[16,8] {
  %buf.1 = f32[16,8]{1,0} parameter(0)
  %upd.1 = f32[4,8]{1,0} parameter(1), sharding={devices=[1,4]<=[4]}
  %i.1 = s32[] parameter(2)
  %constant.1 = s32[] constant(0)
  %d.1 = f32[16,8]{1,0} dynamic-update-slice(%buf.1, %upd.1, %i.1, %constant.1)
  ROOT %n.1 = f32[16,8]{1,0} negate(%d.1)
}
''', {
        'buf.1': None,
        'upd.1': '{devices=[1,4]<=[4]}',
        'i.1': None,
        'constant.1': None,
        'd.1': '{devices=[1,4]<=[4]}',
        'n.1': None,
    }),
    'root_param_chain': (4, '''
HloModule root_param_chain
ENTRY %main.1 (p0.1: f32[16,8], p1.1: f32[16,8]) -> f32[16,8] {
  %p0.1 = f32[16,8]{1,0} parameter(0)
  %p1.1 = f32[16,8]{1,0} parameter(1), sharding={devices=[4,1]<=[4]}
  %a.1 = f32[16,8]{1,0} add(%p0.1, %p1.1)
  ROOT %r.1 = f32[16,8]{1,0} negate(%a.1)
}
''', {
        'p0.1': None,
        'p1.1': '{devices=[4,1]<=[4]}',
        'a.1': '{devices=[4,1]<=[4]}',
        'r.1': None,
    }),
    'shard_as_basic': (8, '''
HloModule shard_as_basic
ENTRY %main.1 (p0.1: f32[16,32], p1.1: f32[16,32]) -> (f32[16,32], f32[16,32]) {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %x.1 = f32[16,32]{1,0} exponential(%p0.1)
  %sx.1 = f32[16,32]{1,0} custom-call(%x.1), custom_call_target="Sharding", sharding={unknown shard_as 0}
  %p1.1 = f32[16,32]{1,0} parameter(1)
  %y.1 = f32[16,32]{1,0} log(%p1.1)
  %sy.1 = f32[16,32]{1,0} custom-call(%y.1), custom_call_target="Sharding", sharding={unknown shard_as 0}
  %a.1 = f32[16,32]{1,0} add(%sx.1, %sy.1)
  ROOT %tuple.1 = (f32[16,32]{1,0}, f32[16,32]{1,0}) tuple(%a.1, %sy.1)
}
''', {
        'p0.1': '{devices=[8,1]<=[8]}',
        'x.1': '{devices=[8,1]<=[8]}',
        'p1.1': None,
        'y.1': '{devices=[8,1]<=[8]}',
        'a.1': '{devices=[8,1]<=[8]}',
        'tuple.1': None,
    }),
    'shard_like_basic': (8, '''
HloModule shard_like_basic
ENTRY %main.1 (p0.1: f32[16,32], p1.1: f32[16,32]) -> (f32[16,32], f32[16,32]) {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}
  %x.1 = f32[16,32]{1,0} exponential(%p0.1)
  %sx.1 = f32[16,32]{1,0} custom-call(%x.1), custom_call_target="Sharding", sharding={unknown shard_like 1}
  %p1.1 = f32[16,32]{1,0} parameter(1)
  %y.1 = f32[16,32]{1,0} log(%p1.1)
  %sy.1 = f32[16,32]{1,0} custom-call(%y.1), custom_call_target="Sharding", sharding={unknown shard_like 1}
  %n.1 = f32[16,32]{1,0} negate(%sy.1)
  ROOT %tuple.1 = (f32[16,32]{1,0}, f32[16,32]{1,0}) tuple(%sx.1, %n.1)
}
''', {
        'p0.1': '{devices=[2,4]<=[8]}',
        'x.1': '{devices=[2,4]<=[8]}',
        'p1.1': None,
        'y.1': '{devices=[2,4]<=[8]}',
        'n.1': '{devices=[2,4]<=[8]}',
        'tuple.1': None,
    }),
    'shard_as_conflict': (8, '''
HloModule shard_as_conflict
ENTRY %main.1 (p0.1: f32[16,32], p1.1: f32[16,32]) -> f32[16,32] {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %x.1 = f32[16,32]{1,0} exponential(%p0.1)
  %sx.1 = f32[16,32]{1,0} custom-call(%x.1), custom_call_target="Sharding", sharding={unknown shard_as 2}
  %p1.1 = f32[16,32]{1,0} parameter(1), sharding={devices=[1,8]<=[8]}
  %y.1 = f32[16,32]{1,0} log(%p1.1)
  %sy.1 = f32[16,32]{1,0} custom-call(%y.1), custom_call_target="Sharding", sharding={unknown shard_as 2}
  ROOT %a.1 = f32[16,32]{1,0} add(%sx.1, %sy.1)
}
''', {
        'p0.1': '{devices=[8,1]<=[8]}',
        'x.1': '{devices=[1,8]<=[8]}',
        'p1.1': '{devices=[1,8]<=[8]}',
        'y.1': '{devices=[1,8]<=[8]}',
        'a.1': None,
    }),
}


@pytest.mark.parametrize("name", sorted(XLA_CASES))
def test_matches_xla(name):
    """Every instruction gets exactly the sharding XLA's propagation gives it."""
    _, text, expected = XLA_CASES[name]
    module = parse_module(text)
    propagate(module)
    got = {i.name: i for i in module.instructions()}
    diffs = []
    for inst_name, want_text in expected.items():
        inst = got[inst_name]
        want = _expected(want_text, inst.shape)
        if inst.sharding != want:
            diffs.append(f"{inst_name}: ours {inst.sharding}, XLA {want}")
    assert not diffs, "\n".join(diffs)


# -- single rules, readable -----------------------------------------------------------------

def test_topk_results_follow_the_operand_on_every_dim_but_the_last():
    """Not XLA's completion (it leaves top-k results unsharded, so its partitioner
    replicates them): the partitioner splits top-k (handlers/sort.py), so the values and
    indices of the ``topk`` op and of the ``TopK`` custom-call follow the operand on every
    dim but the last, where k of the whole dim are chosen."""
    for call in ('custom-call(%p0.1), custom_call_target="TopK"', "topk(%p0.1), k=4, largest=true"):
        insts, _ = _run(f"""HloModule topk
ENTRY %main.1 (p0.1: f32[16,32]) -> (f32[16,4], s32[16,4]) {{
  %p0.1 = f32[16,32]{{1,0}} parameter(0), sharding={{devices=[4,2]<=[8]}}
  %t.3 = (f32[16,4]{{1,0}}, s32[16,4]{{1,0}}) {call}
  %t.4 = f32[16,4]{{1,0}} get-tuple-element(%t.3), index=0
  %t.5 = s32[16,4]{{1,0}} get-tuple-element(%t.3), index=1
  ROOT %tuple.1 = (f32[16,4]{{1,0}}, s32[16,4]{{1,0}}) tuple(%t.4, %t.5)
}}""")
        rows = parse_sharding("{devices=[4,1,2]<=[8] last_tile_dim_replicate}")
        assert insts["t.3"].sharding == HloSharding.tuple([rows, rows])
        assert insts["t.4"].sharding == rows and insts["t.5"].sharding == rows


def test_topk_over_the_only_sharded_dim_stays_replicated():
    insts, _ = _run("""HloModule topk
ENTRY %main.1 (p0.1: f32[16,32]) -> (f32[16,4], s32[16,4]) {
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[1,4]<=[4]}
  %t.3 = (f32[16,4]{1,0}, s32[16,4]{1,0}) topk(%p0.1), k=4, largest=true
  %t.4 = f32[16,4]{1,0} get-tuple-element(%t.3), index=0
  %t.5 = s32[16,4]{1,0} get-tuple-element(%t.3), index=1
  ROOT %tuple.1 = (f32[16,4]{1,0}, s32[16,4]{1,0}) tuple(%t.4, %t.5)
}""")
    assert insts["t.3"].sharding == HloSharding.tuple([HloSharding.replicate()] * 2)



def _run(text: str, **kw):
    module = parse_module(text)
    result = propagate(module, **kw)
    return {i.name: i for i in module.instructions()}, result


def test_elementwise_forward_at_level_zero():
    insts, res = _run("""HloModule m
ENTRY e {
  p0 = f32[16,32] parameter(0), sharding={devices=[8,1]<=[8]}
  p1 = f32[16,32] parameter(1)
  a = f32[16,32] add(p0, p1)
  ROOT t = (f32[16,32]) tuple(a)
}""")
    assert str(insts["a"].sharding) == "{devices=[8,1]<=[8]}"
    d = res.decisions["a"]
    assert (d.rule, d.direction, d.sources, d.level) == ("elementwise.forward", "forward",
                                                          ("p0",), 0)


def test_broadcast_backward_needs_level_two_and_forward_level_three():
    insts, res = _run("""HloModule m
ENTRY e {
  p0 = f32[16] parameter(0), sharding={devices=[4]<=[4]}
  b = f32[16,8] broadcast(p0), dimensions={0}
  p1 = f32[8] parameter(1)
  b1 = f32[16,8] broadcast(p1), dimensions={1}
  m = f32[16,8] multiply(b, b1)
  ROOT t = (f32[16,8]) tuple(m)
}""")
    # b is sharded from its operand only at level 3; b1 then gets it backward from m.
    assert str(insts["b"].sharding) == "{devices=[4,1]<=[4]}"
    assert res.decisions["b"].level == 3
    assert res.decisions["b"].rule == "broadcast.forward"
    assert str(insts["b1"].sharding) == "{devices=[4,1]<=[4]}"


def test_dot_takes_larger_operand_first_and_records_the_loser():
    insts, res = _run("""HloModule m
ENTRY e {
  p0 = f32[64,32] parameter(0), sharding={devices=[8,1]<=[8]}
  p1 = f32[32,16] parameter(1), sharding={devices=[1,8]<=[8]}
  d = f32[64,16] dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (f32[64,16]) tuple(d)
}""")
    assert str(insts["d"].sharding) == "{devices=[8,1]<=[8]}"
    d = res.decisions["d"]
    assert d.rule == "dot.from_lhs" and d.sources == ("p0",)
    losers = [a for a in d.alternatives if a.rule == "dot.from_rhs"]
    assert losers and losers[0].reason.startswith("lower priority")
    assert str(losers[0].sharding) == "{devices=[1,8]<=[8]}"


def test_dot_merges_partial_operand_shardings():
    insts, res = _run("""HloModule m
ENTRY e {
  p0 = f32[16,32] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  p1 = f32[32,64] parameter(1), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  d = f32[16,64] dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (f32[16,64]) tuple(d)
}""")
    assert str(insts["d"].sharding) == "{devices=[2,4]<=[8]}"
    assert res.decisions["d"].rule.startswith("dot.merge")
    assert set(res.decisions["d"].sources) == {"p0", "p1"}


def test_reduce_drops_reduced_dims_and_replicates_them():
    insts, _ = _run("""HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  p0 = f32[16,32] parameter(0), sharding={devices=[2,4]<=[8]}
  z = f32[] constant(0)
  r = f32[16] reduce(p0, z), dimensions={1}, to_apply=add
  ROOT t = (f32[16]) tuple(r)
}""")
    assert str(insts["r"].sharding) == "{devices=[2,4]<=[8] last_tile_dim_replicate}"


def test_sharding_custom_call_shards_its_operand_and_is_kept():
    insts, res = _run("""HloModule m
ENTRY e {
  p0 = f32[16,32] parameter(0)
  x = f32[16,32] exponential(p0)
  s = f32[16,32] custom-call(x), custom_call_target="Sharding", sharding={devices=[1,8]<=[8]}
  ROOT t = (f32[16,32]) tuple(s)
}""")
    assert str(insts["x"].sharding) == "{devices=[1,8]<=[8]}"
    assert res.decisions["x"].rule == "sharding-custom-call.operand"
    assert str(insts["s"].sharding) == "{devices=[1,8]<=[8]}"


def test_open_dims_of_an_annotation_are_refined():
    insts, res = _run("""HloModule m
ENTRY e {
  p0 = f32[16,32] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  x = f32[16,32] exponential(p0)
  s = f32[16,32] custom-call(x), custom_call_target="Sharding", sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}, backend_config="unspecified_dims=[0]"
  ROOT t = (f32[16,32]) tuple(s)
}""")
    # Dim 1 stays as annotated (4 tiles); the open dim 0 picks up the operand's 2 tiles.
    assert str(insts["s"].sharding) == "{devices=[2,4]<=[8]}"
    assert res.decisions["s"].direction == "refine"


def test_manual_region_stays_manual():
    insts, _ = _run("""HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  p0 = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}
  f = f32[4,8] custom-call(p0), custom_call_target="SPMDFullToShardShape", sharding={manual}
  x = f32[4,8] exponential(f)
  ar = f32[4,8] all-reduce(x), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  g = f32[16,8] custom-call(ar), custom_call_target="SPMDShardToFullShape", sharding={devices=[4,1]<=[4]}
  y = f32[16,8] negate(g)
  ROOT t = (f32[16,8]) tuple(y)
}""")
    assert insts["x"].sharding.is_manual and insts["ar"].sharding.is_manual
    assert str(insts["y"].sharding) == "{devices=[4,1]<=[4]}"


def test_unknown_custom_call_is_a_barrier():
    insts, _ = _run("""HloModule m
ENTRY e {
  p0 = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}
  c = f32[16,8] custom-call(p0), custom_call_target="my_kernel"
  y = f32[16,8] negate(c)
  ROOT t = (f32[16,8]) tuple(y)
}""")
    assert insts["c"].sharding.is_replicated
    assert insts["y"].sharding.is_replicated


def test_every_opcode_has_a_forward_and_backward_rule():
    cov = rule_coverage()
    assert set(cov) == set(ALL_OPCODES)
    for op, (fwd, bwd) in cov.items():
        assert fwd and bwd, op
    assert cov["broadcast"][1].endswith("(level>=2)")
    assert cov["dot"] == ("dot", "dot (level>=1)")
    assert cov["add"][0].startswith("elementwise")


# -- sharding operations (property tests against the holder model) ----------------------------

def _devices(s: HloSharding) -> int:
    return s.tile_assignment.num_devices


@st.composite
def _even_shape(draw, s: HloSharding):
    return tuple(t * draw(st.integers(1, 3)) for t in s.tile_dims_for_data())


@SETTINGS
@given(st.data())
def test_transpose_with_collapsed_dims_inserts_and_drops_unit_dims(data):
    s = data.draw(tiled_shardings(max_rank=3, manual=False))
    assume(s.is_tiled)
    r = s.tiled_data_rank
    pos = data.draw(st.integers(0, r))
    src_to_tgt = [i if i < pos else i + 1 for i in range(r)]
    tgt_to_src = [-1 if j == pos else (j if j < pos else j - 1) for j in range(r + 1)]
    grown = ops.transpose_with_collapsed_dims(s, src_to_tgt, tgt_to_src)
    dims = data.draw(_even_shape(s))
    grown_dims = dims[:pos] + (1,) + dims[pos:]
    n = _devices(s)
    assert np.array_equal(holder_mask(grown, grown_dims, n).reshape((n,) + dims),
                          holder_mask(s, dims, n))
    back = ops.transpose_with_collapsed_dims(grown, tgt_to_src, src_to_tgt)
    assert back == s


@SETTINGS
@given(st.data())
def test_propagate_along_dims_is_a_transpose_for_full_permutations(data):
    s = data.draw(tiled_shardings(max_rank=3, manual=False))
    assume(s.is_tiled)
    r = s.tiled_data_rank
    perm = data.draw(st.permutations(list(range(r))))
    # Output dim perm[i] takes source dim i.
    moved = ops.propagate_along(s, list(range(r)), list(perm), r)
    inverse = [0] * r
    for i, p in enumerate(perm):
        inverse[p] = i
    assert moved == transpose_sharding(s, inverse)


def test_remove_shape_dims_and_find_common_sharding():
    s = parse_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
    assert str(ops.remove_shape_dims(s, [1])) == "{devices=[2,4]<=[8] last_tile_dim_replicate}"
    other = parse_sharding("{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}")
    assert ops.find_common_sharding([s, other]) == parse_sharding("{devices=[2,4]<=[8]}")
    clash = parse_sharding("{devices=[1,4,2]<=[8] last_tile_dim_replicate}")
    assert ops.find_common_sharding([s, clash]) == s
