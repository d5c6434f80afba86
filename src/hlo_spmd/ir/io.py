"""Load and save modules in every form users have; the format is detected from content.

Forms: serialized HloModuleProto, the HloProto / HloSnapshot wrappers that XLA's
``--xla_dump_hlo_as_proto`` writes, and HLO text. Saving is atomic: a failed save
leaves no partial file behind.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from google.protobuf.message import DecodeError

from hlo_spmd.errors import InputError
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.proto_io import module_from_proto, module_to_proto
from hlo_spmd.proto import hlo_pb2

TEXT_SUFFIXES = (".hlo", ".txt", ".hlotxt", ".mlir_hlo")


def looks_like_text(data: bytes) -> bool:
    """HLO text starts (after blank lines / comments) with ``HloModule``, or, as XLA's
    parser also accepts, with the ``ENTRY`` computation of a module without a header."""
    try:
        head = data[:4096].decode("utf-8")
    except UnicodeDecodeError:
        head = data[:4096].decode("utf-8", errors="replace")
        if "\ufffd" in head[:64]:
            return False
    for line in head.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("//") or stripped.startswith("#"):
            continue
        return stripped.startswith("HloModule") or stripped.split(None, 1)[0] == "ENTRY"
    return False


def _is_plausible_module(m: hlo_pb2.HloModuleProto) -> bool:
    return bool(m.computations) and bool(m.entry_computation_name or m.entry_computation_id)


def decode_module_proto(data: bytes, source: str) -> hlo_pb2.HloModuleProto:
    """The HloModuleProto in ``data``: bare, or inside an HloProto or HloSnapshot."""
    candidates = (
        ("HloModuleProto", hlo_pb2.HloModuleProto, lambda m: m),
        ("HloProto", hlo_pb2.HloProto, lambda m: m.hlo_module),
        ("HloSnapshot", hlo_pb2.HloSnapshot, lambda m: m.hlo.hlo_module),
    )
    errors = []
    for label, cls, unwrap in candidates:
        msg = cls()
        try:
            msg.ParseFromString(data)
        except (DecodeError, RuntimeError, ValueError) as e:
            errors.append(f"{label}: {e}")
            continue
        module = unwrap(msg)
        if _is_plausible_module(module):
            return module
    if not data:
        raise InputError("empty file, not an HLO module", source)
    detail = errors[0] if errors else "no computations or entry computation found"
    raise InputError(f"not a serialized HloModuleProto/HloProto/HloSnapshot nor HLO text ({detail})",
                     source)


def load_module_bytes(data: bytes, source: str = "<bytes>") -> Module:
    if looks_like_text(data):
        from hlo_spmd.ir.text_parser import parse_module

        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"HLO text is not valid UTF-8 (byte {e.start})", source) from None
        return parse_module(text, source)
    return module_from_proto(decode_module_proto(data, source), source, consume=True)


def load_module(path: str | os.PathLike, verify: bool = False) -> Module:
    """Load a module from a file; with ``verify``, also run the structural verifier."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError("no such file", str(path)) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a module file", str(path)) from None
    except PermissionError:
        raise InputError("permission denied", str(path)) from None
    module = load_module_bytes(data, str(path))
    if verify:
        verify_with_source(module, str(path))
    return module


def verify_with_source(module: Module, source: str) -> None:
    """Run the verifier; its errors name the file as well as the instruction."""
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.ir.verifier import verify_module

    try:
        verify_module(module)
    except HloSpmdError as e:
        e.where = f"{source}: {e.where}" if e.where else source
        e.args = (f"{e.where}: {e.message}",)
        raise


def module_bytes(module: Module) -> bytes:
    return module_to_proto(module).SerializeToString()


def module_text(module: Module) -> str:
    from hlo_spmd.ir.text_printer import print_module

    return print_module(module)


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write via a temporary file in the same directory, then rename: never a partial file."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise InputError("output directory does not exist", str(directory))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def output_format(path: str | os.PathLike, fmt: str | None = None) -> str:
    """'text' or 'proto': explicit ``fmt``, else from the file suffix (.pb default)."""
    if fmt:
        if fmt not in ("text", "proto"):
            raise InputError(f"unknown output format {fmt!r} (use text or proto)")
        return fmt
    return "text" if str(path).endswith(TEXT_SUFFIXES) else "proto"


def save_module(module: Module, path: str | os.PathLike, fmt: str | None = None) -> None:
    """Serialize fully in memory first, so an error leaves no output file at all."""
    if output_format(path, fmt) == "text":
        data = module_text(module).encode("utf-8")
    else:
        data = module_bytes(module)
    write_atomic(path, data)
