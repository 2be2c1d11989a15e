"""cronoq-server: the scheduler's server around the engine (stores, leadership, transports)."""

from cronoq.grpc_settings import SERVER_VERBOSITY, load_grpc

load_grpc(SERVER_VERBOSITY)  # before any module of the server imports grpc
