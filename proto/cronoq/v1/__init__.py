"""Generated protobuf and gRPC stubs for cronoq.v1 (``make proto``), beside the contract they come from.

The package also ships ``cronoq.proto`` itself, which ``cronoq-server --print-proto`` prints.
"""
