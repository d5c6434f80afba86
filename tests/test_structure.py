"""The code measured against its own rules (issue 23): opcode facts live in ir/opcodes.py
(no opcode-name set anywhere else: zero, no allow-list), imports form no cycles beyond the
natural ones and never go up a layer, the library never prints or exits, and
``hlo-spmd rules`` exists. What cannot reach zero yet is an exact allow-list here: a new
entry fails the test, and so does a stale one (shrink the list)."""
from __future__ import annotations

import ast
from pathlib import Path

from click.testing import CliRunner

from hlo_spmd.ir.opcodes import ALL_OPCODES

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "hlo_spmd"
CLI = ROOT / "cli"


def _library_files() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if not p.name.endswith("_pb2.py"))


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def _module_name(p: Path) -> str:
    parts = p.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# -- opcode-name sets --------------------------------------------------------------------------
# Flagged: a set / frozenset / tuple / list literal of two or more strings, all opcode
# names, anywhere outside ir/opcodes.py (named constants, inline ``x in (...)`` tests, set
# arithmetic), and ``x == "a" or x == "b"`` chains over opcode names. Allowed: a literal
# that is the iterable filling a table keyed by opcode - ``{op: ... for op in (...)}`` or
# ``for op in (...): TABLE[op] = ...`` - i.e. the rows of a pass's own per-opcode rule
# table (shape_inference's type rules, the text parser's attribute lists).
def _opcode_strings(node: ast.AST) -> list[str] | None:
    if not isinstance(node, (ast.Set, ast.Tuple, ast.List)) or len(node.elts) < 2:
        return None
    names = [e.value for e in node.elts if isinstance(e, ast.Constant)
             and isinstance(e.value, str)]
    if len(names) != len(node.elts) or not all(n in ALL_OPCODES for n in names):
        return None
    return names


def _table_rows(tree: ast.AST) -> set[int]:
    """ids of literals that are the iterable of a per-opcode table fill."""
    rows: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.DictComp):
            for g in n.generators:
                if isinstance(g.target, ast.Name) and isinstance(n.key, ast.Name) \
                        and n.key.id == g.target.id:
                    rows.add(id(g.iter))
        elif isinstance(n, ast.For) and isinstance(n.target, ast.Name) and len(n.body) == 1:
            stmt = n.body[0]
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                t = stmt.targets[0]
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Name) \
                        and t.slice.id == n.target.id:
                    rows.add(id(n.iter))
    return rows


def _eq_chain(node: ast.AST) -> list[str] | None:
    """The opcode names of an ``or`` of two or more ``x == "name"`` tests on one ``x``."""
    if not isinstance(node, ast.BoolOp) or not isinstance(node.op, ast.Or):
        return None
    by_left: dict[str, list[str]] = {}
    for v in node.values:
        if (isinstance(v, ast.Compare) and len(v.ops) == 1 and isinstance(v.ops[0], ast.Eq)
                and isinstance(v.comparators[0], ast.Constant)
                and v.comparators[0].value in ALL_OPCODES):
            by_left.setdefault(ast.dump(v.left), []).append(v.comparators[0].value)
    longest = max(by_left.values(), key=len, default=[])
    return longest if len(longest) >= 2 else None


def opcode_sets(files: list[Path] | None = None) -> list[tuple[str, tuple[str, ...]]]:
    """(file, sorted opcode names) of every flagged literal outside ir/opcodes.py, in
    ``files`` (default: the library and the CLI)."""
    found = []
    for p in files if files is not None else _library_files() + sorted(CLI.rglob("*.py")):
        if p == SRC / "ir" / "opcodes.py":
            continue
        tree = ast.parse(p.read_text())
        rows = _table_rows(tree)
        for n in ast.walk(tree):
            names = _opcode_strings(n)
            if names is not None and id(n) in rows:
                continue
            names = names if names is not None else _eq_chain(n)
            if names is not None:
                found.append((_rel(p) if p.is_relative_to(ROOT) else p.name,
                              tuple(sorted(names))))
    return sorted(found)


def test_opcode_sets_live_in_ir_opcodes():
    # Every opcode fact is a trait in ir/opcodes.py's table; a module asks it.
    found = opcode_sets()
    assert not found, f"opcode sets outside ir/opcodes.py (ask the traits table): {found}"


def test_the_opcode_set_check_catches_what_it_should():
    src = '''
S = frozenset({"add", "multiply"})
def f(x):
    return x.opcode in ("while", "call") or x.opcode == "dot" or x.opcode == "convolution"
ROWS = {op: 1 for op in ("add", "subtract")}
'''
    tree = ast.parse(src)
    rows = _table_rows(tree)
    hits = [tuple(sorted(_opcode_strings(n) or _eq_chain(n) or ())) for n in ast.walk(tree)
            if (_opcode_strings(n) and id(n) not in rows) or _eq_chain(n)]
    assert sorted(hits) == [("add", "multiply"), ("call", "while"), ("convolution", "dot")]


def test_a_planted_opcode_set_in_a_module_is_caught(tmp_path):
    # Every form a set of opcode names takes, planted in a module file: each is one hit,
    # and a table fill keyed by opcode is none.
    planted = tmp_path / "planted.py"
    planted.write_text('''
A = frozenset(["all-reduce", "all-gather"])
B = {"tuple", "get-tuple-element"}
def f(inst):
    if inst.opcode in ("while", "conditional"):
        return 1
    return inst.opcode == "dot" or inst.opcode == "convolution" or inst.opcode == "dot"
C = [op for op in ["add", "subtract"]]
D = {op: 1 for op in ("negate", "abs")}
E = ("add", "not-an-opcode")
''')
    assert opcode_sets([planted]) == [
        ("planted.py", ("add", "subtract")),
        ("planted.py", ("all-gather", "all-reduce")),
        ("planted.py", ("conditional", "while")),
        ("planted.py", ("convolution", "dot", "dot")),
        ("planted.py", ("get-tuple-element", "tuple")),
    ]
    # The same module among the library's files is caught there too.
    assert ("planted.py", ("conditional", "while")) in opcode_sets(
        _library_files() + [planted])


# -- imports -----------------------------------------------------------------------------------
def import_graph() -> dict[str, set[str]]:
    """module -> the hlo_spmd modules it imports: module-level, function-level and
    TYPE_CHECKING imports alike (each is a dependency a reader follows); a package's
    ``__init__`` run by importing one of its modules is not counted as an edge."""
    files = {_module_name(p): p for p in _library_files()}
    graph: dict[str, set[str]] = {}
    for name, p in files.items():
        out: set[str] = set()
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("hlo_spmd"):
                targets = [f"{n.module}.{a.name}" for a in n.names]
                targets = [t if t in files else n.module for t in targets]
            elif isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            else:
                continue
            out.update(t for t in targets if t in files and t != name)
        graph[name] = out
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(tuple(sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


NATURAL_CYCLES = [
    ("hlo_spmd.ir.computation", "hlo_spmd.ir.instruction", "hlo_spmd.ir.module"),
    ("hlo_spmd.sharding.hlo_sharding", "hlo_spmd.sharding.text"),
]
CYCLE_ALLOW_LIST: list[tuple[str, ...]] = []


def test_import_cycles():
    assert import_cycles(import_graph()) == sorted(NATURAL_CYCLES + CYCLE_ALLOW_LIST)


# Layers, lowest first: a module imports only its own layer and those below. sharding sits
# under ir (an instruction holds an HloSharding; shardings know no instructions); stats
# measures programs (ir + collectives' costs) and the partitioner's tidy pass asks it.
LAYERS = [
    {"errors", "memo", "records", "proto", "units"},
    {"sharding"},
    {"ir"},
    {"collectives"},
    {"stats", "diff", "inspect"},
    {"annotations"},
    {"passes"},
    {"report", "runtime"},
    {"api"},
    {"search"},  # prices candidates by partitioning them through the API
    {""},  # the package root, hlo_spmd/__init__.py
]


def _layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    for i, names in enumerate(LAYERS):
        if part in names:
            return i
    raise AssertionError(f"{module}: no layer (add its package to LAYERS)")


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if _layer(b) > _layer(a))


def test_no_upward_imports():
    assert upward_imports(import_graph()) == []


def test_library_never_imports_the_cli():
    for p in _library_files():
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                mods = [n.module or ""] if isinstance(n, ast.ImportFrom) else \
                    [a.name for a in n.names]
                assert not any(m.startswith("hlo_spmd_cli") for m in mods), _rel(p)


# -- the library never prints or exits --------------------------------------------------------
def prints_and_exits() -> list[tuple[str, int, str]]:
    found = []
    for p in _library_files():
        for n in ast.walk(ast.parse(p.read_text())):
            what = None
            if isinstance(n, ast.Call):
                f = n.func
                if isinstance(f, ast.Name) and f.id in ("print", "exit", "quit"):
                    what = f.id
                elif isinstance(f, ast.Attribute) and f.attr in ("exit", "_exit") and \
                        isinstance(f.value, ast.Name) and f.value.id in ("sys", "os"):
                    what = f"{f.value.id}.{f.attr}"
            elif isinstance(n, ast.Raise) and n.exc is not None:
                exc = n.exc.func if isinstance(n.exc, ast.Call) else n.exc
                if isinstance(exc, ast.Name) and exc.id == "SystemExit":
                    what = "SystemExit"
            if what:
                found.append((_rel(p), n.lineno, what))
    return found


def test_library_never_prints_or_exits():
    assert prints_and_exits() == []


# -- hlo-spmd rules ----------------------------------------------------------------------------
def test_rules_command_is_present():
    from hlo_spmd_cli.main import _register, cli

    _register()
    assert "rules" in cli.commands
    r = CliRunner().invoke(cli, ["rules", "--json"], catch_exceptions=False)
    assert r.exit_code == 0 and '"handler_module"' in r.output


# -- one reshard path -------------------------------------------------------------------------
# reshard (passes/partition/reshard.py) is the only way a value changes sharding: it plans
# the route as data and emits exactly that plan, through its cache. A second path cuts
# tiles itself: a function that pads a value and dynamic-slices it at per-device offsets
# taken from a sharding's offset table (``device_offsets`` over the sharding's dims) is a
# local cut outside the plan (handlers/slicing.to_sharding was one), and so is a call of
# the plan's own emitters from anywhere else.
RESHARD_FILES = {"src/hlo_spmd/passes/partition/reshard.py",
                 "src/hlo_spmd/passes/partition/local_cut.py",
                 "src/hlo_spmd/passes/partition/recreate.py",
                 "src/hlo_spmd/passes/partition/reshard_routes.py",
                 "src/hlo_spmd/passes/partition/unreduced.py"}
RESHARD_EMITTERS = {"slice_replicated", "offsets_for", "reshard_with_plan", "maximal_to_tiled",
                    "maximal_to_replicated", "keep_on_leader", "chosen_plan", "plan_reshard"}
SECOND_PATH_NAMES = {"to_sharding", "to_sharding_bytes", "reshard_bytes", "_local_route",
                     "SPECIAL_ROUTES"}


def _called(fn: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            f = n.func
            out.add(f.id if isinstance(f, ast.Name) else getattr(f, "attr", ""))
    return out


def second_reshard_paths(files: dict[str, str]) -> list[tuple[str, str]]:
    """(file, what) for every local cut or reshard emitter outside reshard's files."""
    found = []
    for rel, text in files.items():
        if rel in RESHARD_FILES:
            continue
        tree = ast.parse(text)
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in SECOND_PATH_NAMES:
                found.append((rel, n.name))
            if isinstance(n, ast.Name) and n.id in SECOND_PATH_NAMES:
                found.append((rel, n.id))
            if isinstance(n, ast.FunctionDef):
                calls = _called(n)
                if {"pad_to", "device_offsets", "dynamic_slice"} <= calls:
                    found.append((rel, f"{n.name}: pad + dynamic-slice at device_offsets"))
                found += [(rel, f"{n.name} calls {c}") for c in sorted(calls & RESHARD_EMITTERS)]
    return sorted(set(found))


def test_reshard_is_the_only_path():
    files = {_rel(p): p.read_text() for p in _library_files()}
    assert second_reshard_paths(files) == []


def test_the_second_path_check_catches_a_local_cut():
    # handlers/slicing.to_sharding's cut, as it was (renamed: the shape of the code, not
    # its name, is what is flagged).
    text = '''
def cut(ctx, pv, target):
    x = pad_to(ctx, pv.hlo, padded)
    table = device_offsets(target, dims, num_devices=ctx.num_devices)
    offsets = [ctx.logical_table(table[:, d]) for d in range(rank)]
    return PValue(ctx.b.dynamic_slice(x, offsets, sizes), pv.base_shape, target)

def other(ctx, pv, t):
    return slice_replicated(ctx, pv, t)
'''
    assert [w for _, w in second_reshard_paths({"x.py": text})] == [
        "cut: pad + dynamic-slice at device_offsets", "other calls slice_replicated"]


# -- the context reshard's pieces see ---------------------------------------------------------
def test_partition_context_is_a_reshard_context():
    """reshard and its pieces name the context through state.ReshardContext (they sit
    below context.py); PartitionContext must have every member it declares, with the same
    parameters."""
    import inspect

    from hlo_spmd.passes.partition.context import PartitionContext
    from hlo_spmd.passes.partition.state import ReshardContext

    assigned = set(PartitionContext.__init__.__code__.co_names)
    for name in ReshardContext.__annotations__:
        assert name in assigned, name
    members = [n for n, v in vars(ReshardContext).items()
               if not n.startswith("_") and (callable(v) or isinstance(v, property))]
    assert members
    for name in members:
        mine, theirs = getattr(PartitionContext, name), vars(ReshardContext)[name]
        if isinstance(theirs, property):
            assert isinstance(mine, property), name
            continue
        assert list(inspect.signature(mine).parameters) == \
            list(inspect.signature(theirs).parameters), name
