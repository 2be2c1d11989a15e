/**
 * A scripted gRPC server on a real loopback socket, standing in for cronoq-server in the worker's unit
 * tests (as tests/unit/client/scripted.py does for the Python SDK). A test takes each accepted Work
 * stream with `accept()`, sends ServerMessages and waits for the worker's messages by kind.
 *
 * It serves Workers.Work and BatchedWorkers.Work; with `batches` false, BatchedWorkers.Work answers
 * UNIMPLEMENTED as a server without the extension does (counted in `batchProbes`). Each stream first
 * takes the next entry of `refusals`, if any, and ends with it before sending anything.
 */

import * as grpc from "@grpc/grpc-js";

import {
  type Lease,
  type Register,
  ServerBatch,
  type ServerMessage,
  WorkerBatch,
  WorkerMessage,
  WorkersService,
} from "../../src/gen/cronoq/v1/cronoq.js";

/** Upper bound for anything a test waits for; reached only when the SDK misbehaves. */
export const TIMEOUT_MS = 5000;

export interface Refusal {
  code: grpc.status;
  details?: string;
  metadata?: Record<string, string>;
}

type Kind = keyof WorkerMessage;

/** A promise with a time limit, naming what it waited for. */
export function within<T>(promise: Promise<T>, what: string, ms = TIMEOUT_MS): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise<T>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms);
    }),
  ]);
}

/** The server end of one Work stream. */
export class WorkStream {
  /** Every message received, in order. */
  readonly log: WorkerMessage[] = [];
  /** The size in bytes of each frame received (a frame is one message on Workers.Work). */
  readonly frames: number[] = [];
  readonly halfClosed: Promise<void>;
  private taken = new Set<number>();
  private waiters: (() => void)[] = [];
  private ended = false;

  constructor(
    private readonly call: grpc.ServerDuplexStream<Buffer, Buffer>,
    readonly batched: boolean,
    readonly metadata: grpc.Metadata,
  ) {
    this.halfClosed = new Promise((resolve) => {
      call.on("end", () => {
        resolve();
        this.end(); // like cronoq-server
      });
    });
    call.on("data", (data: Buffer) => {
      this.frames.push(data.length);
      const messages = batched ? WorkerBatch.decode(data).messages : [WorkerMessage.decode(data)];
      this.log.push(...messages);
      for (const wake of this.waiters.splice(0)) {
        wake();
      }
    });
    call.on("error", () => undefined);
    call.on("cancelled", () => {
      this.ended = true;
    });
  }

  /** The kinds of the messages received so far, in order. */
  kinds(): Kind[] {
    return this.log.map(kindOf);
  }

  /** The oldest message of this kind not yet taken, waiting for it. */
  async next<K extends Kind>(kind: K): Promise<NonNullable<WorkerMessage[K]>> {
    return within(
      (async () => {
        for (;;) {
          const index = this.log.findIndex((message, i) => !this.taken.has(i) && message[kind] !== undefined);
          if (index >= 0) {
            this.taken.add(index);
            return this.log[index]![kind] as NonNullable<WorkerMessage[K]>;
          }
          await new Promise<void>((resolve) => this.waiters.push(resolve));
        }
      })(),
      `a ${kind} message`,
    );
  }

  /** Sends messages, all in one frame on a batched stream. */
  send(...messages: ServerMessage[]): void {
    if (this.batched) {
      this.call.write(Buffer.from(ServerBatch.encode({ messages }).finish()));
    } else {
      for (const message of messages) {
        this.call.write(Buffer.from(WorkersService.work.responseSerialize(message)));
      }
    }
  }

  /** Reads Register and answers Registered (granting what was asked unless `slots`). */
  async handshake(options: { slots?: number; ttl?: number; protocol?: number; maxBytes?: number } = {}): Promise<Register> {
    const register = await this.next("register");
    this.send({
      registered: {
        workerId: 42n,
        leaseTtlS: options.ttl,
        slots: options.slots ?? register.slots,
        protocolVersion: options.protocol ?? 3,
        maxMessageBytes: BigInt(options.maxBytes ?? 0),
      },
    });
    return register;
  }

  lease(id: number, payload: unknown = null, fields: Partial<Lease> = {}): ServerMessage {
    return {
      lease: {
        lease: BigInt(id),
        taskId: 1000n + BigInt(id),
        attempt: 1,
        payload: Buffer.from(payload === null ? "" : JSON.stringify(payload)),
        contentType: "application/json",
        kind: "",
        key: "",
        tags: {},
        pool: "p",
        priority: 0,
        ...fields,
      },
    };
  }

  /** Ends the stream with OK, or with `refusal`. */
  end(refusal?: Refusal): void {
    if (this.ended) {
      return;
    }
    this.ended = true;
    if (refusal === undefined) {
      this.call.end();
    } else {
      this.call.emit("error", statusOf(refusal));
    }
  }
}

function statusOf(refusal: Refusal): Partial<grpc.StatusObject> {
  const metadata = new grpc.Metadata();
  for (const [key, value] of Object.entries(refusal.metadata ?? {})) {
    metadata.set(key, value);
  }
  return { code: refusal.code, details: refusal.details ?? "", metadata };
}

export function kindOf(message: WorkerMessage): Kind {
  return (Object.keys(message) as Kind[]).find((key) => message[key] !== undefined)!;
}

/** A server with both worker services on a loopback port. */
export class ScriptedServer {
  batches = true;
  batchProbes = 0;
  connects = 0;
  readonly refusals: Refusal[] = [];
  private readonly accepted: WorkStream[] = [];
  private waiters: (() => void)[] = [];
  private readonly server = new grpc.Server();
  port = 0;

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  get target(): string {
    return `127.0.0.1:${this.port}`;
  }

  async start(): Promise<this> {
    const raw = { requestDeserialize: (b: Buffer) => b, responseSerialize: (b: Buffer) => b };
    const work = (batched: boolean) => (call: grpc.ServerDuplexStream<Buffer, Buffer>) => this.work(call, batched);
    this.server.addService(
      {
        work: { ...WorkersService.work, ...raw },
        batched: { ...WorkersService.work, ...raw, path: "/cronoq.v1.BatchedWorkers/Work" },
      } as unknown as grpc.ServiceDefinition,
      { work: work(false), batched: work(true) },
    );
    this.port = await new Promise<number>((resolve, reject) => {
      this.server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, port) =>
        err ? reject(err) : resolve(port),
      );
    });
    return this;
  }

  private work(call: grpc.ServerDuplexStream<Buffer, Buffer>, batched: boolean): void {
    if (batched && !this.batches) {
      this.batchProbes += 1;
      call.emit("error", { code: grpc.status.UNIMPLEMENTED, details: "Method not found!" });
      return;
    }
    this.connects += 1;
    const refusal = this.refusals.shift();
    if (refusal !== undefined) {
      call.emit("error", statusOf(refusal));
      return;
    }
    this.accepted.push(new WorkStream(call, batched, call.metadata));
    for (const wake of this.waiters.splice(0)) {
      wake();
    }
  }

  /** The next stream opened (in order of arrival). */
  accept(): Promise<WorkStream> {
    return within(
      (async () => {
        for (;;) {
          const stream = this.accepted.shift();
          if (stream !== undefined) {
            return stream;
          }
          await new Promise<void>((resolve) => this.waiters.push(resolve));
        }
      })(),
      "a Work stream",
    );
  }

  close(): void {
    this.server.forceShutdown();
  }
}

export async function scripted(): Promise<ScriptedServer> {
  return new ScriptedServer().start();
}

/** `WorkerBatch` and `ServerBatch` re-exported for tests that build frames by hand. */
export { ServerBatch, WorkerBatch };
