from hlo_spmd.proto import xla_data_pb2, hlo_pb2

__all__ = ["xla_data_pb2", "hlo_pb2"]
