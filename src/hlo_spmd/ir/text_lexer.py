"""A small cursor over HLO text: whitespace/comment skipping, regex-driven tokens, and
``ParseError`` with precise 1-based line:column locations.

The HLO grammar is context sensitive (``3x3`` is a window size after ``size=``, ``0_1``
a padding, ``{...}`` after ``backend_config=`` an opaque JSON dict), so instead of a
token stream the parsers ask the cursor for the token they expect at the current
position.  Every token method skips leading whitespace and ``//`` / ``/* */`` comments
first, exactly like XLA's lexer.
"""
from __future__ import annotations

import bisect
import re

from hlo_spmd.errors import ParseError

__all__ = ["Cursor", "c_escape", "c_unescape", "lexes_as_json_dict", "find_balanced_brace"]

_WS = re.compile(r"(?:[ \t\n\r]+|//[^\n\r]*|/\*.*?\*/)*", re.S)
_NAME = re.compile(r"%?([A-Za-z_][A-Za-z0-9_.\-]*)")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_ATTR_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_.\-]*)=")
_INT = re.compile(r"-?[0-9]+")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S)
# XLA's float pattern: with exponent, or with a '.'; else an integer.
_BRACE_OR_QUOTE = re.compile(r'[{}"]')
_NUMBER = re.compile(
    r"-?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][+-]?[0-9]+|[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)"
    r"|-?inf\b|-?nan(?:\(0x[0-9a-fA-F]+\))?")


class Cursor:
    """Position in an HLO text; token methods return values and advance."""

    __slots__ = ("text", "pos", "source", "_line_starts", "n")

    def __init__(self, text: str, source: str = "<text>", pos: int = 0) -> None:
        self.text = text
        self.pos = pos
        self.n = len(text)
        self.source = source
        self._line_starts: list[int] | None = None

    # -- locations and errors ------------------------------------------------------
    def line_col(self, pos: int | None = None) -> tuple[int, int]:
        """1-based (line, column) of ``pos`` (default: the current position)."""
        if pos is None:
            pos = self.pos
        if self._line_starts is None:
            starts = [0]
            find = self.text.find
            i = find("\n")
            while i >= 0:
                starts.append(i + 1)
                i = find("\n", i + 1)
            self._line_starts = starts
        line = bisect.bisect_right(self._line_starts, pos)
        return line, pos - self._line_starts[line - 1] + 1

    def error(self, message: str, pos: int | None = None) -> ParseError:
        """A ParseError at ``pos`` (default: the next token after whitespace)."""
        if pos is None:
            pos = self.skip_ws()
        line, col = self.line_col(pos)
        return ParseError(message, line, col, self.source)

    def describe(self, pos: int | None = None) -> str:
        """Short description of what is at ``pos`` for error messages."""
        if pos is None:
            pos = self.skip_ws()
        if pos >= self.n:
            return "end of input"
        m = _IDENT.match(self.text, pos) or _INT.match(self.text, pos)
        tok = m.group(0) if m else self.text[pos]
        return repr(tok)

    # -- whitespace ----------------------------------------------------------------
    def skip_ws(self) -> int:
        pos = self.pos
        text = self.text
        if pos < self.n:
            c = text[pos]
            if c in " \t\n\r/":
                pos = _WS.match(text, pos).end()
                if pos < self.n and text[pos] == "/" and text.startswith("/*", pos):
                    raise self.error("unterminated /* comment", pos)
                self.pos = pos
        return pos

    def at_end(self) -> bool:
        return self.skip_ws() >= self.n

    # -- characters ----------------------------------------------------------------
    def peek(self) -> str:
        """The next non-blank character, or '' at the end."""
        pos = self.skip_ws()
        return self.text[pos] if pos < self.n else ""

    def startswith(self, s: str) -> bool:
        return self.text.startswith(s, self.skip_ws())

    def eat(self, ch: str) -> bool:
        pos = self.skip_ws()
        if self.text.startswith(ch, pos):
            self.pos = pos + len(ch)
            return True
        return False

    def expect(self, ch: str, message: str | None = None) -> int:
        """Consume ``ch`` (after blanks) and return its position, or raise
        ``<message> but found <token>``."""
        pos = self.skip_ws()
        if self.text.startswith(ch, pos):
            self.pos = pos + len(ch)
            return pos
        raise self.error(f"{message or f'expected {ch!r}'} but found {self.describe(pos)}", pos)

    # -- tokens --------------------------------------------------------------------
    def match(self, regex: re.Pattern) -> re.Match | None:
        pos = self.skip_ws()
        m = regex.match(self.text, pos)
        if m is not None:
            self.pos = m.end()
        return m

    def name(self, what: str = "name") -> str:
        """An identifier with an optional leading '%'."""
        pos = self.skip_ws()
        m = _NAME.match(self.text, pos)
        if m is None:
            raise self.error(f"expected {what} but found {self.describe(pos)}", pos)
        self.pos = m.end()
        return m.group(1)

    def ident(self, what: str = "identifier") -> str:
        pos = self.skip_ws()
        m = _IDENT.match(self.text, pos)
        if m is None:
            raise self.error(f"expected {what} but found {self.describe(pos)}", pos)
        self.pos = m.end()
        return m.group(0)

    def attr_name(self) -> str | None:
        """``name=`` (returns name, consumes '='), or None without consuming."""
        pos = self.skip_ws()
        m = _ATTR_NAME.match(self.text, pos)
        if m is None:
            return None
        self.pos = m.end()
        return m.group(1)

    def int(self, what: str = "integer") -> int:
        pos = self.skip_ws()
        m = _INT.match(self.text, pos)
        if m is None:
            raise self.error(f"expected {what} but found {self.describe(pos)}", pos)
        value = int(m.group(0))
        if not -2 ** 63 <= value < 2 ** 63:  # every integer attribute is an int64 field
            raise self.error(f"{what} {m.group(0)} does not fit in 64 bits", pos)
        self.pos = m.end()
        return value

    def keyword(self, word: str) -> bool:
        """Consume the identifier ``word`` if it is next (whole word only)."""
        pos = self.skip_ws()
        if self.text.startswith(word, pos):
            end = pos + len(word)
            if end >= self.n or not (self.text[end].isalnum() or self.text[end] in "_.-"):
                self.pos = end
                return True
        return False

    def bool(self) -> bool:
        if self.keyword("true"):
            return True
        if self.keyword("false"):
            return False
        raise self.error(f"expected true or false but found {self.describe()}")

    def string(self, what: str = "string") -> str:
        """A double-quoted C-escaped string, unescaped (UTF-8 decoded)."""
        pos = self.skip_ws()
        m = _STRING.match(self.text, pos)
        if m is None:
            raise self.error(f"expected {what} but found {self.describe(pos)}", pos)
        self.pos = m.end()
        body = m.group(1)
        if "\\" not in body:
            return body
        try:
            return c_unescape(body).decode("utf-8", errors="surrogateescape")
        except ValueError as e:
            raise self.error(f"bad escape in string: {e}", pos) from None

    def string_bytes(self, what: str = "string") -> bytes:
        pos = self.skip_ws()
        m = _STRING.match(self.text, pos)
        if m is None:
            raise self.error(f"expected {what} but found {self.describe(pos)}", pos)
        self.pos = m.end()
        try:
            return c_unescape(m.group(1))
        except ValueError as e:
            raise self.error(f"bad escape in string: {e}", pos) from None

    def number_token(self) -> str | None:
        """The text of the next integer/float/inf/nan token, or None."""
        pos = self.skip_ws()
        m = _NUMBER.match(self.text, pos)
        if m is None:
            return None
        self.pos = m.end()
        return m.group(0)

    def int_list(self, open_: str = "{", close: str = "}", sep: str = ",",
                 what: str = "integer list") -> list[int]:
        """``{1,2,3}`` (delimiters configurable); empty lists allowed."""
        self.expect(open_, f"expected '{open_}' to start {what}")
        out: list[int] = []
        if self.eat(close):
            return out
        while True:
            out.append(self.int())
            if self.eat(sep):
                continue
            self.expect(close, f"expected '{sep}' or '{close}' in {what}")
            return out

    def int_list_list(self, what: str = "list of integer lists") -> list[list[int]]:
        self.expect("{", f"expected '{{' to start {what}")
        out: list[list[int]] = []
        if self.eat("}"):
            return out
        while True:
            out.append(self.int_list(what=what))
            if self.eat(","):
                continue
            self.expect("}", f"expected ',' or '}}' in {what}")
            return out

    def balanced(self, what: str = "value") -> str:
        """The text of a balanced ``{...}`` (strings respected), consumed."""
        pos = self.skip_ws()
        if pos >= self.n or self.text[pos] != "{":
            raise self.error(f"expected '{{' to start {what} but found {self.describe(pos)}", pos)
        end = find_balanced_brace(self.text, pos)
        if end < 0:
            raise self.error(f"unbalanced '{{' in {what}", pos)
        self.pos = end
        return self.text[pos:end]


def find_balanced_brace(text: str, pos: int) -> int:
    """Index just past the '}' matching the '{' at ``pos`` (quoted strings skipped), or -1."""
    depth = 0
    n = len(text)
    i = pos
    find_any = _BRACE_OR_QUOTE.search
    while i < n:
        m = find_any(text, i)
        if m is None:
            return -1
        c = m.group(0)
        i = m.start()
        if c == '"':
            s = _STRING.match(text, i)
            if s is None:
                return -1
            i = s.end()
            continue
        if c == "{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


# -- C escaping (absl::CEscape / CUnescape) -------------------------------------------
_ESCAPES = {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", ord('"'): '\\"',
            ord("'"): "\\'", ord("\\"): "\\\\"}
_CESCAPE_TABLE = []
for _b in range(256):
    if _b in _ESCAPES:
        _CESCAPE_TABLE.append(_ESCAPES[_b])
    elif _b < 0x20 or _b >= 0x7F:
        _CESCAPE_TABLE.append("\\%03o" % _b)
    else:
        _CESCAPE_TABLE.append(chr(_b))
_NEEDS_ESCAPE = re.compile(r"[\x00-\x1f\x7f-\U0010ffff\"'\\]")


def c_escape(value: str | bytes) -> str:
    """absl::CEscape of the UTF-8 bytes (what XLA's printer uses for strings)."""
    if isinstance(value, str):
        if not _NEEDS_ESCAPE.search(value):
            return value
        value = value.encode("utf-8", errors="surrogateescape")
    table = _CESCAPE_TABLE
    return "".join([table[b] for b in value])


_SIMPLE_UNESCAPES = {"n": 10, "r": 13, "t": 9, '"': 34, "'": 39, "\\": 92, "?": 63,
                     "a": 7, "b": 8, "f": 12, "v": 11}


def c_unescape(body: str) -> bytes:
    """absl::CUnescape: C escapes (incl. octal, \\x hex, \\u/\\U) -> bytes."""
    out = bytearray()
    i = 0
    n = len(body)
    while i < n:
        c = body[i]
        if c != "\\":
            j = body.find("\\", i)
            if j < 0:
                j = n
            out += body[i:j].encode("utf-8", errors="surrogateescape")
            i = j
            continue
        if i + 1 >= n:
            raise ValueError("string ends with a backslash")
        e = body[i + 1]
        if e in _SIMPLE_UNESCAPES:
            out.append(_SIMPLE_UNESCAPES[e])
            i += 2
        elif e in "01234567":
            j = i + 1
            while j < n and j < i + 4 and body[j] in "01234567":
                j += 1
            v = int(body[i + 1:j], 8)
            if v > 255:
                raise ValueError(f"octal escape \\{body[i + 1:j]} out of range")
            out.append(v)
            i = j
        elif e == "x":
            j = i + 2
            while j < n and body[j] in "0123456789abcdefABCDEF":
                j += 1
            if j == i + 2:
                raise ValueError("\\x with no hex digits")
            v = int(body[i + 2:j], 16)
            if v > 255:
                raise ValueError("hex escape out of range")
            out.append(v)
            i = j
        elif e in "uU":
            k = 4 if e == "u" else 8
            hexs = body[i + 2:i + 2 + k]
            if len(hexs) != k or any(h not in "0123456789abcdefABCDEF" for h in hexs):
                raise ValueError(f"\\{e} needs {k} hex digits")
            out += chr(int(hexs, 16)).encode("utf-8")
            i += 2 + k
        else:
            raise ValueError(f"unknown escape \\{e}")
    return bytes(out)


def lexes_as_json_dict(value: str) -> bool:
    """XLA's LexesAsJsonDict: '{' ... balanced '}' (strings respected), then only blanks."""
    pos = _WS.match(value).end()
    if pos >= len(value) or value[pos] != "{":
        return False
    end = find_balanced_brace(value, pos)
    if end < 0:
        return False
    return _WS.match(value, end).end() == len(value)
