/**
 * The SDK's pure rules: the value mapping, report texts, task options, target parsing and where a shard
 * redirect may lead (the same tables as the Python SDK's tests/unit/client/test_connect.py).
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import * as grpc from "@grpc/grpc-js";

import { Endpoint, Origin, type Redirect, Redirects, allowedHosts, statusError } from "../../src/connect.js";
import { decodeJson, decodeText, encode } from "../../src/codec.js";
import { ApiError, FailedPrecondition, Retryable, Unavailable, errorFor } from "../../src/errors.js";
import { EdgeCond, MissPolicy, Priority } from "../../src/gen/cronoq/v1/cronoq.js";
import { task } from "../../src/spec.js";
import { describe as describeError, reportText } from "../../src/worker.js";

describe("the value mapping", () => {
  test("bytes, text, nothing and JSON", () => {
    const cases: [unknown, string, string][] = [
      [Buffer.from([1, 2]), "\x01\x02", "application/octet-stream"],
      [new Uint8Array([104, 105]), "hi", "application/octet-stream"],
      ["héllo", "héllo", "text/plain; charset=utf-8"],
      [undefined, "", ""],
      [null, "", ""],
      [{ a: [1, "b", null] }, '{"a":[1,"b",null]}', "application/json"],
      [0, "0", "application/json"],
      [false, "false", "application/json"],
    ];
    for (const [value, text, contentType] of cases) {
      const encoded = encode(value);
      assert.deepEqual([encoded.data.toString("utf8"), encoded.contentType], [text, contentType]);
    }
    assert.equal(encode("x", "text/csv").contentType, "text/csv");
  });

  test("what JSON cannot carry is refused", () => {
    const cycle: Record<string, unknown> = {};
    cycle.self = cycle;
    for (const value of [{ n: Number.NaN }, [Number.NEGATIVE_INFINITY], { big: 1n }, cycle, () => 1, Symbol("s")]) {
      assert.throws(() => encode(value), TypeError);
    }
  });

  test("decoding: empty is null or the empty string", () => {
    assert.equal(decodeJson(Buffer.alloc(0)), null);
    assert.deepEqual(decodeJson(Buffer.from('{"a":1}')), { a: 1 });
    assert.equal(decodeText(Buffer.alloc(0)), "");
    assert.equal(decodeText(new Uint8Array([0xc3, 0xa9])), "é");
  });
});

describe("errors and reports", () => {
  test("Retryable checks retryAfter when it is made", () => {
    assert.equal(new Retryable("x", { retryAfter: 1.5 }).retryAfter, 1.5);
    assert.equal(new Retryable("x").retryAfter, undefined);
    for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY, "5"]) {
      assert.throws(() => new Retryable("x", { retryAfter: bad as number }), RangeError);
    }
  });

  test("a status gets its class, its name in the message, and whether to retry", () => {
    const unavailable = errorFor("unavailable", "later");
    assert.deepEqual(
      [unavailable.name, unavailable.code, unavailable.message, unavailable.details, unavailable.retryable],
      ["Unavailable", "unavailable", "unavailable: later", "later", true],
    );
    const aborted = errorFor("aborted", "");
    assert.ok(aborted instanceof ApiError && aborted.name === "ApiError" && aborted.code === "aborted" && !aborted.retryable);
  });

  test("statuses as the Python SDK reads them", () => {
    const tooLarge = statusError({ code: grpc.status.RESOURCE_EXHAUSTED, details: "Received message larger than max (5 vs. 4)" });
    assert.deepEqual([tooLarge.code, tooLarge.retryable], ["resource_exhausted", false]);
    const full = statusError({ code: grpc.status.RESOURCE_EXHAUSTED, details: "pool gpu is full" });
    assert.deepEqual([full.code, full.retryable], ["resource_exhausted", true]);
    const cancelled = statusError({ code: grpc.status.CANCELLED, details: "" });
    assert.ok(cancelled instanceof Unavailable && cancelled.retryable);
    assert.deepEqual(cancelled.metadata, { "cronoq-not-received": "1" });
    const refused = statusError({ code: grpc.status.UNAVAILABLE, details: "No connection established. Last error: x" });
    assert.deepEqual(refused.metadata, { "cronoq-not-received": "1" });
    const trailers = new grpc.Metadata();
    trailers.set("cronoq-shard", "b");
    trailers.set("other", "x");
    const redirected = statusError({ code: grpc.status.FAILED_PRECONDITION, details: "shard b", metadata: trailers });
    assert.deepEqual(redirected.metadata, { "cronoq-shard": "b" });
    assert.deepEqual(statusError({ code: grpc.status.UNAVAILABLE, details: "shutting down" }).metadata, {});
  });

  test("how a thrown value is described", () => {
    assert.equal(describeError(new TypeError("bad")), "TypeError: bad");
    assert.equal(describeError(new Error("")), "Error");
    assert.equal(describeError("text"), "string thrown: text");
    assert.equal(describeError(undefined), "undefined thrown: undefined");
    const hostile = new Error("x");
    Object.defineProperty(hostile, "message", {
      get() {
        throw new Error("no");
      },
    });
    assert.equal(describeError(hostile), "a value that cannot be shown was thrown");
  });

  test("reports are cut to what a server keeps and to the message limit, saying how long they were", () => {
    assert.equal(reportText("short", 1000), "short");
    const long = reportText("x".repeat(10_000), 1 << 20);
    assert.equal(long.length, 8192);
    assert.ok(long.endsWith("... (cut: 10,000 characters)"));
    const wide = reportText("é".repeat(3000), 2000); // 6,000 bytes of UTF-8
    assert.ok(Buffer.byteLength(wide) <= 2000 && wide.endsWith("... (cut: 3,000 characters)"), wide);
    assert.ok(!wide.includes("\uFFFD"));
    const pairs = reportText("😀".repeat(5000), 1 << 20); // never half of a surrogate pair
    assert.ok(!/[\uD800-\uDBFF]\.\.\./.test(pairs));
  });
});

describe("task options", () => {
  test("each option lands in its wire field", () => {
    const spec = task(
      { n: 1 },
      {
        pool: "gpu",
        kind: "k",
        key: "key",
        tenant: "t",
        priority: 0,
        deadlineIn: 5,
        startAt: new Date(1_700_000_000_000),
        tolerance: 2,
        onMiss: "SKIP",
        durationHint: 3,
        timeout: 4,
        retry: { maxAttempts: 5, maxBackoff: 9 },
        after: [7n, "first"],
        deps: [["other", "on_failure"], { ref: 9, cond: "complete" }],
        resources: { gpu: 1 },
        tags: { n: 1 },
        labels: { zone: "a" },
      },
    );
    assert.equal(spec.payload.toString(), '{"n":1}');
    assert.deepEqual(
      [spec.pool, spec.kind, spec.key, spec.tenant, spec.priority, spec.deadlineInS, spec.startUnixNs],
      ["gpu", "k", "key", "t", Priority.PRIORITY_CRITICAL, 5, 1_700_000_000_000_000_000n],
    );
    assert.deepEqual([spec.toleranceS, spec.onMiss, spec.durationHintS, spec.timeoutS], [2, MissPolicy.MISS_POLICY_SKIP, 3, 4]);
    assert.deepEqual(spec.retry, { maxAttempts: 5, initialBackoffS: 0, multiplier: 0, maxBackoffS: 9, jitter: true });
    assert.deepEqual(spec.deps, [
      { target: { id: 7n }, cond: EdgeCond.EDGE_COND_ON_SUCCESS },
      { target: { key: "first" }, cond: EdgeCond.EDGE_COND_ON_SUCCESS },
      { target: { key: "other" }, cond: EdgeCond.EDGE_COND_ON_FAILURE },
      { target: { id: 9n }, cond: EdgeCond.EDGE_COND_ON_COMPLETE },
    ]);
    assert.deepEqual([spec.resources, spec.tags, spec.labels], [{ gpu: 1 }, { n: "1" }, { zone: "a" }]);
  });

  test("defaults: normal priority, nothing else set", () => {
    const spec = task();
    assert.deepEqual(
      [spec.payload.length, spec.contentType, spec.priority, spec.retry, spec.deps, spec.timeoutS],
      [0, "", Priority.PRIORITY_NORMAL, undefined, [], undefined],
    );
  });

  test("a bad option is named", () => {
    const cases: [object, RegExp][] = [
      [{ priority: 4 }, /priority must be 0..3 \(got 4\)/],
      [{ onMiss: "later" }, /onMiss must be one of run_late, skip, fail/],
      [{ deps: [["x", "maybe"]] }, /dependency condition must be one of/],
      [{ startIn: 1, startAt: 2 }, /use either startIn or startAt/],
      [{ deadlineAt: new Date(Number.NaN) }, /deadlineAt must be a valid Date or finite Unix seconds/],
      [{ retry: { maxAttempts: -1 } }, /retry.maxAttempts must be a non-negative integer/],
      [{ resources: { gpu: 0.5 } }, /resources.gpu must be a non-negative integer/],
      [{ pool: 7 }, /pool must be a string/],
      [{ after: -1n }, /after\[0\]: a task id is an unsigned 64-bit integer/],
      [{ tags: "x" }, /tags must be an object/],
    ];
    for (const [options, why] of cases) {
      assert.throws(() => task("x", options as never), why);
    }
  });
});

describe("targets", () => {
  test("prefixes are stripped and https means TLS", () => {
    const cases: [string, boolean, string, boolean][] = [
      ["cronoq:7070", false, "cronoq:7070", false],
      ["cronoq:7070", true, "cronoq:7070", true],
      ["http://cronoq:7070", false, "cronoq:7070", false],
      ["http://cronoq:7070", true, "cronoq:7070", true],
      ["grpc://cronoq:7070/", false, "cronoq:7070", false],
      ["https://cronoq:7070", false, "cronoq:7070", true],
      ["[::1]:7070", false, "[::1]:7070", false],
    ];
    for (const [target, tls, address, secure] of cases) {
      assert.deepEqual(Endpoint.parse(target, tls), new Endpoint(address, secure));
    }
  });
});

// ------------------------------------------------------------------------------ shard redirects

const PLAIN = new Endpoint("10.0.0.1:7070", false);
const TLS = new Endpoint("cronoq.internal:7070", true);
const LOCAL = new Endpoint("127.0.0.1:7070", false);

function named(...urls: string[]): Set<string> {
  return new Set(urls.map((url) => Origin.of(url).toString()));
}

function rules(home: Endpoint, options: { token?: boolean; allowHttp?: boolean; allow?: unknown } = {}): Redirects {
  return new Redirects(home, options.token ?? true, options.allowHttp ?? false, allowedHosts(options.allow));
}

/** A redirect from `home` that names `url` among the shard's endpoints (as our servers do). */
function follow(home: Endpoint, url: string, options: { token?: boolean; allowHttp?: boolean } = {}): Endpoint {
  let listed: Set<string>;
  try {
    listed = named(url);
  } catch {
    listed = new Set(); // not a URL: it names nothing
  }
  return rules(home, options).follow(home, { url, named: listed });
}

function refusedWith(why: RegExp, url: string) {
  return (err: unknown): boolean => {
    assert.ok(err instanceof FailedPrecondition, String(err));
    assert.ok(err.details.startsWith(`refusing shard redirect to ${JSON.stringify(url)}: `), err.details);
    assert.match(err.details, why);
    return true;
  };
}

describe("shard redirects", () => {
  test("allowed", () => {
    const cases: [Endpoint, string, boolean, boolean, string, boolean][] = [
      [LOCAL, "http://127.0.0.1:7171", true, false, "127.0.0.1:7171", false],
      [LOCAL, "http://127.0.0.9:7171", true, false, "127.0.0.9:7171", false],
      [LOCAL, "http://localhost:7171", true, false, "localhost:7171", false],
      [LOCAL, "http://[::1]:7171", true, false, "[::1]:7171", false],
      [new Endpoint("localhost:7070", false), "http://[::1]:1", true, false, "[::1]:1", false],
      [PLAIN, "http://127.0.0.1:7171", false, false, "127.0.0.1:7171", false], // no token
      [PLAIN, "http://127.0.0.1:7171", true, true, "127.0.0.1:7171", false], // allowed
      [PLAIN, "http://10.0.0.2:7171", false, false, "10.0.0.2:7171", false], // no token to leak
      [PLAIN, "http://10.0.0.2:7171", true, true, "10.0.0.2:7171", false], // explicitly allowed
      [PLAIN, "https://shard-b:7171", true, false, "shard-b:7171", true], // upgrading is fine
      [TLS, "https://shard-b:7171/", true, false, "shard-b:7171", true],
      [TLS, "https://shard-b", true, false, "shard-b:443", true],
    ];
    for (const [home, url, token, allowHttp, address, secure] of cases) {
      assert.deepEqual(follow(home, url, { token, allowHttp }), new Endpoint(address, secure), url);
    }
  });

  test("refused", () => {
    const cases: [Endpoint, string, boolean, boolean, RegExp][] = [
      [TLS, "http://shard-b:7171", false, true, /downgrade/],
      [new Endpoint("127.0.0.1:7070", true), "http://127.0.0.1:7171", true, true, /downgrade/],
      [PLAIN, "http://shard-b:7171", true, false, /token over plain http to another host/],
      [PLAIN, "http://10.0.0.2:7171", true, false, /insecureRedirectHttp: true/],
      // A server's loopback address, read on another machine: whatever local program holds the port.
      [PLAIN, "http://127.0.0.1:7171", true, false, /a port of this machine/],
      [new Endpoint("cronoq.internal:7070", false), "http://localhost:7171", true, false, /this machine/],
      [PLAIN, "https://user@shard-b:7171", false, false, /user information/],
      [PLAIN, "http://:pw@127.0.0.1:7171", false, false, /user information/],
      [PLAIN, "grpc://shard-b:7171", false, false, /not an http/],
      [PLAIN, "shard-b:7171", false, false, /not an http/],
      [PLAIN, "http://", false, false, /not a valid URL/],
      [PLAIN, "http://shard-b:99999", false, false, /not a valid URL/],
    ];
    for (const [home, url, token, allowHttp, why] of cases) {
      assert.throws(() => follow(home, url, { token, allowHttp }), refusedWith(why, url));
    }
  });

  test("the configured target's shard endpoints are pinned", () => {
    const home = new Endpoint("router.internal:7070", true);
    const shard = new Endpoint("b-1.internal:7070", true);
    const redirects = rules(home);
    const listed = named("https://b.internal:7070", "https://b-1.internal:7070", "https://b-2.internal:7070");
    assert.deepEqual(redirects.follow(home, { url: "https://b-1.internal:7070", named: listed }), shard);
    // b-1 steps down and sends the worker to another member: named, so followed.
    assert.equal(redirects.follow(shard, { url: "https://b-2.internal:7070", named: undefined }).address, "b-2.internal:7070");
    // A shard cannot widen the set by naming more.
    const forged: Redirect = { url: "https://collector.example:443", named: named("https://collector.example") };
    assert.throws(() => redirects.follow(shard, forged), refusedWith(/not one of the shard endpoints.*https:\/\/b-2\.internal:7070/, forged.url));
    // The configured target's next answer replaces them; one that names nothing keeps them.
    const moved = named("https://c.internal:7070");
    assert.equal(redirects.follow(home, { url: "https://c.internal:7070", named: moved }).address, "c.internal:7070");
    assert.throws(() => redirects.follow(shard, { url: "https://b-2.internal:7070", named: undefined }), /not one of the shard endpoints/);
    assert.equal(redirects.follow(home, { url: "https://c.internal:7070", named: undefined }).address, "c.internal:7070");
    assert.deepEqual(redirects.named, moved);
  });

  test("origins compare hosts in any case, with default ports", () => {
    const cases: [string, string][] = [
      ["https://Shard-B.Example:443/", "https://shard-b.example"],
      ["https://shard-b.example", "https://SHARD-B.example.:443"],
      ["http://shard-b.example", "http://shard-b.example:80/"],
      ["http://[0:0::1]:7070", "http://[::1]:7070"],
    ];
    for (const [listed, url] of cases) {
      assert.equal(Origin.of(listed).toString(), Origin.of(url).toString());
      rules(LOCAL, { token: false }).follow(LOCAL, { url, named: named(listed) });
    }
    const others: [string, string][] = [
      ["https://shard-b.example:7070", "https://shard-b.example"],
      ["https://shard-b.example", "http://shard-b.example:443"],
      ["https://shard-b.example", "https://shard-b.example.evil"],
    ];
    for (const [listed, url] of others) {
      assert.throws(() => rules(LOCAL, { token: false }).follow(LOCAL, { url, named: named(listed) }), /not one of the shard endpoints/);
    }
  });

  test("without named endpoints, only the configured target's host is followed", () => {
    const home = new Endpoint("Cronoq.Internal:7070", true);
    assert.equal(rules(home).follow(home, { url: "https://cronoq.internal:7171", named: undefined }).address, "cronoq.internal:7171");
    assert.throws(() => rules(home).follow(home, { url: "https://b.internal:7070", named: undefined }), /named no shard endpoints.*redirectAllow: \[/);
    const allowed = rules(home, { allow: ["b.internal"] });
    assert.equal(allowed.follow(home, { url: "https://b.internal:7070", named: undefined }).address, "b.internal:7070");
  });

  test("redirectAllow admits what it names, and alone decides", () => {
    const admitted: [string[], string][] = [
      [["*.shards.example"], "https://b.shards.example:7070"],
      [["*.shards.example"], "https://b-1.b.Shards.Example"],
      [["b.shards.example"], "https://b.shards.example:9999"],
      [["https://b.shards.example:7070"], "https://b.shards.example:7070"],
      [["https://b.shards.example"], "https://b.shards.example:443"],
      [["https://*.shards.example:7070"], "https://b.shards.example:7070"],
      [["10.0.0.9"], "https://10.0.0.9:7070"],
      [["[::1]"], "http://[::1]:7070"],
      [["nothing.example", "*.shards.example"], "https://b.shards.example"],
    ];
    for (const [allow, url] of admitted) {
      rules(LOCAL, { allow }).follow(LOCAL, { url, named: undefined });
    }
    const refused: [string[], string][] = [
      [["*.shards.example"], "https://shards.example"],
      [["*.shards.example"], "https://evilshards.example"],
      [["https://b.shards.example:7070"], "https://b.shards.example:7071"],
      [["https://b.shards.example:7070"], "http://b.shards.example:7070"],
      [["https://b.shards.example"], "https://b.shards.example:7070"],
      [[], "https://b.shards.example"],
    ];
    for (const [allow, url] of refused) {
      assert.throws(() => rules(LOCAL, { token: false, allow }).follow(LOCAL, { url, named: undefined }), /redirectAllow does not admit it/);
    }
    const listed: Redirect = { url: "https://b.shards.example", named: named("https://b.shards.example") };
    assert.throws(() => rules(LOCAL, { allow: ["c.shards.example"] }).follow(LOCAL, listed), /redirectAllow does not admit it/);
    rules(LOCAL, { allow: ["c.shards.example"] }).follow(LOCAL, { url: "https://c.shards.example", named: named("https://b.shards.example") });
  });

  test("redirectAllow keeps the transport rules", () => {
    assert.throws(
      () => rules(PLAIN, { allow: ["*.shards.example"] }).follow(PLAIN, { url: "http://b.shards.example", named: undefined }),
      /token over plain http to another host/,
    );
    assert.throws(() => rules(TLS, { allow: ["b.shards.example"] }).follow(TLS, { url: "http://b.shards.example", named: undefined }), /downgrade/);
  });

  test("a bad redirectAllow entry is named", () => {
    const cases: [unknown, RegExp][] = [
      ["b.shards.example", /redirectAllow: expected an array of URLs or host names/],
      [["ok.example", "*"], /redirectAllow\[1\]: expected an http:\/\/ or https:\/\/ URL, a host name/],
      [["b.example:7070"], /redirectAllow\[0\]: expected an http:\/\/ or https:\/\/ URL/],
      [["*.*.example"], /redirectAllow\[0\]: expected/],
      [["b.*.example"], /redirectAllow\[0\]: expected/],
      [[""], /redirectAllow\[0\]: expected/],
      [["https://b.example/path"], /redirectAllow\[0\]: a URL here names a scheme, host and port/],
      [["https://user@b.example"], /redirectAllow\[0\]: a URL here names/],
      [["grpc://b.example"], /redirectAllow\[0\]: it is not an http:\/\/ or https:\/\/ URL/],
      [["https://b.example:99999"], /redirectAllow\[0\]: it is not a valid URL/],
      [[7070], /redirectAllow\[0\]: expected a string \(got 7070\)/],
    ];
    for (const [allow, why] of cases) {
      assert.throws(() => allowedHosts(allow), why);
    }
  });
});
