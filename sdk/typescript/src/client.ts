/**
 * `Client`: the producer side of the gRPC API (the Tasks service): submit tasks, wait for them, inspect
 * and cancel them, watch their status changes. The Python SDK's `cronoq.client.Client` does the same
 * with the same rules (docs/sdk-python.md, "Producers").
 */

import * as grpc from "@grpc/grpc-js";

import { decodeJson, decodeText } from "./codec.js";
import { type ConnectionOptions, Connector, statusError } from "./connect.js";
import { Cancelled, TimeoutError } from "./errors.js";
import {
  type StatusEvent,
  type SubmitResponse,
  type TaskInfo as WireTaskInfo,
  type TaskResult,
  type TaskSpec,
  TasksService,
  type WatchRequest,
} from "./gen/cronoq/v1/cronoq.js";
import { type TaskOptions, task } from "./spec.js";
import { TERMINAL_STATUSES, type TaskRef, dateOf, duration, priorityName, statusName, taskId, wireRef } from "./wire.js";

// Added to a waiting call's own deadline so that the server's answer (the result, or its own
// DEADLINE_EXCEEDED) arrives before the client gives up on the call.
const WAIT_MARGIN_S = 5;
/** Invocation metadata of Get, Cancel and Wait: the pool of the task named. */
const POOL_KEY = "cronoq-pool";
/** Initial metadata of a Watch: the shards it could not reach, comma-separated. */
const UNAVAILABLE_SHARDS_KEY = "cronoq-unavailable-shards";

/** How a task ended, or `undefined` fields while it has not. */
export class Result {
  readonly id: bigint;
  /** "succeeded", "failed", "dead_lettered", "cancelled", ... */
  readonly status: string;
  /** The output of a task that succeeded, while the server holds it. */
  readonly output: Buffer | undefined;
  readonly message: string;
  /** False for a task that succeeded once the server no longer holds its output. */
  readonly outputAvailable: boolean;

  constructor(wire: TaskResult) {
    this.id = wire.id;
    this.status = statusName(wire.status);
    this.output = wire.output;
    this.message = wire.message;
    this.outputAvailable = wire.outputAvailable;
  }

  get ok(): boolean {
    return this.status === "succeeded";
  }

  /** The output parsed as JSON (`null` when empty or absent). */
  json<T = unknown>(): T {
    return decodeJson(this.output ?? Buffer.alloc(0)) as T;
  }

  /** The output as UTF-8 text ("" when empty or absent). */
  text(): string {
    return decodeText(this.output ?? Buffer.alloc(0));
  }
}

/** What `submit` answers: the task's id, whether its key named an existing task, and with `wait`, how
 * it ended. */
export interface Submitted {
  id: bigint;
  /** The key named a task that already existed: `id` is that task's, and this payload was ignored. */
  duplicate: boolean;
  result: Result | undefined;
}

/** A task as `get` returns it. Only `id` and `status` are guaranteed; the rest is best effort. */
export interface TaskInfo {
  id: bigint;
  status: string;
  pool: string;
  key: string | undefined;
  kind: string;
  attempt: number;
  maxAttempts: number;
  createdAt: Date | undefined;
  startedAt: Date | undefined;
  finishedAt: Date | undefined;
  message: string;
  outputAvailable: boolean;
  tenant: string | undefined;
  priority: string | undefined;
  /** Whether the status is terminal. */
  done: boolean;
}

/** A status change, as `watch` yields it. */
export interface Event {
  id: bigint;
  pool: string;
  key: string | undefined;
  status: string;
  attempt: number;
  at: Date;
  message: string;
}

/** Options of `submit`: the task's, and how to wait. */
export interface SubmitOptions extends TaskOptions {
  /** Return once the task has finished, with `result` set. */
  wait?: boolean;
  /** Seconds to wait at most (the server caps it with `limits.max_wait_s`). Needs `wait`. */
  waitTimeout?: number;
  /** Seconds the whole call may take (default `waitTimeout` + 5): then `TimeoutError`, and the task stays submitted. */
  callTimeout?: number;
}

/** Options of `watch`. With none, every pool's terminal statuses. */
export interface WatchOptions {
  pools?: string[];
  ids?: (bigint | number)[];
  keys?: string[];
  /** Every transition, not only terminal statuses. */
  allTransitions?: boolean;
}

const SUBMIT_ONLY: ReadonlySet<string> = new Set(["wait", "waitTimeout", "callTimeout"]);

interface Method<Req, Resp> {
  readonly path: string;
  readonly requestSerialize: (value: Req) => Buffer;
  readonly responseDeserialize: (value: Buffer) => Resp;
}

/**
 * Submits, inspects, waits for and cancels tasks, and watches their status changes. Every failed call
 * rejects with an `ApiError` subclass named for its gRPC status; waits that run out reject with
 * `TimeoutError`. `close()` releases the connection.
 */
export class Client {
  private readonly connector: Connector;
  private channel: grpc.Client | undefined;

  constructor(options: string | ConnectionOptions) {
    this.connector = new Connector(typeof options === "string" ? { target: options } : options);
  }

  /** Closes the connection; a later call opens a new one. */
  close(): void {
    this.channel?.close();
    this.channel = undefined;
  }

  private client(): grpc.Client {
    this.channel ??= this.connector.open(this.connector.home);
    return this.channel;
  }

  private metadata(pool: string | undefined): grpc.Metadata {
    const metadata = this.connector.metadata.clone();
    if (pool) {
      metadata.set(POOL_KEY, pool);
    }
    return metadata;
  }

  /** One unary call. For calls that wait for a task (`waits`), DEADLINE_EXCEEDED, from the server's wait
   * limit or the call's own deadline, means the wait ran out: `TimeoutError`. */
  private unary<Req, Resp>(
    method: Method<Req, Resp>,
    request: Req,
    options: { deadline?: number | undefined; waits?: boolean; pool?: string | undefined } = {},
  ): Promise<Resp> {
    const callOptions: grpc.CallOptions = {};
    if (options.deadline !== undefined) {
      callOptions.deadline = Date.now() + options.deadline * 1000;
    }
    return new Promise((resolve, reject) => {
      this.client().makeUnaryRequest(
        method.path,
        method.requestSerialize,
        method.responseDeserialize,
        request,
        this.metadata(options.pool),
        callOptions,
        (err: grpc.ServiceError | null, response?: Resp) => {
          if (err) {
            if (options.waits && err.code === grpc.status.DEADLINE_EXCEEDED) {
              reject(new TimeoutError(err.details || "timed out waiting for the task"));
            } else {
              reject(statusError(err));
            }
          } else {
            resolve(response as Resp);
          }
        },
      );
    });
  }

  /**
   * Submits one task. With `wait`, the call returns once the task has finished, with `result` set.
   * Options are checked before anything is sent (a `TypeError` or `RangeError` naming the option).
   */
  async submit(payload?: unknown, options: SubmitOptions = {}): Promise<Submitted> {
    const { wait = false, waitTimeout, callTimeout } = options;
    if (waitTimeout !== undefined && !wait) {
      throw new RangeError("waitTimeout needs wait: true");
    }
    const waitS = duration("waitTimeout", waitTimeout);
    const deadline = duration("callTimeout", callTimeout) ?? (waitS === undefined ? undefined : waitS + WAIT_MARGIN_S);
    const spec = task(payload, options, SUBMIT_ONLY);
    const response = await this.unary(TasksService.submit, { task: spec, wait, waitTimeoutS: waitS }, { deadline, waits: true });
    return submitted(response);
  }

  /** Submits specs built with `task()` atomically: all are accepted or none. Results come back in input
   * order; specs may depend on keys defined in the same batch. */
  async submitBatch(specs: readonly TaskSpec[]): Promise<Submitted[]> {
    const response = await this.unary(TasksService.submitBatch, { tasks: [...specs] });
    return response.tasks.map(submitted);
  }

  /** The task with this id or key (of `pool`, if given); `NotFound` if the server does not know it. */
  async get(ref: TaskRef, options: { pool?: string } = {}): Promise<TaskInfo> {
    const info = await this.unary(TasksService.get, { task: wireRef(ref) }, { pool: options.pool });
    return taskInfo(info);
  }

  /** Cancels a live task (of `pool`, if given); false when it had already finished. */
  async cancel(ref: TaskRef, options: { pool?: string } = {}): Promise<boolean> {
    const response = await this.unary(TasksService.cancel, { task: wireRef(ref) }, { pool: options.pool });
    return response.cancelled;
  }

  /** Waits until the task (of `pool`, if given) is terminal, for up to `timeout` seconds (the server
   * caps the wait): `TimeoutError` when it runs out, `Unavailable` if the leader changes meanwhile. */
  async wait(ref: TaskRef, options: { timeout?: number; pool?: string } = {}): Promise<Result> {
    const timeoutS = duration("timeout", options.timeout);
    const deadline = timeoutS === undefined ? undefined : timeoutS + WAIT_MARGIN_S;
    const result = await this.unary(
      TasksService.wait,
      { task: wireRef(ref), timeoutS },
      { deadline, waits: true, pool: options.pool },
    );
    return new Result(result);
  }

  /**
   * Status changes as they happen (terminal ones only unless `allTransitions`), as an async iterator:
   * `for await (const event of client.watch({ pools: ["gpu"] }))`. Breaking out of the loop, or
   * `close()`, cancels the call. The stream ends with `Unavailable` when the server shuts down or
   * loses leadership, and with `DataLoss` when this consumer falls too far behind.
   */
  watch(options: WatchOptions = {}): EventStream {
    const request: WatchRequest = {
      pools: [...(options.pools ?? [])],
      ids: (options.ids ?? []).map((id, i) => taskId(`ids[${i}]`, id)),
      keys: [...(options.keys ?? [])],
      allTransitions: options.allTransitions ?? false,
    };
    const method = TasksService.watch;
    const call = this.client().makeServerStreamRequest(
      method.path,
      method.requestSerialize,
      method.responseDeserialize,
      request,
      this.metadata(undefined),
      {},
    );
    return new EventStream(call);
  }
}

/** The events of one Watch call, in order. */
export class EventStream implements AsyncIterable<Event> {
  private closed = false;
  private readonly initial: Promise<grpc.Metadata>;

  /** @internal */
  constructor(private readonly call: grpc.ClientReadableStream<StatusEvent>) {
    this.initial = new Promise((resolve, reject) => {
      call.once("metadata", resolve);
      call.once("status", (status: grpc.StatusObject) => {
        reject(status.code === grpc.status.OK ? new Cancelled("the Watch ended before it began") : statusError(status));
      });
    });
    this.initial.catch(() => undefined); // read by unavailableShards(), if anyone asks
    call.on("error", () => undefined); // iteration reports it
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Event> {
    try {
      for await (const message of this.call as AsyncIterable<StatusEvent>) {
        yield event(message);
      }
    } catch (err) {
      if (this.closed) {
        return;
      }
      throw isServiceError(err) ? statusError(err) : err;
    } finally {
      this.close();
    }
  }

  /** Names of the shards whose events this stream does not carry because they could not be reached
   * when it opened; empty when every shard answered (and always from a single server). */
  async unavailableShards(): Promise<string[]> {
    const metadata = await this.initial;
    const value = metadata.get(UNAVAILABLE_SHARDS_KEY)[0];
    return String(value ?? "")
      .split(",")
      .filter((name) => name !== "");
  }

  /** Cancels the call; iterating afterwards ends at once. */
  close(): void {
    if (!this.closed) {
      this.closed = true;
      this.call.cancel();
    }
  }
}

function isServiceError(err: unknown): err is grpc.ServiceError {
  return err instanceof Error && typeof (err as Partial<grpc.ServiceError>).code === "number";
}

function submitted(wire: SubmitResponse): Submitted {
  return {
    id: wire.id,
    duplicate: wire.duplicate,
    result: wire.result === undefined ? undefined : new Result(wire.result),
  };
}

function taskInfo(wire: WireTaskInfo): TaskInfo {
  const status = statusName(wire.status);
  return {
    id: wire.id,
    status,
    pool: wire.pool,
    key: wire.key || undefined,
    kind: wire.kind,
    attempt: wire.attempt,
    maxAttempts: wire.maxAttempts,
    createdAt: dateOf(wire.createdUnixNs),
    startedAt: dateOf(wire.startedUnixNs),
    finishedAt: dateOf(wire.finishedUnixNs),
    message: wire.message,
    outputAvailable: wire.outputAvailable,
    tenant: wire.tenant || undefined,
    priority: priorityName(wire.priority),
    done: TERMINAL_STATUSES.has(status),
  };
}

function event(wire: StatusEvent): Event {
  return {
    id: wire.id,
    pool: wire.pool,
    key: wire.key || undefined,
    status: statusName(wire.status),
    attempt: wire.attempt,
    at: dateOf(wire.atUnixNs) ?? new Date(0),
    message: wire.message,
  };
}
