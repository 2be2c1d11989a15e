/**
 * The TypeScript counterpart of bench/worker.py, for `python -m bench.sdk_workers`: a no-op handler,
 * `{"registered": true}` once registered, then after `--expect` tasks a JSON summary with the CPU the
 * process spent between registering and its last task (its start-up is not the drain's cost).
 *
 * node dist/bench/worker.js --target HOST:PORT --expect N [--pool P] [--slots S] [--plain]
 */

import { parseArgs } from "node:util";

import { runWorker } from "../src/node.js";

const { values } = parseArgs({
  options: {
    target: { type: "string" },
    pool: { type: "string", default: "default" },
    slots: { type: "string", default: "64" },
    expect: { type: "string" },
    plain: { type: "boolean", default: false },
  },
});
if (values.target === undefined || values.expect === undefined) {
  throw new Error("--target and --expect are required");
}
const expect = Number(values.expect);
const stop = new AbortController();
let count = 0;
let registeredCpu: NodeJS.CpuUsage | undefined;
let cpuS = 0;

await runWorker(
  {
    target: values.target,
    pool: values.pool,
    slots: Number(values.slots),
    name: "bench-ts",
    batches: !values.plain,
    signal: stop.signal,
    onRegistered: () => {
      if (registeredCpu === undefined) {
        registeredCpu = process.cpuUsage();
        process.stdout.write(`${JSON.stringify({ registered: true })}\n`);
      }
    },
  },
  () => {
    count += 1;
    if (count === expect) {
      const used = process.cpuUsage(registeredCpu);
      cpuS = (used.user + used.system) / 1e6; // every thread's, start-up and shutdown left out
      stop.abort();
    }
    return undefined;
  },
);
process.stdout.write(`${JSON.stringify({ handled: count, latencies: [], cpu_s: cpuS })}\n`);
