/**
 * `runWorker`: serves one pool over a `Workers.Work` stream (worker protocol version 3), or over the
 * `BatchedWorkers.Work` extension where the server has it (docs/worker-protocol.md).
 *
 * The run owns the connection's life cycle (register, reconnect with backoff, follow shard redirects,
 * drain when its signal aborts); each stream is a `Session`, which owns the leases that arrived on it,
 * because a lease means nothing on any other stream: when a stream ends the server retries its leases
 * elsewhere, so their handlers are aborted rather than reported. The behaviour is the Python SDK's
 * `cronoq.client.Worker`, rule for rule.
 */

import type * as grpc from "@grpc/grpc-js";

import { decodeJson, decodeText, encode } from "./codec.js";
import {
  type ConnectionOptions,
  Connector,
  type Endpoint,
  type Redirect,
  Redirects,
  allowedHosts,
  shardRedirect,
  statusError,
} from "./connect.js";
import {
  type ApiError,
  CancelTask,
  CronoqError,
  FailedPrecondition,
  Internal,
  Permanent,
  Reject,
  Retryable,
  type StatusCode,
  checkRetryAfter,
} from "./errors.js";
import {
  type Lease as WireLease,
  type Registered,
  ServerBatch,
  ServerMessage,
  type Shutdown,
  WorkerBatch,
  WorkerMessage,
} from "./gen/cronoq/v1/cronoq.js";
import { priorityName } from "./wire.js";

/** The worker protocol version this SDK speaks. */
export const PROTOCOL_VERSION = 3;
/** Shard redirects followed in a row before `runWorker` gives up. */
export const MAX_REDIRECTS = 3;

// After the server says it is no longer the leader, the new one is usually serving within a second or
// two (a standby's poll plus recovery): retry UNAVAILABLE this often, for this long, before backing off.
const LEADER_HUNT_S = 15;
const LEADER_HUNT_DELAY_S = 0.1;
/** Statuses retrying cannot fix: `runWorker` rejects with them instead of reconnecting. */
const FATAL_CODES: ReadonlySet<StatusCode> = new Set([
  "unauthenticated",
  "permission_denied",
  "not_found",
  "failed_precondition",
  "invalid_argument",
  "unimplemented",
]);
const DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024; // gRPC's default, for servers that do not say
const OUTPUT_HEADROOM = 1024; // room for the Complete message around the output bytes
// What a message adds to a batch beyond its own size: its tag and length (docs/worker-protocol.md).
const FRAMING_BYTES = 6;
const MIN_HEARTBEAT_INTERVAL_S = 0.01;
const CLOSE_WAIT_S = 5; // how long a drain waits for the server to end the stream after the half-close
/** Characters of a report (a failure's message, a nack's reason) a server keeps. */
export const MAX_REPORT_CHARS = 8192;

const WORK = "/cronoq.v1.Workers/Work";
const BATCHED_WORK = "/cronoq.v1.BatchedWorkers/Work";

/** What a handler gets: one attempt of a task. */
export type Handler = (lease: Lease) => unknown;

/** Options of {@link runWorker}; the connection settings are those of `Client`. */
export interface WorkerOptions extends ConnectionOptions {
  /** The pool to serve. */
  pool: string;
  /** How many handlers run at once (default 1). The server may grant fewer. */
  slots?: number;
  /** Shown in the server's list of workers. */
  name?: string;
  /** Registers the worker with labels: tasks submitted with labels run only on workers that have them all. */
  labels?: Record<string, string>;
  /** Seconds that running handlers get to finish once `signal` aborts (default 30); then they are aborted. */
  drainTimeout?: number;
  /** Lets shard redirects send the token over plain http:// to another host. Trusted networks only. */
  insecureRedirectHttp?: boolean;
  /** Where shard redirects may lead, instead of the shard endpoints the servers name: URLs
   * (scheme, host and port), host names (any port) and `*.suffix` for the names under `suffix`. */
  redirectAllow?: string[];
  /** Aborting it stops the worker: no new leases, running handlers drain for up to `drainTimeout`. */
  signal?: AbortSignal;
  /** Use the server's BatchedWorkers extension where it has one (default true). */
  batches?: boolean;
  /** Seconds between reconnects: starts at `initial` (0.1), doubles up to `max` (5). */
  backoff?: { initial?: number; max?: number };
  /** Called on each registration (the first and every reconnect). */
  onRegistered?: (registration: Registration) => void;
  /** Called when a stream ended and the worker is about to connect again. */
  onDisconnected?: (disconnection: Disconnection) => void;
}

/** What the server granted on a registration. */
export interface Registration {
  workerId: bigint;
  /** At most the slots asked for. */
  grantedSlots: number;
  /** The pool's lease TTL in seconds, when it has one: the worker heartbeats every third of it. */
  leaseTtl: number | undefined;
  serverProtocol: number;
  maxMessageBytes: number;
  /** Whether the stream is the BatchedWorkers extension. */
  batched: boolean;
  /** The server, as `http(s)://host:port`: after a shard redirect, the shard's. */
  endpoint: string;
  /** Registrations so far, this one included. */
  connections: number;
}

/** Why a stream ended, and when the worker connects again. */
export interface Disconnection {
  /** The status the stream ended with, if it was not a clean end. */
  error: ApiError | undefined;
  /** The reason of the server's Shutdown, if it sent one. */
  shutdown: string | undefined;
  /** Seconds until the next attempt to connect (0: at once). */
  delay: number;
}

/** The reason `lease.signal` carries once the attempt is over for this worker. */
export class LeaseAborted extends CronoqError {}

/**
 * One attempt of a task, handed to the handler. `taskId` and `id` (the lease) are bigints: task ids
 * carry their shard's number in the top 8 bits, beyond what a JavaScript number holds exactly.
 */
export class Lease {
  private controller: AbortController | undefined;
  private abortReason: LeaseAborted | undefined;

  /** @internal */
  constructor(
    private readonly wire: WireLease,
    /** The heartbeat bound in seconds: the worker heartbeats for the handler. */
    readonly leaseTtl: number | undefined,
  ) {}

  /** The lease's id: unique per attempt. */
  get id(): bigint {
    return this.wire.lease;
  }
  get taskId(): bigint {
    return this.wire.taskId;
  }
  /** 1 for the first attempt. */
  get attempt(): number {
    return this.wire.attempt;
  }
  get payload(): Buffer {
    return this.wire.payload;
  }
  get contentType(): string {
    return this.wire.contentType;
  }
  get kind(): string {
    return this.wire.kind;
  }
  /** The task's key, if it has one. */
  get key(): string | undefined {
    return this.wire.key || undefined;
  }
  /** Include `traceparent` (and `tracestate`) when the task carries a trace context. */
  get tags(): Record<string, string> {
    return this.wire.tags;
  }
  /** The limit for this attempt, in seconds. */
  get timeout(): number | undefined {
    return this.wire.timeoutS;
  }
  /** The task's soft deadline. */
  get deadline(): Date | undefined {
    const ns = this.wire.deadlineUnixNs;
    return ns === undefined ? undefined : new Date(Number(ns / 1_000_000n));
  }
  get pool(): string {
    return this.wire.pool;
  }
  /** The class name ("high", ...), or undefined if the server does not say. */
  get priority(): string | undefined {
    return priorityName(this.wire.priority);
  }

  /** The payload parsed as JSON (`null` for an empty payload). */
  json<T = unknown>(): T {
    return decodeJson(this.wire.payload) as T;
  }

  /** The payload as UTF-8 text. */
  text(): string {
    return decodeText(this.wire.payload);
  }

  /**
   * Aborted when the attempt is over for this worker: the server aborted it (timeout, cancellation,
   * lease expiry), the stream ended, or the worker stopped and `drainTimeout` ran out. Its `reason` is a
   * {@link LeaseAborted} saying which. Whatever the handler does afterwards is not reported.
   */
  get signal(): AbortSignal {
    // Made on first use: most handlers never look, and a controller per lease costs CPU per task.
    if (this.controller === undefined) {
      this.controller = new AbortController();
      if (this.abortReason !== undefined) {
        this.controller.abort(this.abortReason);
      }
    }
    return this.controller.signal;
  }

  /** @internal */
  abort(why: string): void {
    if (this.abortReason === undefined) {
      this.abortReason = new LeaseAborted(why);
      this.controller?.abort(this.abortReason);
    }
  }
}

/**
 * Runs `handler` for the leases of `options.pool`, at most `slots` at a time (or fewer if the server
 * grants fewer), until `options.signal` aborts; then running handlers get `drainTimeout` seconds to
 * finish. Resolves once the worker has stopped; rejects with an `ApiError` for problems retrying cannot
 * fix (a refused token, an unknown pool, a refused or too many redirects).
 *
 * The handler's return value completes the task (a Buffer or Uint8Array as is, a string as text,
 * undefined or null as nothing, anything else as JSON); a thrown `Retryable` or `Permanent` fails the
 * attempt, `Reject` hands the lease back, `CancelTask` cancels the task, and anything else thrown is a
 * retryable failure "Name: message".
 */
export async function runWorker(options: WorkerOptions, handler: Handler): Promise<void> {
  if (typeof handler !== "function") {
    throw new TypeError("runWorker(options, handler): handler must be a function");
  }
  await new WorkerRun(options, handler).serve();
}

/** The settings of a run, checked. */
interface Settings {
  pool: string;
  slots: number;
  name: string;
  labels: Record<string, string>;
  drainTimeout: number;
  batches: boolean;
  backoff: [number, number];
}

function settings(options: WorkerOptions): Settings {
  if (typeof options !== "object" || options === null) {
    throw new TypeError("runWorker: options must be an object");
  }
  if (typeof options.pool !== "string" || options.pool === "") {
    throw new TypeError(`pool: expected the name of a pool (got ${JSON.stringify(options.pool)})`);
  }
  const slots = options.slots ?? 1;
  if (!Number.isInteger(slots) || slots < 1 || slots > 0xffffffff) {
    throw new RangeError(`slots must be an integer >= 1 (got ${String(slots)})`);
  }
  const drainTimeout = options.drainTimeout ?? 30;
  const initial = options.backoff?.initial ?? 0.1;
  const max = options.backoff?.max ?? 5;
  for (const [field, value] of [
    ["drainTimeout", drainTimeout],
    ["backoff.initial", initial],
    ["backoff.max", max],
  ] as const) {
    if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
      throw new RangeError(`${field} must be a finite number of seconds >= 0 (got ${String(value)})`);
    }
  }
  if (initial <= 0 || max < initial) {
    throw new RangeError(`backoff must have 0 < initial <= max (got initial ${initial}, max ${max})`);
  }
  const labels: Record<string, string> = {};
  for (const [key, value] of Object.entries(options.labels ?? {})) {
    labels[key] = String(value);
  }
  if (options.signal !== undefined && !(options.signal instanceof AbortSignal)) {
    throw new TypeError("signal must be an AbortSignal");
  }
  return {
    pool: options.pool,
    slots,
    name: options.name ?? "",
    labels,
    drainTimeout,
    batches: options.batches ?? true,
    backoff: [initial, max],
  };
}

/** One call of `runWorker`. */
class WorkerRun {
  readonly settings: Settings;
  readonly connector: Connector;
  private readonly redirects: Redirects;
  private readonly signal: AbortSignal | undefined;
  stopping = false;
  // Endpoints that answered BatchedWorkers.Work with UNIMPLEMENTED, until a stream with them ends: a
  // server upgraded meanwhile gets the extension asked for again.
  private readonly unbatched = new Set<string>();
  private session: Session | undefined;
  private drained: Promise<void> | undefined;
  private wake: (() => void) | undefined;
  connections = 0;

  constructor(
    private readonly options: WorkerOptions,
    readonly handler: Handler,
  ) {
    this.settings = settings(options);
    this.connector = new Connector(options);
    this.redirects = new Redirects(
      this.connector.home,
      Boolean(options.token),
      options.insecureRedirectHttp ?? false,
      allowedHosts(options.redirectAllow),
    );
    this.signal = options.signal;
  }

  async serve(): Promise<void> {
    const signal = this.signal;
    if (signal?.aborted) {
      return; // stopped before it started: never connect
    }
    const onAbort = (): void => this.stop();
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      await this.loop();
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
  }

  private stop(): void {
    this.stopping = true;
    this.wake?.();
    if (this.session !== undefined && this.drained === undefined) {
      this.drained = this.session.drain(this.settings.drainTimeout);
    }
  }

  private async loop(): Promise<void> {
    const [initial, ceiling] = this.settings.backoff;
    let endpoint = this.connector.home;
    let delay = initial;
    let redirects = 0;
    let huntUntil = 0; // after Shutdown{not_leader}: look for the new leader briskly until then
    let client: grpc.Client | undefined; // kept from a stream refused for want of batches
    while (!this.stopping) {
      const batched = this.settings.batches && !this.unbatched.has(endpoint.key);
      client ??= this.connector.open(endpoint);
      const session = new Session(this, endpoint, client, batched);
      this.session = session;
      const began = now();
      await session.done;
      this.session = undefined;
      const unbatched = session.refusedBatches();
      if (!unbatched || this.stopping) {
        await this.drained;
        client.close();
        client = undefined;
      }
      if (this.stopping) {
        return;
      }
      if (unbatched) {
        // A server without the extension: Workers.Work at once, on the same connection.
        this.unbatched.add(endpoint.key);
        continue;
      }
      if (!batched && session.registered) {
        this.unbatched.delete(endpoint.key);
      }
      if (now() - began > 10 * ceiling) {
        delay = initial;
      }
      const error = session.error;
      if (error !== undefined && session.redirect !== undefined) {
        redirects += 1;
        if (redirects > MAX_REDIRECTS) {
          throw new FailedPrecondition(
            `gave up after ${MAX_REDIRECTS} shard redirects in a row (the last pointed to ${JSON.stringify(session.redirect.url)})`,
          );
        }
        endpoint = this.redirects.follow(endpoint, session.redirect);
        continue;
      }
      redirects = 0;
      if (error !== undefined && FATAL_CODES.has(error.code)) {
        throw error;
      }
      if (error?.code === "unavailable") {
        endpoint = this.connector.home; // a redirected-to shard is down: ask the configured target again
      }
      let wait = delay;
      if (session.shutdown?.notLeader) {
        huntUntil = now() + LEADER_HUNT_S;
        wait = 0; // leadership moved: the new leader is ready now, or in a moment
      } else if (error?.code === "unavailable" && now() < huntUntil) {
        wait = LEADER_HUNT_DELAY_S; // a standby, or the new leader still recovering
      } else {
        delay = Math.min(delay * 2, ceiling);
      }
      this.options.onDisconnected?.({ error, shutdown: session.shutdown?.reason, delay: wait });
      if (wait > 0) {
        await this.pause(wait);
      }
    }
  }

  /** The reconnect backoff, cut short by a stop. */
  private pause(seconds: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = setTimeout(done, seconds * 1000);
      this.wake = done;
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
    }).then(() => {
      this.wake = undefined;
    });
  }

  registered(registration: Omit<Registration, "connections">): void {
    this.connections += 1;
    this.options.onRegistered?.({ ...registration, connections: this.connections });
  }
}

function now(): number {
  return performance.now() / 1000;
}

/** A message to send and a bound on its encoded size (what it adds to a frame, framing included). */
interface Outgoing {
  message: WorkerMessage;
  size: number;
}

interface Attempt {
  lease: Lease;
  heartbeat: NodeJS.Timeout | undefined;
}

/** One Work stream (`batched`: a BatchedWorkers.Work stream). Once `done` resolves, `error`,
 * `redirect` and `shutdown` say why it ended. */
class Session {
  readonly done: Promise<void>;
  registered = false;
  error: ApiError | undefined;
  redirect: Redirect | undefined;
  shutdown: Shutdown | undefined;

  private readonly attempts = new Map<bigint, Attempt>();
  private readonly call: grpc.ClientDuplexStream<WorkerBatch | WorkerMessage, ServerBatch | ServerMessage>;
  private outbox: Outgoing[] = [];
  private writing = false; // a frame is with gRPC: the next leaves when it is written
  private scheduled = false;
  private halfClose = false; // set by drain(): end the requests once the outbox is empty
  private ended = false; // the requests are ended (half-closed) or the call is over
  private over = false;
  private finish!: () => void;
  private initial: grpc.Metadata | undefined;
  private idle: (() => void) | undefined; // drain() waits for the running handlers through it

  private grantedSlots = 0;
  private leaseTtl: number | undefined;
  private serverProtocol = 0;
  private maxMessageBytes = DEFAULT_MAX_MESSAGE_BYTES;

  constructor(
    private readonly run: WorkerRun,
    private readonly endpoint: Endpoint,
    client: grpc.Client,
    readonly batched: boolean,
  ) {
    this.done = new Promise<void>((resolve) => {
      this.finish = resolve;
    });
    const settings = run.settings;
    const register: WorkerMessage = {
      register: {
        pool: settings.pool,
        slots: settings.slots,
        workerName: settings.name,
        protocolVersion: PROTOCOL_VERSION,
        labels: settings.labels,
      },
    };
    this.send({ message: register, size: WorkerMessage.encode(register).finish().length + FRAMING_BYTES });
    const metadata = run.connector.metadata.clone();
    this.call = (
      batched
        ? client.makeBidiStreamRequest(BATCHED_WORK, serializeBatch, deserializeBatch, metadata, {})
        : client.makeBidiStreamRequest(WORK, serializeMessage, deserializeMessage, metadata, {})
    ) as grpc.ClientDuplexStream<WorkerBatch | WorkerMessage, ServerBatch | ServerMessage>;
    this.call.on("metadata", (initial: grpc.Metadata) => {
      this.initial = initial;
    });
    this.call.on("data", batched ? this.onBatch : this.onMessage);
    this.call.on("error", () => {
      // The status says it all (the "status" event follows); a listener keeps Node from throwing.
    });
    this.call.on("status", (status: grpc.StatusObject) => this.onStatus(status));
  }

  /** Whether the stream ended because the server has no BatchedWorkers.Work (UNIMPLEMENTED before
   * anything else; a server that has it never answers so). */
  refusedBatches(): boolean {
    return this.batched && !this.registered && this.error?.code === "unimplemented";
  }

  /** Stops taking leases, gives running ones up to `grace` seconds, then half-closes and waits (a
   * bounded time) for the server to end the stream. */
  async drain(grace: number): Promise<void> {
    this.send({ message: { setSlots: { slots: 0 } }, size: 16 });
    if (this.attempts.size > 0) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, grace * 1000);
        this.idle = done;
        function done(): void {
          clearTimeout(timer);
          resolve();
        }
      });
      this.idle = undefined;
    }
    for (const [id, attempt] of this.attempts) {
      this.attempts.delete(id);
      stopHeartbeat(attempt);
      attempt.lease.abort(`the worker stopped; the handler did not finish within ${grace} s`);
      this.send(this.fail(id, `the worker stopped; the handler did not finish within ${grace} s`));
    }
    this.halfClose = true;
    this.schedule();
    let timer: NodeJS.Timeout | undefined;
    const closed = await Promise.race([
      this.done.then(() => true),
      new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(false), CLOSE_WAIT_S * 1000);
      }),
    ]);
    clearTimeout(timer);
    if (!closed) {
      this.call.cancel(); // the server did not end the stream in time
      await this.done;
    }
  }

  // ------------------------------------------------------------------------------ from the server

  private readonly onBatch = (batch: ServerBatch): void => {
    for (const message of batch.messages) {
      if (this.over) {
        return;
      }
      this.onMessage(message);
    }
  };

  private readonly onMessage = (message: ServerMessage): void => {
    if (this.over) {
      return;
    }
    if (message.lease !== undefined && this.registered) {
      this.onLease(message.lease);
    } else if (message.abort !== undefined && this.registered) {
      this.onAbort(message.abort.lease, message.abort.reason);
    } else if (message.registered !== undefined) {
      this.onRegistered(message.registered);
    } else if (message.shutdown !== undefined) {
      this.shutdown = message.shutdown;
      this.conclude();
      this.call.cancel();
    } else if (!this.registered) {
      const kind = Object.keys(message).find((key) => message[key as keyof ServerMessage] !== undefined);
      this.error = new Internal(`the server sent ${kind ?? "an empty message"} before registered`);
      this.conclude();
      this.call.cancel();
    }
  };

  private onStatus(status: grpc.StatusObject): void {
    if (this.over) {
      return;
    }
    if (status.code !== 0) {
      this.error = statusError(status);
      if (this.error.code === "failed_precondition") {
        this.redirect = shardRedirect(status.metadata, this.initial);
      }
    }
    this.conclude();
  }

  /** The stream is over: its running handlers are aborted (the server retries their leases). */
  private conclude(): void {
    this.over = true;
    this.ended = true;
    for (const attempt of this.attempts.values()) {
      stopHeartbeat(attempt);
      attempt.lease.abort("the stream to the server ended; the server retries this lease elsewhere");
    }
    this.attempts.clear();
    this.idle?.();
    this.finish();
  }

  private onRegistered(msg: Registered): void {
    const slots = this.run.settings.slots;
    // Servers before protocol 1 sent 0 slots: they granted what was asked.
    this.grantedSlots = msg.slots ? Math.min(msg.slots, slots) : slots;
    this.leaseTtl = msg.leaseTtlS;
    this.serverProtocol = msg.protocolVersion;
    this.maxMessageBytes = Number(msg.maxMessageBytes) || DEFAULT_MAX_MESSAGE_BYTES;
    this.registered = true;
    this.run.registered({
      workerId: msg.workerId,
      grantedSlots: this.grantedSlots,
      leaseTtl: this.leaseTtl,
      serverProtocol: this.serverProtocol,
      maxMessageBytes: this.maxMessageBytes,
      batched: this.batched,
      endpoint: this.endpoint.key,
    });
  }

  private onLease(msg: WireLease): void {
    if (this.run.stopping) {
      this.send(this.giveBack(msg.lease, "the worker is stopping"));
      return;
    }
    if (this.attempts.size >= this.grantedSlots) {
      this.send(this.giveBack(msg.lease, `all ${this.grantedSlots} slots of the worker are busy`));
      return;
    }
    // A TTL on the lease itself takes precedence over the one from registration.
    const ttl = msg.leaseTtlS ?? this.leaseTtl;
    const attempt: Attempt = { lease: new Lease(msg, ttl), heartbeat: undefined };
    this.attempts.set(msg.lease, attempt);
    if (ttl) {
      const interval = Math.max(ttl / 3, MIN_HEARTBEAT_INTERVAL_S) * 1000;
      attempt.heartbeat = setInterval(beat, interval, this, attempt);
    }
    let result: unknown;
    try {
      result = this.run.handler(attempt.lease);
    } catch (err) {
      this.settle(attempt, err, true);
      return;
    }
    if (isThenable(result)) {
      result.then(
        (value) => this.settle(attempt, value, false),
        (err: unknown) => this.settle(attempt, err, true),
      );
    } else {
      this.settle(attempt, result, false);
    }
  }

  /** @internal a heartbeat for a lease still running here. */
  beat(attempt: Attempt): void {
    if (this.attempts.get(attempt.lease.id) === attempt) {
      this.send({ message: { heartbeat: { lease: attempt.lease.id } }, size: 16 });
    }
  }

  private onAbort(leaseId: bigint, reason: string): void {
    // The server already freed the slot and expects nothing more for this lease.
    const attempt = this.attempts.get(leaseId);
    if (attempt !== undefined) {
      this.attempts.delete(leaseId);
      stopHeartbeat(attempt);
      attempt.lease.abort(`aborted by the server: ${reason}`);
      if (this.attempts.size === 0) {
        this.idle?.();
      }
    }
  }

  // ------------------------------------------------------------------------------------ outcomes

  /** Reports how the handler ended, unless the lease is no longer this worker's (aborted, drained or
   * the stream ended): then the outcome is not wanted. */
  private settle(attempt: Attempt, value: unknown, thrown: boolean): void {
    const id = attempt.lease.id;
    if (this.attempts.get(id) !== attempt) {
      return;
    }
    this.attempts.delete(id);
    stopHeartbeat(attempt);
    let report: Outgoing;
    try {
      report = thrown ? this.failure(id, value) : this.complete(id, value);
    } catch (err) {
      // The handler ended, but its report could not be built. The lease must be answered all the same:
      // unanswered, its slot would be held for as long as the stream lasts.
      report = this.fail(id, `the worker could not report how the handler ended: ${describe(err)}`);
    }
    this.send(report);
    if (this.attempts.size === 0) {
      this.idle?.();
    }
  }

  private complete(id: bigint, value: unknown): Outgoing {
    let data: Buffer;
    let contentType: string;
    try {
      ({ data, contentType } = encode(value));
    } catch (err) {
      return this.fail(id, `the handler's output is not JSON-encodable: ${describe(err)}`, { permanent: true });
    }
    const limit = this.maxMessageBytes - OUTPUT_HEADROOM;
    if (data.length > limit) {
      return this.fail(id, `the handler's output is ${data.length} bytes; the server accepts at most ${limit}`, {
        permanent: true,
      });
    }
    return {
      message: { complete: { lease: id, output: data, contentType } },
      size: data.length + 3 * contentType.length + 32,
    };
  }

  private failure(id: bigint, err: unknown): Outgoing {
    if (err instanceof Reject) {
      return this.giveBack(id, err.reason);
    }
    if (err instanceof CancelTask) {
      return { message: { cancelled: { lease: id } }, size: 16 };
    }
    if (err instanceof Retryable) {
      return this.fail(id, err.message, { retryAfter: err.retryAfter });
    }
    if (err instanceof Permanent) {
      return this.fail(id, err.message, { permanent: true });
    }
    return this.fail(id, describe(err));
  }

  /**
   * A `fail` the server accepts whatever `retryAfter` holds: one made invalid after the Retryable
   * checked it is left out and named in the message, since the server would answer it by ending the
   * stream, failing every other lease on it.
   */
  private fail(id: bigint, message: string, options: { permanent?: boolean; retryAfter?: unknown } = {}): Outgoing {
    let retryAfterS: number | undefined;
    try {
      retryAfterS = checkRetryAfter(options.retryAfter);
    } catch (err) {
      message = `${message} (retryAfter not sent: ${(err as Error).message})`;
    }
    const text = reportText(message, this.maxMessageBytes - OUTPUT_HEADROOM);
    return {
      message: { fail: { lease: id, message: text, permanent: options.permanent ?? false, retryAfterS } },
      size: 3 * text.length + 48,
    };
  }

  /** Nack; servers older than protocol 2 have none, and a retryable failure is the closest. */
  private giveBack(id: bigint, reason: string): Outgoing {
    if (this.serverProtocol < 2) {
      return this.fail(id, reason);
    }
    const text = reportText(reason, this.maxMessageBytes - OUTPUT_HEADROOM);
    return { message: { nack: { lease: id, reason: text } }, size: 3 * text.length + 32 };
  }

  // ------------------------------------------------------------------------------------ outbound

  private send(outgoing: Outgoing): void {
    if (this.ended) {
      return;
    }
    this.outbox.push(outgoing);
    this.schedule();
  }

  /** Sends what is queued once this turn of the event loop is over: everything the handlers finished
   * meanwhile travels together, and nothing waits for more. */
  private schedule(): void {
    if (!this.writing && !this.scheduled) {
      this.scheduled = true;
      setImmediate(this.flush);
    }
  }

  /** Hands gRPC the next frame (batched: everything queued that fits `maxMessageBytes`; otherwise
   * every queued message), or half-closes once a drain asked for it and nothing is left. */
  private readonly flush = (): void => {
    this.scheduled = false;
    if (this.writing || this.ended) {
      return;
    }
    const outbox = this.outbox;
    if (outbox.length === 0) {
      if (this.halfClose) {
        this.ended = true;
        this.call.end();
      }
      return;
    }
    this.writing = true;
    if (this.batched) {
      let taken = 1;
      let size = outbox[0]!.size;
      while (taken < outbox.length && size + outbox[taken]!.size <= this.maxMessageBytes) {
        size += outbox[taken]!.size;
        taken += 1;
      }
      const frame = outbox.splice(0, taken).map((item) => item.message);
      this.call.write({ messages: frame }, this.written);
    } else {
      this.outbox = [];
      const last = outbox.length - 1;
      for (let i = 0; i < last; i++) {
        this.call.write(outbox[i]!.message);
      }
      this.call.write(outbox[last]!.message, this.written);
    }
  };

  private readonly written = (): void => {
    this.writing = false;
    if (this.outbox.length > 0 || this.halfClose) {
      this.flush();
    }
  };
}

function beat(session: Session, attempt: Attempt): void {
  session.beat(attempt);
}

function stopHeartbeat(attempt: Attempt): void {
  if (attempt.heartbeat !== undefined) {
    clearInterval(attempt.heartbeat);
    attempt.heartbeat = undefined;
  }
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return (
    value !== null &&
    (typeof value === "object" || typeof value === "function") &&
    typeof (value as { then?: unknown }).then === "function"
  );
}

function serializeBatch(batch: WorkerBatch): Buffer {
  const bytes = WorkerBatch.encode(batch).finish();
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

function deserializeBatch(data: Buffer): ServerBatch {
  return ServerBatch.decode(data);
}

function serializeMessage(message: WorkerMessage): Buffer {
  const bytes = WorkerMessage.encode(message).finish();
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

function deserializeMessage(data: Buffer): ServerMessage {
  return ServerMessage.decode(data);
}

/** `Name: message` for a report (an Error's name and message); other thrown values as text. */
export function describe(err: unknown): string {
  try {
    if (err instanceof Error) {
      return err.message ? `${err.name}: ${err.message}` : err.name;
    }
    return `${typeof err} thrown: ${String(err)}`;
  } catch {
    return "a value that cannot be shown was thrown";
  }
}

/**
 * `text` as a report carries it: cut to what a server keeps ({@link MAX_REPORT_CHARS}) and to what fits
 * in the server's message limit (`maxBytes` of UTF-8), saying how long it was. A handler's error text
 * can be any length, and a report over the server's limit would end the stream and retry every lease
 * on it. Lone surrogates, which UTF-8 cannot carry, become U+FFFD.
 */
export function reportText(text: string, maxBytes: number): string {
  if (text.length <= MAX_REPORT_CHARS && (text.length * 3 <= maxBytes || Buffer.byteLength(text) <= maxBytes)) {
    return text;
  }
  const cut = `... (cut: ${text.length.toLocaleString("en-US")} characters)`;
  let kept = text.slice(0, Math.max(0, MAX_REPORT_CHARS - cut.length));
  const room = Math.max(0, maxBytes - cut.length);
  if (Buffer.byteLength(kept) > room) {
    kept = Buffer.from(kept, "utf8").subarray(0, room).toString("utf8").replace(/\uFFFD$/, "");
  }
  if (/[\uD800-\uDBFF]$/.test(kept)) {
    kept = kept.slice(0, -1); // half of a surrogate pair
  }
  return kept + cut;
}
