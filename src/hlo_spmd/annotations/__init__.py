"""User sharding annotations in every form they arrive in (classic, Sharding custom-calls,
manual-region boundaries, Shardy attributes), read into ``HloSharding``."""
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
from hlo_spmd.annotations.sdy import (
    AxisRef,
    DimSharding,
    MeshAxis,
    SdyMesh,
    TensorSharding,
    parse_manual_axes,
    parse_mesh,
    parse_meshes,
    parse_sharding,
    parse_sharding_per_value,
    parse_shardings,
    to_hlo_sharding,
)

__all__ = [
    "ORIGINS", "AnnotationRecord", "AnnotationReport", "ManualBoundary", "ManualRegion",
    "module_device_count", "module_meshes", "normalize_annotations", "parse_unspecified_dims",
    "AxisRef", "DimSharding", "MeshAxis", "SdyMesh", "TensorSharding", "parse_manual_axes",
    "parse_mesh", "parse_meshes", "parse_sharding", "parse_sharding_per_value",
    "parse_shardings", "to_hlo_sharding",
]
