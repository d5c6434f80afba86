"""Input mutators for the fuzz tests: protos (bit flips, truncation, splices, chunk
deletion / duplication) and HLO text (broken shardings, shapes, opcodes, dims, lines)."""
from __future__ import annotations

import random
import re

OPCODES = ["add", "dot", "reduce", "broadcast", "reshape", "transpose", "slice", "tuple",
           "get-tuple-element", "while", "convolution", "custom-call", "parameter",
           "constant", "all-reduce", "concatenate", "pad", "select", "compare", "iota",
           "bogus-op", "dynamic-slice", "gather", "sort", "copy", "negate"]
TYPES = ["f32", "s32", "pred", "bf16", "f64", "u8", "token", "f16", "c64", "x17"]


def mutate_proto(data: bytes, other: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.choice(["flip", "flip", "truncate", "splice", "delete", "dup", "byte"])
    if not b:
        return bytes(other[: rng.randrange(1, 64)])
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        b = b[: rng.randrange(len(b))]
    elif kind == "splice":
        i = rng.randrange(len(b))
        j = rng.randrange(len(other)) if other else 0
        b = b[:i] + other[j: j + rng.randint(1, 200)] + b[i + rng.randint(0, 200):]
    elif kind == "delete":
        i = rng.randrange(len(b))
        del b[i: i + rng.randint(1, 64)]
    elif kind == "dup":
        i = rng.randrange(len(b))
        b[i:i] = b[i: i + rng.randint(1, 64)]
    else:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def _sub_one(pattern: str, text: str, rng: random.Random, repl) -> str:
    ms = list(re.finditer(pattern, text))
    if not ms:
        return text
    m = rng.choice(ms)
    return text[: m.start()] + repl(m) + text[m.end():]


#: Dims that are too large for an array (2^63-1, products past int64), past int64 itself,
#: or negative.
HUGE_DIMS = [2**63 - 1, 2**62, 2**63, 2**64 + 3, 2**32 + 1, -2**63, -7]


def _rand_dims(rng: random.Random) -> str:
    pool = [0, 1, 2, 3, 4, 5, 7, 8, 16, 64, -1, 2**31]
    if rng.random() < 0.3:
        pool = pool + HUGE_DIMS
    return ",".join(str(rng.choice(pool)) for _ in range(rng.randint(0, 4)))


def _rand_layout(rng: random.Random) -> str:
    rank = rng.randint(0, 4)
    perm = [rng.choice([0, 1, 2, 3, 5, -1, 2**63 - 1]) for _ in range(rank)]
    return "{" + ",".join(map(str, perm)) + rng.choice(["", ":T(8,128)", ":E(4)", ":S(1)"]) + "}"


def mutate_text(text: str, other: str, rng: random.Random) -> str:
    kind = rng.choice(["sharding", "sharding", "shape", "shape", "opcode", "dims", "line",
                       "truncate", "splice", "char", "layout"])
    if kind == "layout":
        return _sub_one(r"\]\{[0-9,]*\}", text, rng, lambda m: "]" + _rand_layout(rng))
    if kind == "sharding":
        choices = [
            lambda m: "sharding={devices=[" + _rand_dims(rng) + "]<=[" + str(rng.choice([1, 2, 4, 8, 16, 3])) + "]}",
            lambda m: "sharding={devices=[" + _rand_dims(rng) + "]" + ",".join(
                str(rng.randrange(-1, 9)) for _ in range(rng.randint(0, 9))) + "}",
            lambda m: "sharding={maximal device=" + str(rng.randrange(-2, 20)) + "}",
            lambda m: "sharding={{replicated}, {manual}}",
            lambda m: "sharding={devices=[2,2]<=[4] last_tile_dims={manual, replicated}}",
            lambda m: m.group(0)[: rng.randrange(1, max(2, len(m.group(0))))],
            lambda m: "sharding={devices=[2,4]<=[2,4]T(1,0) last_tile_dim_replicate}",
            lambda m: "sharding={unknown}",
        ]
        return _sub_one(r"sharding=\{(?:[^{}]|\{[^{}]*\})*\}", text, rng, rng.choice(choices))
    if kind == "shape":
        return _sub_one(r"\b(f32|s32|pred|bf16|u32|f16)\[([0-9,]*)\]", text, rng,
                        lambda m: f"{rng.choice(TYPES)}[{_rand_dims(rng)}]")
    if kind == "opcode":
        return _sub_one(r"(= [^ ]+ )([a-z][a-z0-9\-]*)\(", text, rng,
                        lambda m: m.group(1) + rng.choice(OPCODES) + "(")
    if kind == "dims":
        return _sub_one(r"\b(dimensions|lhs_contracting_dims|rhs_contracting_dims|"
                        r"lhs_batch_dims|rhs_batch_dims|slice|index|"
                        r"replica_groups|iota_dimension)=\{?[^,}\s]*\}?",
                        text, rng, lambda m: m.group(1) + "={" + _rand_dims(rng) + "}")
    if kind == "line":
        lines = text.splitlines()
        i = rng.randrange(len(lines))
        op = rng.choice(["del", "dup", "swap"])
        if op == "del":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        else:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines) + "\n"
    if kind == "truncate":
        return text[: rng.randrange(len(text))]
    if kind == "splice":
        i = rng.randrange(len(text))
        j = rng.randrange(len(other))
        return text[:i] + other[j: j + rng.randint(1, 300)] + text[i + rng.randint(0, 100):]
    i = rng.randrange(len(text))
    return text[:i] + rng.choice("{}[](),=%# \n0-9x") + text[i + 1:]


def mutate_proto_fields(data: bytes, rng: random.Random) -> bytes:
    """A structural mutation that keeps the wire format valid: one field of one
    instruction (opcode, shape, operands, sharding, dims, indices, called computations)."""
    from hlo_spmd.proto import hlo_pb2

    m = hlo_pb2.HloModuleProto.FromString(data)
    insts = [i for c in m.computations for i in c.instructions]
    if not insts:
        return data
    ids = [i.id for i in insts] + [c.id for c in m.computations]
    inst = rng.choice(insts)
    kind = rng.choice(["opcode", "dim", "etype", "operand", "sharding", "sharding",
                       "dims", "index", "called", "rank", "groups", "drop_operand", "layout"])
    if kind == "layout":
        layout = inst.shape.layout
        del layout.minor_to_major[:]
        layout.minor_to_major.extend(rng.choice([0, 1, 2, 5, -1, 2**62])
                                     for _ in range(rng.randint(0, 4)))
    if kind == "opcode":
        inst.opcode = rng.choice(OPCODES)
    elif kind == "dim" and inst.shape.dimensions:
        k = rng.randrange(len(inst.shape.dimensions))
        inst.shape.dimensions[k] = rng.choice([0, 1, 3, 1000, -5, 2**40, 2**63 - 1, 2**62,
                                               -2**63])
    elif kind == "etype":
        inst.shape.element_type = rng.choice([0, 1, 4, 11, 13, 16, 17, 99])
    elif kind == "operand" and inst.operand_ids:
        inst.operand_ids[rng.randrange(len(inst.operand_ids))] = rng.choice(ids + [-1, 10**9])
    elif kind == "drop_operand" and inst.operand_ids:
        del inst.operand_ids[rng.randrange(len(inst.operand_ids))]
    elif kind == "sharding":
        s = inst.sharding
        which = rng.choice(["type", "tad", "dev", "iota", "last", "tuple"])
        if which == "type":
            s.type = rng.choice([0, 1, 2, 3, 4, 5, 6, 42])
        elif which == "tad":
            s.type = 3
            del s.tile_assignment_dimensions[:]
            s.tile_assignment_dimensions.extend(rng.randint(0, 9) for _ in range(rng.randint(0, 5)))
        elif which == "dev":
            s.tile_assignment_devices.extend(rng.randint(-3, 20) for _ in range(rng.randint(1, 4)))
        elif which == "iota":
            s.type = 3
            del s.iota_reshape_dims[:]
            s.iota_reshape_dims.extend(rng.randint(0, 9) for _ in range(rng.randint(0, 4)))
            del s.iota_transpose_perm[:]
            s.iota_transpose_perm.extend(rng.randint(-1, 4) for _ in range(rng.randint(0, 4)))
        elif which == "last":
            s.last_tile_dims.extend(rng.choice([0, 1, 3, 4, 5]) for _ in range(rng.randint(1, 2)))
        else:
            s.type = 2
            for _ in range(rng.randint(0, 3)):
                s.tuple_shardings.add().type = rng.choice([0, 1, 3, 4])
    elif kind == "dims":
        del inst.dimensions[:]
        inst.dimensions.extend(rng.randint(-1, 5) for _ in range(rng.randint(0, 4)))
    elif kind == "index":
        inst.tuple_index = rng.choice([-1, 0, 1, 5, 99])
        inst.parameter_number = rng.choice([-1, 0, 1, 7])
    elif kind == "called":
        if inst.called_computation_ids and rng.random() < 0.5:
            del inst.called_computation_ids[-1]
        else:
            inst.called_computation_ids.append(rng.choice(ids + [12345]))
    elif kind == "rank":
        if inst.shape.dimensions and rng.random() < 0.5:
            del inst.shape.dimensions[-1]
        else:
            inst.shape.dimensions.append(rng.choice([1, 2, 4]))
    elif kind == "groups":
        g = inst.replica_groups.add()
        g.replica_ids.extend(rng.randint(-1, 9) for _ in range(rng.randint(0, 4)))
    return m.SerializeToString()
