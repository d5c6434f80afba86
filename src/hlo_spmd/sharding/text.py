"""XLA's sharding text form: ``parse_sharding`` and the printer behind ``str()``.

Grammar (what XLA's HLO parser accepts)::

    sharding  := '{' single_body '}' | '{' [single (',' single)*] '}'   (tuple)
    single    := '{' single_body '}'
    body item := replicated | maximal | manual | unknown | unreduced
               | device=INT | devices=[dims] (INT,INT,... | <=[dims] [T(perm)])
               | last_tile_dim_replicate | last_tile_dims={type, ...}
               | shard_as INT | shard_like INT | metadata=METADATA
    named     := '{' (mesh[...] | maximal_mesh[...]) ... '}'   (see sharding.named)

``/* ... */`` comments (XLA prints ``/*index=5*/`` in long tuples) are skipped.
Errors raise ShardingError naming the problem and the 0-based character
position.  The parser is stricter than XLA's where XLA silently accepts
nonsense (conflicting kinds, duplicate devices, device counts that do not match
the dims); valid input parses to the same value XLA builds, canonicalisation
included, so printing reproduces XLA's output.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding.hlo_sharding import (_SUBGROUP_NAMES, HloSharding, ShardGroup,
                                            ShardingType)
from hlo_spmd.sharding.metadata import OpMetadata
from hlo_spmd.sharding.tile_assignment import TileAssignment

__all__ = ["parse_sharding", "parse_metadata", "sharding_to_string"]

_TYPE_BY_NAME = {v: k for k, v in _SUBGROUP_NAMES.items()}


# -- printing ---------------------------------------------------------------------
def _metadata_text(md: tuple[OpMetadata, ...]) -> str:
    if not md:
        return ""
    if len(md) == 1:
        return " metadata={" + md[0].to_text() + "}"
    return " metadata={" + ", ".join("{" + m.to_text() + "}" for m in md) + "}"


def _named_metadata_text(md: tuple[OpMetadata, ...]) -> str:
    if not md:
        return ""
    return ", metadata={" + ", ".join("{" + m.to_text() + "}" for m in md) + "}"


def sharding_to_string(s: HloSharding, include_metadata: bool = False) -> str:
    """XLA's HloSharding::ToString (tuple index comments every 5th element).

    A value read from a named form prints in that form (XLA's
    NamedSharding::ToString) unless it gained a shard group, which only the
    tile form can say.
    """
    if s.is_tuple:
        parts: list[str] = []
        for i, e in enumerate(s.tuple_elements):
            text = sharding_to_string(e, include_metadata)
            if i == 0:
                parts.append(text)
            elif i % 5 == 0:
                parts.append(f", /*index={i}*/" + text)
            else:
                parts.append(", " + text)
        return "{" + "".join(parts) + "}"
    if s.named is not None and s.shard_group is None:
        return s.named.text(_named_metadata_text(s.metadata) if include_metadata else "")
    tail = (" " + str(s.shard_group) if s.shard_group is not None else "") + \
        (_metadata_text(s.metadata) if include_metadata else "")
    kind = s.kind
    if kind in ("replicated", "manual", "unknown", "unreduced"):
        return "{" + kind + tail + "}"
    if kind == "maximal":
        return f"{{maximal device={s.device}" + tail + "}"
    ta = s.tile_assignment
    assert ta is not None
    out = "{" + str(ta)
    if s.replicate_on_last_tile_dim:
        out += " last_tile_dim_replicate"
    if s.subgroup_types:
        out += " last_tile_dims={" + ", ".join(
            _SUBGROUP_NAMES.get(t, "error_type.") for t in s.subgroup_types) + "}"
    return out + tail + "}"


# -- lexing -----------------------------------------------------------------------
class _Tok(NamedTuple):  # not a dataclass: ~1 ms less start-up
    kind: str      # '{', '}', '[', ']', '(', ')', ',', '=', '<=', 'int', 'ident', 'str', 'eof'
    text: str
    pos: int
    value: object = None


_TOKEN_RE = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>/\*.*?\*/)
  | (?P<leq><=)
  | (?P<punct>[{}\[\](),=])
  | (?P<ints>-?\d+(?:[ \t\r\n]*,[ \t\r\n]*-?\d+)+)
  | (?P<int>-?\d+)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<str>"(?:[^"\\]|\\.)*")
""", re.VERBOSE | re.DOTALL)

_SIMPLE_ESCAPES = {"n": 10, "t": 9, "r": 13, "\\": 92, "'": 39, '"': 34, "?": 63,
                   "a": 7, "b": 8, "f": 12, "v": 11}


def _positioned(msg: str, pos: int, text: str) -> ShardingError:
    """ShardingError mentioning (and carrying, as ``.position``) a character offset."""
    err = ShardingError(f"{msg} at character {pos} in {text!r}")
    err.position = pos  # type: ignore[attr-defined]
    return err


def _c_unescape(body: str, pos: int, text: str) -> str:
    """absl::CUnescape of a quoted string body; result decoded as UTF-8."""
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.extend(c.encode("utf-8"))
            i += 1
            continue
        i += 1
        e = body[i]
        if e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
            i += 1
        elif e in "01234567":
            j = i
            while j < len(body) and j < i + 3 and body[j] in "01234567":
                j += 1
            val = int(body[i:j], 8)
            if val > 255:
                raise _positioned(f"octal escape \\{body[i:j]} out of range", pos + i, text)
            out.append(val)
            i = j
        elif e == "x":
            j = i + 1
            while j < len(body) and j < i + 3 and body[j] in "0123456789abcdefABCDEF":
                j += 1
            if j == i + 1:
                raise _positioned("\\x escape without hex digits", pos + i, text)
            out.append(int(body[i + 1:j], 16))
            i = j
        else:
            raise _positioned(f"unknown escape sequence \\{e}", pos + i, text)
    return out.decode("utf-8", errors="surrogateescape")


def _lex(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    n = len(text)
    while pos < n:
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            if text.startswith("/*", pos):
                raise _positioned("unterminated comment", pos, text)
            if text[pos] == '"':
                raise _positioned("unterminated string", pos, text)
            raise _positioned(f"unexpected character {text[pos]!r}", pos, text)
        kind = m.lastgroup
        tok_text = m.group()
        if kind == "leq":
            toks.append(_Tok("<=", tok_text, pos))
        elif kind == "punct":
            toks.append(_Tok(tok_text, tok_text, pos))
        elif kind == "ints":
            # One token for a whole comma list: long explicit device lists
            # (thousands of ids) then cost one regex match and one int() each.
            vals = [int(x) for x in tok_text.split(",")]
            toks.append(_Tok("ints", tok_text, pos, vals))
        elif kind == "int":
            toks.append(_Tok("int", tok_text, pos, int(tok_text)))
        elif kind == "ident":
            toks.append(_Tok("ident", tok_text, pos))
        elif kind == "str":
            toks.append(_Tok("str", tok_text, pos, _c_unescape(tok_text[1:-1], pos + 1, text)))
        pos = m.end()
    toks.append(_Tok("eof", "", n))
    return toks


# -- parsing ----------------------------------------------------------------------
_KIND_WORDS = ("replicated", "maximal", "manual", "unknown", "unreduced")
_MD_STR = ("op_type", "op_name", "source_file", "deduplicated_name", "scheduling_name")
_MD_INT = ("source_line", "source_end_line", "source_column", "source_end_column",
           "stack_frame_id")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _lex(text)
        self.i = 0

    # token helpers
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def next(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def error(self, msg: str, pos: int | None = None) -> ShardingError:
        p = self.tok.pos if pos is None else pos
        got = self.toks[self.i]
        if pos is None:
            msg = f"{msg}, got {('end of input' if got.kind == 'eof' else repr(got.text))}"
        return _positioned(msg, p, self.text)

    def expect(self, kind: str, what: str) -> _Tok:
        if self.tok.kind != kind:
            raise self.error(f"expected {what}")
        return self.next()

    def expect_int(self, what: str) -> int:
        t = self.expect("int", what)
        assert isinstance(t.value, int)
        return t.value

    def int_list(self, what: str) -> list[int]:
        if self.tok.kind == "ints":
            vals = list(self.next().value)  # type: ignore[arg-type]
        else:
            vals = [self.expect_int(what)]
        while self.tok.kind == ",":
            self.next()
            if self.tok.kind == "ints":
                vals.extend(self.next().value)  # type: ignore[arg-type]
            else:
                vals.append(self.expect_int(what))
        return vals

    def bracket_ints(self, what: str) -> list[int]:
        self.expect("[", f"'[' to start {what}")
        vals = self.int_list(f"an integer in {what}")
        self.expect("]", f"']' to end {what}")
        return vals

    # grammar
    def parse_top(self) -> HloSharding:
        self.expect("{", "'{' to start a sharding")
        if self.tok.kind in ("{", "}"):
            elems: list[HloSharding] = []
            if self.tok.kind != "}":
                while True:
                    elems.append(self.parse_single())
                    if self.tok.kind != ",":
                        break
                    self.next()
            self.expect("}", "'}' to end the tuple sharding")
            result = HloSharding.tuple(elems)
        else:
            result = self.parse_body()
        if self.tok.kind != "eof":
            raise self.error("unexpected text after the sharding")
        return result

    def parse_single(self) -> HloSharding:
        if self.tok.kind != "{":
            raise self.error("expected '{' to start a tuple element sharding")
        self.next()
        if self.tok.kind == "{":
            raise self.error("nested tuple shardings are not allowed")
        return self.parse_body()

    def parse_body(self) -> HloSharding:
        start = self.tok.pos
        kind: str | None = None
        kind_pos = start
        device: int | None = None
        devices_pos: int | None = None
        tile_dims: list[int] | None = None
        iota: tuple[list[int], list[int] | None] | None = None
        explicit: list[int] | None = None
        replicate_last = False
        types: list[ShardingType] | None = None
        types_pos = start
        group: ShardGroup | None = None
        metadata: list[OpMetadata] = []
        while self.tok.kind != "}":
            t = self.tok
            if t.kind != "ident":
                raise self.error("unexpected token in sharding")
            word = t.text
            self.next()
            if word in _KIND_WORDS:
                if kind is not None:
                    raise self.error(f"conflicting sharding kinds '{kind}' and '{word}'", t.pos)
                kind, kind_pos = word, t.pos
            elif word == "last_tile_dim_replicate":
                replicate_last = True
            elif word in ("shard_as", "shard_like"):
                if group is not None:
                    raise self.error("only one shard_as/shard_like is allowed", t.pos)
                group = ShardGroup(self.expect_int(f"a shard group id after {word}"),
                                   word == "shard_as")
            elif word == "device":
                if device is not None:
                    raise self.error("duplicate device= attribute", t.pos)
                self.expect("=", "'=' after device")
                device = self.expect_int("an integer device id after device=")
            elif word == "devices":
                if devices_pos is not None:
                    raise self.error("duplicate devices= attribute", t.pos)
                devices_pos = t.pos
                self.expect("=", "'=' after devices")
                tile_dims = self.bracket_ints("the tile assignment dims")
                if self.tok.kind == "<=":
                    self.next()
                    reshape = self.bracket_ints("the iota reshape dims")
                    perm: list[int] | None = None
                    if self.tok.kind == "ident" and self.tok.text == "T":
                        self.next()
                        self.expect("(", "'(' after T")
                        perm = self.int_list("an integer in the iota transpose perm")
                        self.expect(")", "')' to end the iota transpose perm")
                    elif len(reshape) > 1:
                        raise self.error("expected 'T(' to start the iota transpose perm")
                    iota = (reshape, perm)
                else:
                    explicit = self.int_list("a device id")
            elif word == "metadata":
                self.expect("=", "'=' after metadata")
                metadata.extend(self.parse_metadata_value())
            elif word == "last_tile_dims":
                if types is not None:
                    raise self.error("duplicate last_tile_dims= attribute", t.pos)
                types_pos = t.pos
                self.expect("=", "'=' after last_tile_dims")
                types = self.parse_types()
            else:
                raise self.error(
                    f"unknown attribute '{word}' in sharding (expected replicated, maximal, "
                    "manual, unknown, unreduced, device=, devices=, last_tile_dim_replicate, "
                    "last_tile_dims=, shard_as, shard_like or metadata=)", t.pos)
        self.next()  # '}'
        result = self.build(kind, kind_pos, start, device, devices_pos, tile_dims, iota,
                            explicit, replicate_last, types, types_pos, metadata)
        return result.with_shard_group(group) if group is not None else result

    def build(self, kind: str | None, kind_pos: int, start: int, device: int | None,
              devices_pos: int | None, tile_dims: list[int] | None,
              iota: tuple[list[int], list[int] | None] | None, explicit: list[int] | None,
              replicate_last: bool, types: list[ShardingType] | None, types_pos: int,
              metadata: list[OpMetadata]) -> HloSharding:
        if kind is not None and kind != "maximal":
            if device is not None or devices_pos is not None:
                raise self.error(f"{kind} shardings must not have devices assigned", kind_pos)
            if replicate_last or types is not None:
                raise self.error(f"{kind} shardings cannot have last_tile_dim(s)", kind_pos)
            return {"replicated": HloSharding.replicate, "manual": HloSharding.manual,
                    "unknown": HloSharding.unknown,
                    "unreduced": HloSharding.unreduced}[kind](metadata)
        if kind == "maximal":
            if device is None or devices_pos is not None:
                raise self.error("maximal shardings need exactly one device=N", kind_pos)
            if device < 0:
                raise self.error(f"maximal device {device} is negative", kind_pos)
            return HloSharding.maximal(device, metadata)
        if device is not None:
            raise self.error("device= is only valid with maximal", start)
        if tile_dims is None:
            raise self.error("non-maximal shardings must have a devices=[...] tile assignment",
                             start)
        assert devices_pos is not None
        if replicate_last and types is not None:
            raise self.error("last_tile_dim_replicate and last_tile_dims= cannot be combined",
                             types_pos)
        if any(d < 1 for d in tile_dims):
            raise self.error(f"tile assignment dims must be positive, got {tile_dims}",
                             devices_pos)
        try:
            if iota is not None:
                reshape, perm = iota
                if perm is not None and len(perm) != len(reshape):
                    raise self.error(
                        f"iota transpose perm {perm} must have as many entries as the "
                        f"reshape dims {reshape}", devices_pos)
                ta = TileAssignment(tile_dims, reshape, perm)
            else:
                assert explicit is not None
                if len(explicit) <= 1:
                    raise self.error(
                        "non-maximal shardings must have more than one device assigned",
                        devices_pos)
                ta = TileAssignment.from_devices(tile_dims, explicit)
            n_sub = 1 if replicate_last else len(types or ())
            if n_sub > len(tile_dims):
                raise self.error(
                    f"{n_sub} subgroup dims but only {len(tile_dims)} tile dims", types_pos)
            return HloSharding.tile(ta, replicate_last, types or (), metadata)
        except ShardingError as e:
            if getattr(e, "position", None) is not None:
                raise
            raise self.error(e.message, devices_pos) from None

    def parse_types(self) -> list[ShardingType]:
        self.expect("{", "'{' to start last_tile_dims")
        out: list[ShardingType] = []
        if self.tok.kind != "}":
            while True:
                t = self.tok
                if t.kind != "ident" or t.text not in _TYPE_BY_NAME:
                    raise self.error(
                        "expected a subgroup type (manual, maximal, replicated, unreduced)")
                out.append(_TYPE_BY_NAME[t.text])
                self.next()
                if self.tok.kind != ",":
                    break
                self.next()
        self.expect("}", "'}' to end last_tile_dims")
        return out

    def parse_metadata_value(self) -> list[OpMetadata]:
        """``{attrs}`` (one) or ``{{attrs}, {attrs}}`` (list); ``{}`` is one empty."""
        self.expect("{", "'{' to start metadata")
        if self.tok.kind == "{":
            out: list[OpMetadata] = []
            while True:
                self.expect("{", "'{' to start one metadata entry")
                out.append(self.parse_metadata_attrs())
                if self.tok.kind != ",":
                    break
                self.next()
            self.expect("}", "'}' to end the metadata list")
            return out
        return [self.parse_metadata_attrs()]

    def parse_metadata_attrs(self) -> OpMetadata:
        """Attributes up to and including the closing '}'."""
        fields: dict[str, object] = {}
        while self.tok.kind != "}":
            if self.tok.kind == ",":
                self.next()
                continue
            t = self.tok
            if t.kind != "ident":
                raise self.error("expected a metadata attribute name")
            name = t.text
            self.next()
            if name in fields:
                raise self.error(f"metadata attribute {name} already exists", t.pos)
            self.expect("=", f"'=' after {name}")
            if name in _MD_STR:
                v = self.expect("str", f"a quoted string for {name}")
                fields[name] = v.value
            elif name in _MD_INT:
                fields[name] = self.expect_int(f"an integer for {name}")
            elif name == "profile_type":
                self.expect("{", "'{' to start profile_type")
                vals: list[int] = []
                if self.tok.kind != "}":
                    vals = self.int_list("an integer in profile_type")
                self.expect("}", "'}' to end profile_type")
                fields[name] = tuple(vals)
            else:
                raise self.error(f"unsupported metadata attribute '{name}'", t.pos)
        self.next()
        return OpMetadata(**fields)  # type: ignore[arg-type]


_NAMED_RE = re.compile(r"\b(?:maximal_)?mesh\s*\[")
_NAMED_START = re.compile(r"\{\s*(?:maximal_)?mesh\s*\[")


def parse_sharding(text: str) -> HloSharding:
    """Parse XLA sharding text (``{devices=[2,2]<=[4]}``, named ``{mesh[...] [...]}``,
    tuples, metadata...)."""
    if not isinstance(text, str):
        raise ShardingError(f"sharding text must be a string, got {type(text).__name__}")
    if _NAMED_RE.search(text):
        return _parse_with_named(text)
    return _Parser(text).parse_top()


def _parse_with_named(text: str) -> HloSharding:
    """Top level when some part is a named sharding (the token lexer does not know
    quoted axis names, so each element is cut out and parsed on its own)."""
    pos = _skip_ws(text, 0)
    if not text.startswith("{", pos):
        raise _positioned("expected '{' to start a sharding", pos, text)
    inner = _skip_ws(text, pos + 1)
    if text.startswith("{", inner) or text.startswith("}", inner):
        elems: list[HloSharding] = []
        i = inner
        while not text.startswith("}", i):
            if not text.startswith("{", i):
                raise _positioned("expected '{' to start a tuple element sharding", i, text)
            end = _element_end(text, i)
            elems.append(_parse_element(text, i, end, in_tuple=True))
            i = _skip_ws(text, end)
            if text.startswith(",", i):
                i = _skip_ws(text, i + 1)
            elif not text.startswith("}", i):
                raise _positioned("expected ',' or '}' in the tuple sharding", i, text)
        result = HloSharding.tuple(elems)
        end = i + 1
    else:
        end = _element_end(text, pos)
        result = _parse_element(text, pos, end, in_tuple=False)
    if _skip_ws(text, end) != len(text):
        raise _positioned("unexpected text after the sharding", _skip_ws(text, end), text)
    return result


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _element_end(text: str, pos: int) -> int:
    """Index past the '}' closing the '{' at ``pos``; quoted names and strings skipped."""
    depth = 0
    i = pos
    while i < len(text):
        c = text[i]
        if c in "'\"":
            j = i + 1
            while j < len(text) and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _positioned("unbalanced '{' in the sharding", pos, text)


def _parse_element(text: str, start: int, end: int, in_tuple: bool) -> HloSharding:
    if _NAMED_START.match(text, start):
        from hlo_spmd.sharding.named import parse_named
        ns, md_text, stop = parse_named(text[:end], text.index("{", start) + 1)
        if stop != end:
            raise _positioned("unexpected text after the named sharding", stop, text)
        metadata = parse_metadata(md_text) if md_text is not None else []
        return HloSharding.from_named(ns, metadata)
    try:
        s = _Parser(text[start:end]).parse_top()
    except ShardingError as e:
        off = getattr(e, "position", None)
        if isinstance(off, int):
            raise _positioned(e.message.split(" at character ")[0], start + off, text) from None
        raise
    if in_tuple and s.is_tuple:
        raise _positioned("nested tuple shardings are not allowed", start, text)
    return s


def parse_metadata(text: str) -> list[OpMetadata]:
    """Parse a ``{op_name="..." ...}`` metadata value (single or list form)."""
    p = _Parser(text)
    out = p.parse_metadata_value()
    if p.tok.kind != "eof":
        raise p.error("unexpected text after the metadata")
    return out
