/**
 * runWorker against scripted servers on loopback (./scripted.ts): what the worker sends for each
 * situation the protocol has, which a real server cannot be made to produce on demand (more leases than
 * slots, a lease before Registered, refusals, redirects, a server without the batched extension).
 */

import assert from "node:assert/strict";
import { afterEach, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import * as grpc from "@grpc/grpc-js";

import {
  FailedPrecondition,
  type Handler,
  type Lease,
  LeaseAborted,
  type Registration,
  Unauthenticated,
  type WorkerOptions,
  runWorker,
} from "../../src/node.js";
import { type ScriptedServer, TIMEOUT_MS, scripted, within } from "./scripted.js";

const servers: ScriptedServer[] = [];
const stops: AbortController[] = [];

afterEach(() => {
  for (const stop of stops.splice(0)) {
    stop.abort();
  }
  for (const server of servers.splice(0)) {
    server.close();
  }
});

async function server(): Promise<ScriptedServer> {
  const made = await scripted();
  servers.push(made);
  return made;
}

interface Running {
  done: Promise<void>;
  stop: AbortController;
  registrations: Registration[];
  delays: (number | undefined)[];
  codes: (string | undefined)[];
}

/** runWorker in the background, with what it reports collected; stopped after the test. */
function start(target: string, handler: Handler, options: Partial<WorkerOptions> = {}): Running {
  const stop = new AbortController();
  stops.push(stop);
  const running: Running = { stop, registrations: [], delays: [], codes: [], done: Promise.resolve() };
  running.done = runWorker(
    {
      target,
      pool: "p",
      signal: stop.signal,
      backoff: { initial: 0.01, max: 0.04 },
      drainTimeout: 1,
      onRegistered: (r) => running.registrations.push(r),
      onDisconnected: (d) => {
        running.delays.push(d.delay);
        running.codes.push(d.error?.code);
      },
      ...options,
    },
    handler,
  );
  running.done.catch(() => undefined); // a test that expects a rejection awaits it itself
  return running;
}

const done = async (): Promise<string> => "done";

describe("runWorker against a scripted server", () => {
  test("registers with the pool, slots, name, labels and protocol 3, batched first", async () => {
    const s = await server();
    const w = start(s.target, done, { slots: 3, name: "w1", labels: { gpu: "a100" } });
    const stream = await s.accept();
    const register = await stream.handshake({ slots: 2, ttl: 30, maxBytes: 65536 });
    assert.deepEqual(register, { pool: "p", slots: 3, workerName: "w1", protocolVersion: 3, labels: { gpu: "a100" } });
    assert.equal(stream.batched, true);
    await waitFor(() => w.registrations.length === 1, "the registration");
    assert.deepEqual(
      { ...w.registrations[0] },
      { workerId: 42n, grantedSlots: 2, leaseTtl: 30, serverProtocol: 3, maxMessageBytes: 65536, batched: true, endpoint: s.url, connections: 1 },
    );
  });

  test("the token goes with the stream as a bearer token", async () => {
    const s = await server();
    start(s.target, done, { token: "sekrit" });
    const stream = await s.accept();
    assert.deepEqual(stream.metadata.get("authorization"), ["Bearer sekrit"]);
  });

  test("leases beyond the granted slots are handed back, and the rest complete", async () => {
    const s = await server();
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    start(s.target, async (lease) => {
      if (lease.attempt === 1 && lease.id === 1n) {
        await held;
      }
      return lease.json();
    }, { slots: 3 });
    const stream = await s.accept();
    await stream.handshake({ slots: 1 });
    stream.send(stream.lease(1, { n: 1 }), stream.lease(2, { n: 2 }));
    const nack = await stream.next("nack");
    assert.deepEqual(nack, { lease: 2n, reason: "all 1 slots of the worker are busy" });
    release();
    const complete = await stream.next("complete");
    assert.deepEqual([complete.lease, complete.output.toString(), complete.contentType], [1n, '{"n":1}', "application/json"]);
  });

  test("a protocol 1 server gets a retryable failure instead of a nack", async () => {
    const s = await server();
    start(s.target, () => new Promise(() => undefined));
    const stream = await s.accept();
    await stream.handshake({ slots: 1, protocol: 1 });
    stream.send(stream.lease(1), stream.lease(2));
    assert.deepEqual(await stream.next("fail"), {
      lease: 2n,
      message: "all 1 slots of the worker are busy",
      permanent: false,
      retryAfterS: undefined,
    });
  });

  test("every outcome goes out as its message", async () => {
    const s = await server();
    const { Retryable, Permanent, Reject, CancelTask } = await import("../../src/node.js");
    const outcomes: Record<number, () => unknown> = {
      1: () => ({ ok: 1 }),
      2: () => {
        throw new Retryable("later", { retryAfter: 2.5 });
      },
      3: () => {
        throw new Permanent("never");
      },
      4: () => {
        throw new Reject("busy here");
      },
      5: () => {
        throw new CancelTask();
      },
      6: () => {
        throw new RangeError("out");
      },
      7: () => {
        const err = new Retryable("bad later");
        err.retryAfter = Number.NaN; // made invalid after the check at construction
        throw err;
      },
      8: () => "x".repeat(5000), // over the server's limit less the headroom
      9: () => Promise.reject(new Error("x".repeat(20_000))),
    };
    start(s.target, (lease) => outcomes[Number(lease.id)]!(), { slots: 9 });
    const stream = await s.accept();
    await stream.handshake({ maxBytes: 4096 });
    stream.send(...Object.keys(outcomes).map((id) => stream.lease(Number(id))));
    await waitFor(() => stream.log.length >= 10, "every outcome");
    const byLease = new Map(stream.log.slice(1).map((m) => [Number(Object.values(m).find((v) => v)!.lease), m]));
    assert.deepEqual(byLease.get(1)?.complete, { lease: 1n, output: Buffer.from('{"ok":1}'), contentType: "application/json" });
    assert.deepEqual(byLease.get(2)?.fail, { lease: 2n, message: "later", permanent: false, retryAfterS: 2.5 });
    assert.deepEqual(byLease.get(3)?.fail, { lease: 3n, message: "never", permanent: true, retryAfterS: undefined });
    assert.deepEqual(byLease.get(4)?.nack, { lease: 4n, reason: "busy here" });
    assert.deepEqual(byLease.get(5)?.cancelled, { lease: 5n });
    assert.deepEqual(byLease.get(6)?.fail, { lease: 6n, message: "RangeError: out", permanent: false, retryAfterS: undefined });
    assert.equal(
      byLease.get(7)?.fail?.message,
      "bad later (retryAfter not sent: retryAfter must be a finite number of seconds >= 0 (got NaN))",
    );
    assert.equal(byLease.get(7)?.fail?.retryAfterS, undefined);
    assert.deepEqual(byLease.get(8)?.fail, {
      lease: 8n,
      message: "the handler's output is 5000 bytes; the server accepts at most 3072",
      permanent: true,
      retryAfterS: undefined,
    });
    const cut = byLease.get(9)?.fail?.message ?? "";
    assert.ok(cut.startsWith("Error: xxx") && cut.endsWith("... (cut: 20,007 characters)"), cut);
    assert.ok(Buffer.byteLength(cut) <= 3072);
    assert.ok(stream.frames.every((size) => size <= 4096), `frames: ${stream.frames}`);
  });

  test("frames stay within the server's max_message_bytes, and carry what is queued", async () => {
    const s = await server();
    start(s.target, () => "y".repeat(1000), { slots: 20 });
    const stream = await s.accept();
    await stream.handshake({ maxBytes: 4096 });
    stream.send(...Array.from({ length: 20 }, (_, i) => stream.lease(i + 1)));
    await waitFor(() => stream.kinds().filter((k) => k === "complete").length === 20, "20 completions");
    const frames = stream.frames.slice(1); // after the one with Register
    assert.ok(frames.every((size) => size <= 4096), `frames: ${frames}`);
    assert.ok(frames.length < 20, `one completion per frame: ${frames}`);
  });

  test("heartbeats go out every third of the TTL while the handler runs, and stop with it", async () => {
    const s = await server();
    let release!: () => void;
    start(s.target, () => new Promise<void>((resolve) => (release = resolve)));
    const stream = await s.accept();
    await stream.handshake({ ttl: 0.06 });
    stream.send(stream.lease(1, null, { leaseTtlS: 0.3 })); // the lease's own TTL wins: a beat every 0.1 s
    assert.deepEqual(await stream.next("heartbeat"), { lease: 1n });
    const first = Date.now();
    await stream.next("heartbeat");
    assert.ok(Date.now() - first >= 80, "the lease's TTL takes precedence over the registration's");
    release();
    await stream.next("complete");
    const beats = stream.kinds().filter((k) => k === "heartbeat").length;
    await sleep(250);
    assert.equal(stream.kinds().filter((k) => k === "heartbeat").length, beats);
  });

  test("an abort reaches the lease's signal, and the handler's outcome is not sent", async () => {
    const s = await server();
    const reasons: unknown[] = [];
    const started: bigint[] = [];
    start(s.target, async (lease: Lease) => {
      started.push(lease.id);
      if (lease.id === 1n) {
        await new Promise((resolve) => lease.signal.addEventListener("abort", resolve));
        reasons.push(lease.signal.reason);
      }
      return "done";
    });
    const stream = await s.accept();
    await stream.handshake();
    stream.send(stream.lease(1));
    await waitFor(() => started.length === 1, "the handler to start");
    stream.send({ abort: { lease: 1n, reason: "attempt timed out" } });
    await waitFor(() => reasons.length === 1, "the abort");
    assert.ok(reasons[0] instanceof LeaseAborted);
    assert.equal((reasons[0] as Error).message, "aborted by the server: attempt timed out");
    stream.send(stream.lease(2));
    await stream.next("complete"); // lease 2's: lease 1's outcome was never sent
    assert.deepEqual(stream.kinds(), ["register", "complete"]);
  });

  test("a server without the extension is served over Workers.Work, and asked again later", async () => {
    const s = await server();
    s.batches = false;
    const w = start(s.target, done);
    const plain = await s.accept();
    assert.equal(plain.batched, false);
    await plain.handshake();
    await waitFor(() => w.registrations.length === 1, "the registration");
    assert.equal(w.registrations[0]!.batched, false);
    assert.equal(s.batchProbes, 1);
    s.batches = true; // upgraded meanwhile
    plain.end();
    const batched = await s.accept();
    assert.equal(batched.batched, true);
    assert.deepEqual(w.delays, [0.01]); // the refused probe cost no backoff; the ended stream did
  });

  test("a Shutdown with not_leader reconnects at once, another after the backoff", async () => {
    const s = await server();
    const w = start(s.target, done);
    let stream = await s.accept();
    await stream.handshake();
    stream.send({ shutdown: { reason: "leadership moved", notLeader: true } });
    stream = await s.accept();
    await stream.handshake();
    stream.send({ shutdown: { reason: "going down", notLeader: false } });
    await s.accept();
    assert.deepEqual(w.delays, [0, 0.01]);
  });

  test("the backoff doubles up to its maximum, and a refused stream is retried", async () => {
    const s = await server();
    s.refusals.push(...Array.from({ length: 4 }, () => ({ code: grpc.status.UNAVAILABLE, details: "not yet" })));
    const w = start(s.target, done);
    await (await s.accept()).handshake();
    assert.deepEqual(w.delays, [0.01, 0.02, 0.04, 0.04]);
    assert.deepEqual(w.codes, ["unavailable", "unavailable", "unavailable", "unavailable"]);
  });

  test("after not_leader, unavailable is retried briskly rather than with the backoff", async () => {
    const s = await server();
    const w = start(s.target, done, { backoff: { initial: 1, max: 4 } });
    const stream = await s.accept();
    await stream.handshake();
    s.refusals.push({ code: grpc.status.UNAVAILABLE }, { code: grpc.status.UNAVAILABLE });
    stream.send({ shutdown: { reason: "standby now", notLeader: true } });
    await (await s.accept()).handshake();
    assert.deepEqual(w.delays, [0, 0.1, 0.1]);
  });

  test("a status retrying cannot fix rejects runWorker", async () => {
    const s = await server();
    s.refusals.push({ code: grpc.status.UNAUTHENTICATED, details: "unknown token" });
    const w = start(s.target, done);
    await assert.rejects(w.done, (err: unknown) => err instanceof Unauthenticated && err.message === "unauthenticated: unknown token");
  });

  test("a lease before Registered ends the stream as a protocol error, and the worker reconnects", async () => {
    const s = await server();
    const w = start(s.target, done);
    const stream = await s.accept();
    await stream.next("register");
    stream.send(stream.lease(1));
    await (await s.accept()).handshake();
    assert.deepEqual(w.codes, ["internal"]);
  });

  test("a shard redirect is followed to the shard, and an unavailable shard sends it back home", async () => {
    const home = await server();
    const shard = await server();
    const redirect = { code: grpc.status.FAILED_PRECONDITION, details: "pool p is served by shard b", metadata: { "cronoq-shard-endpoint": shard.url } };
    home.refusals.push(redirect);
    shard.refusals.push({ code: grpc.status.UNAVAILABLE });
    const w = start(home.target, done, { token: "t" });
    // The shard is down: the worker asks its configured target again, which redirects again.
    home.refusals.push(redirect);
    await (await shard.accept()).handshake();
    await waitFor(() => w.registrations.length === 1, "the registration");
    assert.equal(w.registrations[0]!.endpoint, shard.url);
    assert.deepEqual([home.connects, shard.connects], [2, 2]);
  });

  test("a redirect that would send the token in the clear to another host is refused", async () => {
    const s = await server();
    s.refusals.push({ code: grpc.status.FAILED_PRECONDITION, details: "elsewhere", metadata: { "cronoq-shard-endpoint": "http://10.9.8.7:7070" } });
    const w = start(s.target, done, { token: "t" });
    await assert.rejects(w.done, (err: unknown) => {
      assert.ok(err instanceof FailedPrecondition);
      assert.match(err.message, /refusing shard redirect to "http:\/\/10\.9\.8\.7:7070": it would send the token over plain http to another host/);
      return true;
    });
  });

  test("the worker gives up after MAX_REDIRECTS redirects in a row", async () => {
    const s = await server();
    const again = { code: grpc.status.FAILED_PRECONDITION, details: "loop", metadata: { "cronoq-shard-endpoint": s.url } };
    s.refusals.push(again, again, again, again);
    const w = start(s.target, done);
    await assert.rejects(w.done, /gave up after 3 shard redirects in a row/);
  });

  test("on stop: SetSlots(0), running handlers finish, a lease arriving meanwhile is nacked before the half-close", async () => {
    const s = await server();
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let started = 0;
    const w = start(s.target, async () => {
      started += 1;
      await held;
      return "finished";
    }, { slots: 2, drainTimeout: 5 });
    const stream = await s.accept();
    await stream.handshake();
    stream.send(stream.lease(1));
    await waitFor(() => started === 1, "the handler to start");
    w.stop.abort();
    assert.deepEqual(await stream.next("setSlots"), { slots: 0 });
    stream.send(stream.lease(2)); // sent before the server read SetSlots(0)
    assert.deepEqual(await stream.next("nack"), { lease: 2n, reason: "the worker is stopping" });
    release();
    await stream.next("complete");
    await within(stream.halfClosed, "the half-close");
    await within(w.done, "runWorker to resolve");
    assert.deepEqual(stream.kinds(), ["register", "setSlots", "nack", "complete"]);
  });

  test("handlers still running after drainTimeout are aborted and reported as retryable", async () => {
    const s = await server();
    const reasons: string[] = [];
    let started = 0;
    const w = start(s.target, (lease) => {
      started += 1;
      return new Promise((resolve) => lease.signal.addEventListener("abort", () => {
        reasons.push((lease.signal.reason as Error).message);
        resolve("ignored");
      }));
    }, { drainTimeout: 0.05 });
    const stream = await s.accept();
    await stream.handshake();
    stream.send(stream.lease(1));
    await waitFor(() => started === 1, "the handler to start");
    w.stop.abort();
    const fail = await stream.next("fail");
    assert.deepEqual(fail, { lease: 1n, message: "the worker stopped; the handler did not finish within 0.05 s", permanent: false, retryAfterS: undefined });
    assert.deepEqual(reasons, ["the worker stopped; the handler did not finish within 0.05 s"]);
    await within(w.done, "runWorker to resolve");
  });

  test("a stream that ends aborts its running handlers, which the server retries elsewhere", async () => {
    const s = await server();
    const reasons: string[] = [];
    let started = 0;
    start(s.target, (lease) => {
      started += 1;
      return new Promise((resolve) => lease.signal.addEventListener("abort", () => {
        reasons.push((lease.signal.reason as Error).message);
        resolve(undefined);
      }));
    });
    const stream = await s.accept();
    await stream.handshake();
    stream.send(stream.lease(1));
    await waitFor(() => started === 1, "the handler to start");
    stream.end({ code: grpc.status.UNAVAILABLE, details: "bye" });
    await waitFor(() => reasons.length === 1, "the abort");
    assert.equal(reasons[0], "the stream to the server ended; the server retries this lease elsewhere");
    await s.accept(); // and it reconnects
  });

  test("a signal aborted before runWorker starts means it never connects", async () => {
    const s = await server();
    const stop = new AbortController();
    stop.abort();
    await runWorker({ target: s.target, pool: "p", signal: stop.signal }, done);
    assert.equal(s.connects, 0);
  });

  test("a stop while waiting to reconnect returns at once", async () => {
    const s = await server();
    s.refusals.push({ code: grpc.status.UNAVAILABLE });
    const w = start(s.target, done, { backoff: { initial: 60, max: 60 } });
    await waitFor(() => w.delays.length === 1, "the first refusal");
    w.stop.abort();
    await within(w.done, "runWorker to resolve", 1000);
  });

  test("bad options are refused naming the option", async () => {
    const cases: [Partial<WorkerOptions>, RegExp][] = [
      [{ pool: "" }, /pool: expected the name of a pool/],
      [{ slots: 0 }, /slots must be an integer >= 1 \(got 0\)/],
      [{ slots: 1.5 }, /slots must be an integer >= 1/],
      [{ drainTimeout: -1 }, /drainTimeout must be a finite number of seconds >= 0/],
      [{ backoff: { initial: 2, max: 1 } }, /backoff must have 0 < initial <= max/],
      [{ redirectAllow: ["ok.example", "*"] }, /redirectAllow\[1\]: expected an http:\/\/ or https:\/\/ URL, a host name/],
      [{ tls: { cert: "x" } }, /tls: cert and key go together/],
      [{ target: "" }, /target: expected host:port/],
    ];
    for (const [options, why] of cases) {
      await assert.rejects(runWorker({ target: "127.0.0.1:1", pool: "p", ...options }, done), why);
    }
  });
});

/** Resolves once `condition()` holds (polled every 5 ms), or rejects naming `what` after TIMEOUT_MS. */
async function waitFor(condition: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + TIMEOUT_MS;
  while (!condition()) {
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await sleep(5);
  }
}

