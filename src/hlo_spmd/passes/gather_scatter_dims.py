"""One dims model for gather and scatter, shared by completion and partitioning (XLA's
hlo_sharding_util::GatherScatterDims and the Get*Dims helpers around it), as
dot_conv_dims is for dot and convolution.

Four kinds of dims tie a gather's operand, indices and output together (a scatter's
operand, indices and updates; its result is laid out like the operand):

* index pass-through: an indices batch dim and the output (updates) dim it becomes
  (``connected_index_dims``);
* operand window: every operand dim neither collapsed (inserted) nor a batching dim and
  the offset (update window) dim it becomes (``operand_window_dims``); those sliced whole
  are the operand pass-through dims (``operand_passthrough_dims``);
* explicit batching dims: operand, indices and output dims that move together
  (``explicit_batch_dims``); completion also finds implicit ones (an iota along an
  indices dim, propagation/gather_scatter.batch_parallel_dims);
* trivially sliced operand dims: indexed dims whose slice is one element.

``GSDims`` holds aligned lists of such dims (completion's rules propagate along them);
``GatherDims`` / ``ScatterDims`` read the same functions into maps and label every dim
with its role for the partitioner's device grids (handlers/gather_scatter.py).
"""
from __future__ import annotations

from typing import Sequence

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.records import Record

# A role: (kind, {array name: dim}). Arrays: "op" operand(s), "idx" indices, "upd" updates,
# "out" result. Kinds: "batch" (explicit batching dims), "par" (implicit batching dims: an
# iota along an indices dim indexes the operand dim, batch_parallel_dims), "pass" (operand
# pass-through), "index" (index pass-through), "triv" (trivially sliced operand dim).
Role = tuple[str, tuple[tuple[str, int], ...]]


class GSDims(Record):
    """GatherScatterDims: aligned operand / indices / output (or update) dims."""
    # A records.Record: equality and repr as the dataclass it was, ~1 ms less start-up.
    __match_args__ = ("operand", "indices", "output")
    __slots__ = __match_args__

    def __init__(self, operand: list[int] | None = None, indices: list[int] | None = None,
                 output: list[int] | None = None) -> None:
        self.operand = [] if operand is None else operand
        self.indices = [] if indices is None else indices
        self.output = [] if output is None else output

    def fill_output(self, index_vector_dim: int, offset_dims: Sequence[int]) -> None:
        """FillOutputDimsWithIndicesDims."""
        if not self.indices:
            return
        mapping: dict[int, int] = {}
        ind, out = 0, 0
        while ind <= max(self.indices):
            if ind == index_vector_dim:
                ind += 1
            while out in offset_dims:
                out += 1
            mapping[ind] = out
            ind += 1
            out += 1
        self.output = [mapping[i] for i in self.indices]

    def extend(self, other: "GSDims") -> None:
        self.operand += other.operand
        self.indices += other.indices
        self.output += other.output


def connected_index_dims(indices_rank: int, index_vector_dim: int, output_rank: int,
                         offset_dims: Sequence[int], excluded: Sequence[int] = ()) -> GSDims:
    """GetGatherConnectedDimsAcrossIndicesAndOutput."""
    res = GSDims()
    ind = 0
    for out in range(output_rank):
        if out in offset_dims:
            continue
        if ind == index_vector_dim:
            ind += 1
        if ind not in excluded:
            res.indices.append(ind)
            res.output.append(out)
        ind += 1
    return res


def operand_passthrough_dims(operand_dims: Sequence[int], collapsed: Sequence[int],
                             batching: Sequence[int], offset_dims: Sequence[int],
                             slice_sizes: Sequence[int]) -> GSDims:
    """GetGatherScatterOperandPassthroughDims: operand dims sliced whole into the output."""
    res = GSDims()
    skipped = 0
    for i, size in enumerate(operand_dims):
        if i in collapsed or i in batching:
            skipped += 1
            continue
        if slice_sizes[i] != size:
            continue
        res.operand.append(i)
        res.output.append(offset_dims[i - skipped])
    return res


def scatter_slice_sizes(operand_dims: Sequence[int], update_dims: Sequence[int],
                        inserted: Sequence[int], batching: Sequence[int],
                        window_dims: Sequence[int]) -> list[int]:
    """GetScatterSliceSize."""
    sizes = [1] * len(operand_dims)
    k = 0
    for i in range(len(operand_dims)):
        if i in inserted or i in batching:
            continue
        sizes[i] = update_dims[window_dims[k]]
        k += 1
    return sizes


def operand_window_dims(operand_rank: int, collapsed: Sequence[int], batching: Sequence[int],
                        offset_dims: Sequence[int]) -> GSDims:
    """Every operand window dim (neither collapsed / inserted nor batching) with the
    output offset (update window) dim it becomes."""
    window = [d for d in range(operand_rank) if d not in collapsed and d not in batching]
    return GSDims(window, [], list(offset_dims)[:len(window)])


def explicit_batch_dims(operand_batching: Sequence[int], indices_batching: Sequence[int],
                        index_vector_dim: int, offset_dims: Sequence[int]) -> GSDims | None:
    """The explicit batching dims with the output (updates) dims they become."""
    if not operand_batching:
        return None
    res = GSDims(list(operand_batching), list(indices_batching))
    res.fill_output(index_vector_dim, list(offset_dims))
    return res


class GatherDims:
    """A gather's dims as maps, and each dim's role for the partitioner's grids."""
    __slots__ = ("rank", "idx_rank", "out_rank", "ivd", "offset_of", "batch_out",
                 "batching", "index_map", "sizes", "parallel")

    def __init__(self, rank: int, idx_rank: int, out_rank: int, ivd: int,
                 offset_of: dict[int, int], batch_out: dict[int, int],
                 batching: dict[int, int], index_map: list[int], sizes: list[int]) -> None:
        self.rank = rank                  # operand rank
        self.idx_rank = idx_rank
        self.out_rank = out_rank
        self.ivd = ivd
        self.offset_of = offset_of        # operand window dim -> output offset dim
        self.batch_out = batch_out        # indices batch dim -> output batch dim
        self.batching = batching          # operand batching dim -> indices batching dim
        self.index_map = index_map        # start_index_map
        self.sizes = sizes
        self.parallel: dict[int, int] = {}  # implicit batching: operand dim -> indices dim

    @classmethod
    def of(cls, inst: Instruction) -> "GatherDims":
        g = inst.attrs.gather_dimension_numbers
        op, idx = inst.operands[0].shape, inst.operands[1].shape
        offset = list(g.offset_dims)
        win = operand_window_dims(op.rank, g.collapsed_slice_dims, g.operand_batching_dims,
                                  offset)
        conn = connected_index_dims(idx.rank, g.index_vector_dim, inst.shape.rank, offset)
        return cls(op.rank, idx.rank, inst.shape.rank, g.index_vector_dim,
                   dict(zip(win.operand, win.output)), dict(zip(conn.indices, conn.output)),
                   dict(zip(g.operand_batching_dims, g.start_indices_batching_dims)),
                   list(g.start_index_map), list(inst.attrs.gather_slice_sizes))

    def operand_labels(self, op_dims) -> list[Role | None]:
        idx_of_batch = self.batching
        window = sorted(self.offset_of)
        passthrough = set(operand_passthrough_dims(
            op_dims, [d for d in range(self.rank) if d not in self.offset_of
                      and d not in self.batching], list(self.batching),
            [self.offset_of[d] for d in window], self.sizes).operand)
        out = []
        for p in range(self.rank):
            if p in idx_of_batch:
                j = idx_of_batch[p]
                out.append(("batch", (("op", p), ("idx", j), ("out", self.batch_out[j]))))
            elif p in self.parallel:
                j = self.parallel[p]
                out.append(("par", (("op", p), ("idx", j), ("out", self.batch_out[j]))))
            elif p in passthrough:
                # An indexed dim sliced whole is a pass-through dim too: the gather clamps
                # its start to 0, globally and on every shard alike.
                out.append(("pass", (("op", p), ("out", self.offset_of[p]))))
            elif p in self.index_map and self.sizes[p] == 1:
                out.append(("triv", (("op", p),)))
            else:
                out.append(None)
        return out

    def index_labels(self) -> list[Role | None]:
        op_of = {j: p for p, j in self.batching.items()}
        par_of = {j: p for p, j in self.parallel.items()}
        out = []
        for j in range(self.idx_rank):
            if j == self.ivd:
                out.append(None)
            elif j in op_of:
                out.append(("batch", (("op", op_of[j]), ("idx", j), ("out", self.batch_out[j]))))
            elif j in par_of:
                out.append(("par", (("op", par_of[j]), ("idx", j), ("out", self.batch_out[j]))))
            else:
                out.append(("index", (("idx", j), ("out", self.batch_out[j]))))
        return out

    def output_labels(self, op_dims) -> list[Role | None]:
        by_out: dict[int, Role | None] = {}
        for lab in self.operand_labels(op_dims) + self.index_labels():
            if lab is not None and lab[0] != "triv":
                by_out[dict(lab[1])["out"]] = lab
        return [by_out.get(q) for q in range(self.out_rank)]


class ScatterDims:
    """A scatter's dims as maps, and each dim's role for the partitioner's grids."""
    __slots__ = ("rank", "idx_rank", "upd_rank", "ivd", "window_of", "scatter_upd",
                 "batching", "index_map", "parallel")

    def __init__(self, rank: int, idx_rank: int, upd_rank: int, ivd: int,
                 window_of: dict[int, int], scatter_upd: dict[int, int],
                 batching: dict[int, int], index_map: list[int]) -> None:
        self.rank = rank
        self.idx_rank = idx_rank
        self.upd_rank = upd_rank
        self.ivd = ivd
        self.window_of = window_of        # operand window dim -> updates window dim
        self.scatter_upd = scatter_upd    # indices batch dim -> updates scatter dim
        self.batching = batching          # operand batching dim -> indices batching dim
        self.index_map = index_map
        self.parallel: dict[int, int] = {}  # implicit batching: operand dim -> indices dim

    @classmethod
    def of(cls, inst: Instruction) -> "ScatterDims":
        n = len(inst.operands) // 2
        sd = inst.attrs.scatter_dimension_numbers
        op, idx, upd = (inst.operands[0].shape, inst.operands[n].shape,
                        inst.operands[n + 1].shape)
        uwd = list(sd.update_window_dims)
        win = operand_window_dims(op.rank, sd.inserted_window_dims, sd.input_batching_dims,
                                  uwd)
        conn = connected_index_dims(idx.rank, sd.index_vector_dim, upd.rank, uwd)
        return cls(op.rank, idx.rank, upd.rank, sd.index_vector_dim,
                   dict(zip(win.operand, win.output)), dict(zip(conn.indices, conn.output)),
                   dict(zip(sd.input_batching_dims, sd.scatter_indices_batching_dims)),
                   list(sd.scatter_dims_to_operand_dims))

    def operand_labels(self, op_dims, upd_dims) -> list[Role | None]:
        window = sorted(self.window_of)
        inserted = [d for d in range(self.rank)
                    if d not in self.window_of and d not in self.batching]
        uwd = [self.window_of[d] for d in window]
        sizes = scatter_slice_sizes(op_dims, upd_dims, inserted, list(self.batching), uwd)
        passthrough = set(operand_passthrough_dims(op_dims, inserted, list(self.batching),
                                                   uwd, sizes).operand)
        out = []
        for p in range(self.rank):
            if p in self.batching:
                j = self.batching[p]
                out.append(("batch", (("op", p), ("idx", j), ("upd", self.scatter_upd[j]),
                                      ("out", p))))
            elif p in self.parallel:
                j = self.parallel[p]
                out.append(("par", (("op", p), ("idx", j), ("upd", self.scatter_upd[j]),
                                    ("out", p))))
            elif p in passthrough:
                # An indexed dim with a whole-dim window too: only start 0 is in bounds,
                # globally and on every shard (the handler masks the others).
                out.append(("pass", (("op", p), ("upd", self.window_of[p]), ("out", p))))
            elif p in self.index_map and (p not in self.window_of
                                          or upd_dims[self.window_of[p]] == 1):
                out.append(("triv", (("op", p), ("out", p))))
            else:
                out.append(None)
        return out

    def index_labels(self, combinable: bool) -> list[Role | None]:
        op_of = {j: p for p, j in self.batching.items()}
        par_of = {j: p for p, j in self.parallel.items()}
        out = []
        for j in range(self.idx_rank):
            if j == self.ivd:
                out.append(None)
            elif j in op_of:
                p = op_of[j]
                out.append(("batch", (("op", p), ("idx", j), ("upd", self.scatter_upd[j]),
                                      ("out", p))))
            elif j in par_of:
                p = par_of[j]
                out.append(("par", (("op", p), ("idx", j), ("upd", self.scatter_upd[j]),
                                    ("out", p))))
            elif combinable:
                out.append(("index", (("idx", j), ("upd", self.scatter_upd[j]))))
            else:
                out.append(None)
        return out

    def update_labels(self, op_dims, upd_dims, combinable: bool) -> list[Role | None]:
        by_upd: dict[int, Role | None] = {}
        for lab in self.operand_labels(op_dims, upd_dims) + self.index_labels(combinable):
            if lab is not None and "upd" in dict(lab[1]):
                by_upd[dict(lab[1])["upd"]] = lab
        return [by_upd.get(u) for u in range(self.upd_rank)]
