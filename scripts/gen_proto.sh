#!/usr/bin/env bash
# Regenerate the committed protobuf Python modules (and .pyi stubs) from
# src/hlo_spmd/proto/*.proto.
#
# Requires the dev dependency grpcio-tools (it bundles protoc).  Keep the
# grpcio-tools version pinned in setup.cfg: the generated code records the
# protoc version and refuses to import on an older protobuf runtime.
set -euo pipefail

cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python}"

"$PYTHON" -m grpc_tools.protoc \
    -I src \
    --python_out=src \
    --pyi_out=src \
    src/hlo_spmd/proto/*.proto

echo "regenerated: $(ls src/hlo_spmd/proto/*_pb2.py src/hlo_spmd/proto/*_pb2.pyi | tr '\n' ' ')"
