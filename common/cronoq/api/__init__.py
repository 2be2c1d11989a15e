"""The two transports of the public API, shared by the shard server and the router (DESIGN principle 2).

gRPC servicers (:mod:`.grpc_api`) and HTTP/JSON routes (:mod:`.http_api`, with :mod:`.http_codec` and
:mod:`.openapi`) are thin adapters over a :class:`.handler.RequestHandler`: the shard's request logic,
or the router's forwarding layer. Validation, authorization and errors live in the handler.
"""
