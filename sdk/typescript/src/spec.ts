/**
 * `task(payload, options)`: task options as a wire `TaskSpec`. One builder serves `Client.submit` and
 * `Client.submitBatch`, so every option is converted and checked the same way whichever call carries it.
 */

import { encode } from "./codec.js";
import type { Dep, RetryPolicy, TaskSpec } from "./gen/cronoq/v1/cronoq.js";
import {
  type TaskRef,
  duration,
  edgeValue,
  missValue,
  priorityValue,
  unixNs,
  wireRef,
} from "./wire.js";

/** A retry policy; a missing field (or 0) means the pool's value, except `jitter`, true by default. */
export interface RetryOptions {
  maxAttempts?: number;
  /** Seconds. */
  initialBackoff?: number;
  multiplier?: number;
  /** Seconds. */
  maxBackoff?: number;
  jitter?: boolean;
}

/** A dependency: `[ref, cond]` or `{ ref, cond }`; `cond` is success (the default), failure or complete. */
export type DepOption = readonly [TaskRef, string] | { ref: TaskRef; cond?: string };

/**
 * Options of a task. Durations are seconds; `*At` take a Date or Unix seconds. Unset options take the
 * pool's defaults.
 */
export interface TaskOptions {
  pool?: string;
  kind?: string;
  /** Unique: a second submission with the same key returns the first task (`duplicate`). */
  key?: string;
  tenant?: string;
  /** "critical", "high", "normal" (the default) or "low", in any case, or 0..3. */
  priority?: string | number;
  /** A soft deadline, relative: it raises urgency, never fails the task. Give at most one of the two. */
  deadlineIn?: number;
  deadlineAt?: Date | number;
  /** A fixed start. Give at most one of the two. */
  startIn?: number;
  startAt?: Date | number;
  /** The allowed lateness of a fixed start. */
  tolerance?: number;
  /** "run_late", "skip" or "fail". */
  onMiss?: string;
  durationHint?: number;
  /** The limit for each attempt. */
  timeout?: number;
  retry?: RetryOptions;
  /** Tasks (ids or keys) that must succeed first. */
  after?: TaskRef | readonly TaskRef[];
  deps?: readonly DepOption[];
  resources?: Record<string, number>;
  tags?: Record<string, unknown>;
  /** Worker labels the task needs: it runs only on workers that have all of them. */
  labels?: Record<string, unknown>;
  /** Replaces the content type guessed from the payload. */
  contentType?: string;
}

const OPTION_NAMES: ReadonlySet<string> = new Set([
  "pool",
  "kind",
  "key",
  "tenant",
  "priority",
  "deadlineIn",
  "deadlineAt",
  "startIn",
  "startAt",
  "tolerance",
  "onMiss",
  "durationHint",
  "timeout",
  "retry",
  "after",
  "deps",
  "resources",
  "tags",
  "labels",
  "contentType",
]);

/**
 * A wire `TaskSpec` for `payload`, for `Client.submitBatch`. The payload is encoded as bytes, text,
 * nothing or JSON (`contentType` replaces the guessed type). Bad options throw before anything is sent:
 * a `TypeError` for an unknown option name or a value of the wrong type, a `RangeError` for a value out
 * of range or both forms of the same option.
 */
export function task(payload?: unknown, options: TaskOptions = {}, ignore: ReadonlySet<string> = NONE): TaskSpec {
  const unknown = Object.keys(options).filter((name) => !OPTION_NAMES.has(name) && !ignore.has(name));
  if (unknown.length > 0) {
    throw new TypeError(`unknown task option(s): ${unknown.sort().join(", ")}`);
  }
  for (const [relative, absolute] of [
    ["deadlineIn", "deadlineAt"],
    ["startIn", "startAt"],
  ] as const) {
    if (options[relative] !== undefined && options[absolute] !== undefined) {
      throw new RangeError(`use either ${relative} or ${absolute}`);
    }
  }
  const encoded = encode(payload, options.contentType);
  return {
    payload: encoded.data,
    contentType: encoded.contentType,
    kind: text("kind", options.kind),
    pool: text("pool", options.pool),
    priority: priorityValue(options.priority),
    key: text("key", options.key),
    deadlineInS: duration("deadlineIn", options.deadlineIn),
    deadlineUnixNs: unixNs("deadlineAt", options.deadlineAt),
    startInS: duration("startIn", options.startIn),
    startUnixNs: unixNs("startAt", options.startAt),
    toleranceS: duration("tolerance", options.tolerance),
    onMiss: missValue(options.onMiss),
    durationHintS: duration("durationHint", options.durationHint),
    timeoutS: duration("timeout", options.timeout),
    retry: options.retry === undefined ? undefined : retryPolicy(options.retry),
    deps: deps(options.after, options.deps ?? []),
    resources: resources(options.resources),
    tags: strings("tags", options.tags),
    labels: strings("labels", options.labels),
    tenant: text("tenant", options.tenant),
  };
}

const NONE: ReadonlySet<string> = new Set();

function text(field: string, value: unknown): string {
  if (value === undefined || value === null) {
    return "";
  }
  if (typeof value !== "string") {
    throw new TypeError(`${field} must be a string (got ${typeof value})`);
  }
  return value;
}

/** Missing fields go out as 0 (jitter as true), since the wire's RetryPolicy cannot leave one unset;
 * the server reads 0 as "the pool's value". */
function retryPolicy(retry: RetryOptions): RetryPolicy {
  const maxAttempts = retry.maxAttempts ?? 0;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 0 || maxAttempts > 0xffffffff) {
    throw new RangeError(`retry.maxAttempts must be a non-negative integer (got ${maxAttempts})`);
  }
  const multiplier = retry.multiplier ?? 0;
  if (!Number.isFinite(multiplier) || multiplier < 0) {
    throw new RangeError(`retry.multiplier must be a finite number >= 0 (got ${multiplier})`);
  }
  return {
    maxAttempts,
    initialBackoffS: duration("retry.initialBackoff", retry.initialBackoff) ?? 0,
    multiplier,
    maxBackoffS: duration("retry.maxBackoff", retry.maxBackoff) ?? 0,
    jitter: retry.jitter ?? true,
  };
}

function deps(after: TaskOptions["after"], edges: readonly DepOption[]): Dep[] {
  const out: Dep[] = [];
  if (after !== undefined) {
    const refs: readonly TaskRef[] = Array.isArray(after) ? after : [after as TaskRef];
    refs.forEach((ref, i) => out.push({ target: wireRef(ref, `after[${i}]`), cond: edgeValue("success") }));
  }
  edges.forEach((dep, i) => {
    const [ref, cond] = Array.isArray(dep) ? dep : [(dep as { ref: TaskRef }).ref, (dep as { cond?: string }).cond];
    out.push({ target: wireRef(ref as TaskRef, `deps[${i}]`), cond: edgeValue(cond ?? "success") });
  });
  return out;
}

function resources(given: Record<string, number> | undefined): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [name, amount] of Object.entries(given ?? {})) {
    if (!Number.isInteger(amount) || amount < 0 || amount > 0xffffffff) {
      throw new RangeError(`resources.${name} must be a non-negative integer (got ${String(amount)})`);
    }
    out[name] = amount;
  }
  return out;
}

function strings(field: string, given: Record<string, unknown> | undefined): Record<string, string> {
  if (given !== undefined && (typeof given !== "object" || given === null || Array.isArray(given))) {
    throw new TypeError(`${field} must be an object of names to values`);
  }
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(given ?? {})) {
    out[name] = String(value);
  }
  return out;
}
