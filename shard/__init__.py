"""cronoq-server: the scheduler's server around the engine (stores, leadership, transports)."""

from cronoq.grpc_settings import load_grpc

load_grpc()  # before any module of the server imports grpc
