"""The on-disk cache of XLA's dumps: keyed by sha256(module bytes, module id cleared), N,
the jaxlib version, the shardy flag and the pass list, under
``~/.cache/hlo-spmd/xla-reference`` (``HLO_SPMD_XLA_CACHE=DIR`` overrides it,
``HLO_SPMD_XLA_CACHE=off`` disables it). Failed compiles are not cached.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from hlo_spmd.runtime.xla_dumps import PassDump, XlaDumps

CACHE_ENV = "HLO_SPMD_XLA_CACHE"
_CACHE_OFF = ("off", "0", "none", "false", "no")
_CACHE_FORMAT = 1  # bump when the cached layout changes


def cache_dir() -> Path | None:
    """The on-disk cache directory, or None when disabled (``HLO_SPMD_XLA_CACHE=off``)."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        if env.strip().lower() in _CACHE_OFF or not env.strip():
            return None
        return Path(env).expanduser()
    return Path.home() / ".cache" / "hlo-spmd" / "xla-reference"


def clear_cache(directory: str | os.PathLike | None = None) -> int:
    """Remove every cached entry; returns how many were removed."""
    root = Path(directory) if directory is not None else cache_dir()
    if root is None or not root.is_dir():
        return 0
    n = 0
    for entry in root.iterdir():
        if entry.is_dir() and (entry / "meta.json").exists():
            shutil.rmtree(entry, ignore_errors=True)
            n += 1
    return n


def _key_bytes(proto_bytes: bytes) -> bytes:
    """The module bytes with the module ``id`` cleared: jaxlib's text parser numbers
    modules with a process-wide counter, which must not defeat the cache."""
    from hlo_spmd.runtime.module_io import parse_module_proto

    proto = parse_module_proto(proto_bytes)
    if not proto.id:
        return proto_bytes
    proto.ClearField("id")
    return proto.SerializeToString(deterministic=True)


def _cache_key(proto_bytes: bytes, n: int, shardy: bool, passes: Sequence[str],
               version: str) -> str:
    h = hashlib.sha256(_key_bytes(proto_bytes)).hexdigest()
    extra = json.dumps([_CACHE_FORMAT, n, version, bool(shardy), list(passes)])
    return f"{h[:40]}-n{n}-{'sdy' if shardy else 'gspmd'}-" + \
        hashlib.sha256(extra.encode()).hexdigest()[:12]


def _write_cache(entry: Path, dumps: XlaDumps) -> None:
    root = entry.parent
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        items = {}
        for key, dump in list(dumps.after.items()) + (
                [("<input>", dumps.input)] if dumps.input is not None else []):
            base = f"{len(items):02d}"
            (tmp / f"{base}.txt").write_text(dump.text)
            (tmp / f"{base}.pb").write_bytes(dump.proto)
            items[base] = {"key": key, "label": dump.label, "stem": dump.file_stem}
        meta = {"format": _CACHE_FORMAT, "num_partitions": dumps.num_partitions,
                "shardy": dumps.shardy, "passes": list(dumps.passes), "error": dumps.error,
                "jaxlib": dumps.jaxlib_version, "seconds": dumps.seconds,
                "mode": dumps.mode, "items": items}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, entry)  # atomic; fails if another process won the race
        except OSError:
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _read_cache(entry: Path) -> XlaDumps | None:
    try:
        meta = json.loads((entry / "meta.json").read_text())
        if meta.get("format") != _CACHE_FORMAT:
            return None
        after: dict[str, PassDump] = {}
        inp = None
        for base, item in meta["items"].items():
            dump = PassDump(item["label"], item["stem"], (entry / f"{base}.txt").read_text(),
                            (entry / f"{base}.pb").read_bytes())
            if item["key"] == "<input>":
                inp = dump
            else:
                after[item["key"]] = dump
    except (OSError, ValueError, KeyError):
        return None
    return XlaDumps(int(meta["num_partitions"]), bool(meta["shardy"]), tuple(meta["passes"]),
                    after, inp, meta["error"], meta["jaxlib"], float(meta["seconds"]),
                    cached=True, cache_path=entry, mode=meta.get("mode", "inprocess"))
