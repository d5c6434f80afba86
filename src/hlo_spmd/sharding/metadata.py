"""``OpMetadata`` attached to shardings: where an annotation came from.

Metadata never takes part in sharding equality.  The fields XLA prints in
sharding text are modelled; anything else a proto carries (profile_info,
payloads, sizes) rides along in ``extra`` as serialized bytes so a proto round
trip is lossless.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["OpMetadata", "c_escape"]


def c_escape(text: str) -> str:
    """absl::CEscape of the UTF-8 bytes, the escaping XLA's printer uses."""
    out: list[str] = []
    for b in text.encode("utf-8", errors="surrogateescape"):
        c = chr(b)
        if c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif c == '"':
            out.append('\\"')
        elif c == "'":
            out.append("\\'")
        elif c == "\\":
            out.append("\\\\")
        elif b < 0x20 or b >= 0x7F:
            out.append("\\%03o" % b)
        else:
            out.append(c)
    return "".join(out)


class OpMetadata(NamedTuple):
    """The text-visible OpMetadata fields (defaults mean "unset", as in proto3). A
    NamedTuple, not a dataclass: ~1 ms less start-up (Python 3.11 compiles a dataclass's
    methods)."""

    op_type: str = ""
    op_name: str = ""
    source_file: str = ""
    source_line: int = 0
    source_end_line: int = 0
    source_column: int = 0
    source_end_column: int = 0
    profile_type: tuple[int, ...] = ()
    deduplicated_name: str = ""
    scheduling_name: str = ""
    stack_frame_id: int = 0
    # Serialized OpMetadata holding only the fields not modelled above.
    extra: bytes = b""

    def to_text(self) -> str:
        """XLA's OpMetadataToString: set fields only, in XLA's order."""
        parts: list[str] = []
        if self.op_type:
            parts.append(f'op_type="{c_escape(self.op_type)}"')
        if self.op_name:
            parts.append(f'op_name="{c_escape(self.op_name)}"')
        if self.source_file:
            parts.append(f'source_file="{c_escape(self.source_file)}"')
        if self.source_line:
            parts.append(f"source_line={self.source_line}")
        if self.source_end_line:
            parts.append(f"source_end_line={self.source_end_line}")
        if self.source_column:
            parts.append(f"source_column={self.source_column}")
        if self.source_end_column:
            parts.append(f"source_end_column={self.source_end_column}")
        if self.profile_type:
            parts.append("profile_type={" + ",".join(map(str, self.profile_type)) + "}")
        if self.deduplicated_name:
            parts.append(f'deduplicated_name="{c_escape(self.deduplicated_name)}"')
        if self.scheduling_name:
            parts.append(f'scheduling_name="{c_escape(self.scheduling_name)}"')
        if self.stack_frame_id:
            parts.append(f"stack_frame_id={self.stack_frame_id}")
        return " ".join(parts)
