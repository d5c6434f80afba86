"""User sharding annotations in every form they arrive in (classic, Sharding custom-calls,
manual-region boundaries, Shardy attributes), read into ``HloSharding``."""
import importlib.util
import sys


def _lazy_submodule(name: str):  # type: ignore[no-untyped-def]
    """``name`` in sys.modules as a module whose code runs at its first attribute access
    (stdlib ``importlib.util.LazyLoader``). Shardy parsing is needed only by modules that
    carry ``xla.sdy.*`` attributes; its six dataclasses cost ~5 ms to create on every
    plain GSPMD run otherwise."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, name
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# Bound before normalize/manual import it, so their ``from hlo_spmd.annotations import
# sdy`` gets the lazy module.
sdy = _lazy_submodule(__name__ + ".sdy")

from hlo_spmd.annotations.normalize import (
    ORIGINS,
    AnnotationRecord,
    AnnotationReport,
    ManualBoundary,
    ManualRegion,
    module_device_count,
    module_meshes,
    normalize_annotations,
    parse_unspecified_dims,
)
__all__ = [
    "ORIGINS", "AnnotationRecord", "AnnotationReport", "ManualBoundary", "ManualRegion",
    "module_device_count", "module_meshes", "normalize_annotations", "parse_unspecified_dims",
    "AxisRef", "DimSharding", "MeshAxis", "SdyMesh", "TensorSharding", "parse_manual_axes",
    "parse_mesh", "parse_meshes", "parse_sharding", "parse_sharding_per_value",
    "parse_shardings", "to_hlo_sharding",
]

_SDY_NAMES = frozenset({
    "AxisRef", "DimSharding", "MeshAxis", "SdyMesh", "TensorSharding", "parse_manual_axes",
    "parse_mesh", "parse_meshes", "parse_sharding", "parse_sharding_per_value",
    "parse_shardings", "to_hlo_sharding",
})


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    # PEP 562: the Shardy names are read from the lazy module on first use.
    if name in _SDY_NAMES:
        return getattr(sdy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
