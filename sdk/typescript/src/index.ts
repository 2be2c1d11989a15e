/**
 * The package's main entry point: the errors and the value mapping, which load no gRPC code. Workers
 * and the producer Client are in `cronoq/node` (Node 20+, on @grpc/grpc-js).
 */

export * from "./errors.js";
export { OCTET_STREAM, TEXT, JSON_TYPE, encode, decodeJson, decodeText, type Encoded } from "./codec.js";
