"""Benchmarks run by ``make bench``."""

from cronoq.grpc_settings import load_grpc

load_grpc()  # the raw-transport figures use the grpc settings cronoq runs with
