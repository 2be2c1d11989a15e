/**
 * `cronoq/node`: remote workers (`runWorker`) and the producer `Client`, over gRPC with @grpc/grpc-js.
 * Everything the main entry point exports is here too.
 */

export * from "./index.js";
export {
  runWorker,
  Lease,
  LeaseAborted,
  PROTOCOL_VERSION,
  MAX_REDIRECTS,
  MAX_REPORT_CHARS,
  type Handler,
  type WorkerOptions,
  type Registration,
  type Disconnection,
} from "./worker.js";
export {
  Client,
  EventStream,
  Result,
  type Submitted,
  type TaskInfo,
  type Event,
  type SubmitOptions,
  type WatchOptions,
} from "./client.js";
export { task, type TaskOptions, type RetryOptions, type DepOption } from "./spec.js";
export type { TaskRef } from "./wire.js";
export type { ConnectionOptions, TlsOptions } from "./connect.js";
