/**
 * The producer Client against a real server, run by tests/integration/test_sdk_typescript_client.py,
 * which starts the server and a Python SDK worker that serves pool "default" by echoing what it got
 * (`{"pool", "contentType", "payload"}`, the payload as text); pool "idle" has no worker. The
 * environment says where: CRONOQ_TARGET, and for TLS CRONOQ_TLS_CA (CRONOQ_TLS_CERT and CRONOQ_TLS_KEY
 * for mTLS).
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, describe, test } from "node:test";

import { Client, NotFound, TimeoutError, task } from "../../src/node.js";

const target = process.env.CRONOQ_TARGET;
if (target === undefined) {
  throw new Error("CRONOQ_TARGET names the server to test against");
}
const file = (name: string): Buffer | undefined => {
  const path = process.env[name];
  return path ? readFileSync(path) : undefined;
};
const ca = file("CRONOQ_TLS_CA");
const client = new Client({
  target,
  tls: ca === undefined ? undefined : { ca, cert: file("CRONOQ_TLS_CERT"), key: file("CRONOQ_TLS_KEY") },
});
after(() => client.close());

interface Echo {
  pool: string;
  contentType: string;
  payload: string;
}

describe("Client", () => {
  test("submit with wait returns how the task ended", async () => {
    const done = await client.submit({ n: 1 }, { wait: true, waitTimeout: 10 });
    assert.equal(done.duplicate, false);
    assert.ok(done.result?.ok);
    assert.equal(done.result.status, "succeeded");
    assert.equal(done.result.id, done.id);
    assert.deepEqual(done.result.json<Echo>(), { pool: "default", contentType: "application/json", payload: '{"n":1}' });
  });

  test("payloads are encoded by type, and contentType replaces the guess", async () => {
    const cases: [unknown, string | undefined, Echo][] = [
      ["text", undefined, { pool: "default", contentType: "text/plain; charset=utf-8", payload: "text" }],
      [Buffer.from("raw"), undefined, { pool: "default", contentType: "application/octet-stream", payload: "raw" }],
      [undefined, undefined, { pool: "default", contentType: "", payload: "" }],
      ["<p/>", "text/html", { pool: "default", contentType: "text/html", payload: "<p/>" }],
    ];
    for (const [payload, contentType, echoed] of cases) {
      const done = await client.submit(payload, { contentType, wait: true, waitTimeout: 10 });
      assert.deepEqual(done.result?.json(), echoed);
    }
  });

  test("options reach the task, and get finds it by id or key", async () => {
    const key = `opts-${process.pid}`;
    const sub = await client.submit("x", { pool: "idle", key, kind: "render", priority: "high", tenant: "acme" });
    const byId = await client.get(sub.id);
    const byKey = await client.get(key, { pool: "idle" });
    assert.deepEqual(byKey, byId);
    assert.equal(byId.status, "ready");
    assert.equal(byId.done, false);
    assert.deepEqual(
      [byId.pool, byId.key, byId.kind, byId.priority, byId.tenant],
      ["idle", key, "render", "high", "acme"],
    );
    assert.ok(byId.createdAt instanceof Date);
    const again = await client.submit("y", { pool: "idle", key });
    assert.deepEqual([again.id, again.duplicate], [sub.id, true]);
    assert.equal(await client.cancel(key, { pool: "idle" }), true);
  });

  test("an unknown task is NotFound", async () => {
    await assert.rejects(client.get(123456789n), (err: unknown) => err instanceof NotFound && err.code === "not_found");
    await assert.rejects(client.get(`no-such-key-${process.pid}`), NotFound);
  });

  test("submitBatch is atomic, in order, and may depend on keys of the same batch", async () => {
    const prefix = `batch-${process.pid}`;
    const subs = await client.submitBatch([
      task({ step: 1 }, { key: `${prefix}-1` }),
      task({ step: 2 }, { key: `${prefix}-2`, after: `${prefix}-1` }),
    ]);
    assert.equal(subs.length, 2);
    const second = await client.wait(subs[1]!.id, { timeout: 10 });
    const first = await client.get(subs[0]!.id);
    assert.equal(second.json<Echo>().payload, '{"step":2}');
    assert.equal(first.status, "succeeded");
    assert.ok(first.finishedAt !== undefined && second.ok);
    // A batch refused as a whole: nothing of it is submitted.
    await assert.rejects(
      client.submitBatch([task("ok", { key: `${prefix}-3` }), task("x", { after: `${prefix}-missing` })]),
      (err: unknown) => err instanceof Error && "code" in err,
    );
    await assert.rejects(client.get(`${prefix}-3`), NotFound);
  });

  test("cancel ends a live task once", async () => {
    const sub = await client.submit("x", { pool: "idle" });
    assert.equal(await client.cancel(sub.id), true);
    assert.equal((await client.get(sub.id)).status, "cancelled");
    assert.equal((await client.wait(sub.id, { timeout: 5 })).status, "cancelled");
    assert.equal(await client.cancel(sub.id), false);
  });

  test("a wait that runs out is a TimeoutError, and the task stays", async () => {
    const sub = await client.submit("x", { pool: "idle" });
    await assert.rejects(client.wait(sub.id, { timeout: 0.2 }), TimeoutError);
    await assert.rejects(client.submit("y", { pool: "idle", wait: true, waitTimeout: 0.2 }), TimeoutError);
    assert.equal((await client.get(sub.id)).status, "ready");
    await client.cancel(sub.id);
  });

  test("watch yields status changes as an async iterator", async () => {
    const sub = await client.submit("x", { pool: "idle" });
    const events = client.watch({ ids: [sub.id], allTransitions: true });
    assert.deepEqual(await events.unavailableShards(), []); // subscribed: no event can be missed now
    await client.cancel(sub.id);
    const seen: string[] = [];
    for await (const event of events) {
      assert.equal(event.id, sub.id);
      assert.ok(event.at instanceof Date);
      seen.push(event.status);
      if (event.status === "cancelled") {
        break; // ends the call
      }
    }
    assert.deepEqual(seen, ["cancelled"]);
  });

  test("bad options are refused before anything is sent, naming the option", () => {
    assert.throws(() => task("x", { colour: "red" } as never), /unknown task option\(s\): colour/);
    assert.throws(() => task("x", { deadlineIn: 1, deadlineAt: new Date() }), /use either deadlineIn or deadlineAt/);
    assert.throws(() => task("x", { timeout: -1 }), /timeout must be a finite, non-negative number of seconds/);
    assert.throws(() => task("x", { priority: "urgent" }), /priority must be one of critical, high, normal, low/);
    assert.throws(() => task({ n: Number.POSITIVE_INFINITY }), /Infinity is not valid JSON/);
    assert.throws(() => task("x", { after: 2 ** 60 }), /after\[0\]: a task id given as a number must be a safe/);
    return assert.rejects(client.submit("x", { waitTimeout: 1 }), /waitTimeout needs wait: true/);
  });
});
