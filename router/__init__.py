"""cronoq-router: a stateless front that forwards calls to the leader of the shard that owns them."""

from cronoq.grpc_settings import load_grpc

load_grpc()  # before any module of the router imports grpc
