"""cronoq-router: a stateless front that forwards calls to the leader of the shard that owns them."""

from cronoq.grpc_settings import SERVER_VERBOSITY, load_grpc

load_grpc(SERVER_VERBOSITY)  # before any module of the router imports grpc
