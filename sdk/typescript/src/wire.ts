/**
 * Translations between the wire's enums, ids and times and the SDK's lower-case names, bigints, seconds
 * and Dates. The name tables are built from the generated enums, so they cannot drift from
 * `cronoq.proto`.
 */

import { EdgeCond, MissPolicy, Priority, TaskStatus, type TaskRef as WireRef } from "./gen/cronoq/v1/cronoq.js";

/** A task named by its id (a bigint, or a number that is a safe integer) or its key (a string). */
export type TaskRef = bigint | number | string;

/** Wire value → lower-case name without the enum's prefix; UNSPECIFIED (0) and UNRECOGNIZED left out. */
function names(enumeration: Record<string, string | number>, prefix: string): Map<number, string> {
  const table = new Map<number, string>();
  for (const [name, value] of Object.entries(enumeration)) {
    if (typeof value === "number" && value > 0) {
      table.set(value, name.slice(prefix.length).toLowerCase());
    }
  }
  return table;
}

function values(table: Map<number, string>): Map<string, number> {
  return new Map([...table].map(([value, name]) => [name, value]));
}

const STATUS_NAMES = names(TaskStatus, "TASK_STATUS_");
const PRIORITY_NAMES = names(Priority, "PRIORITY_");
const PRIORITY_VALUES = values(PRIORITY_NAMES);
const MISS_VALUES = values(names(MissPolicy, "MISS_POLICY_"));
const EDGE_VALUES = values(names(EdgeCond, "EDGE_COND_"));
// The engine accepts both spellings ("success" and "on_success").
for (const [name, value] of [...EDGE_VALUES]) {
  EDGE_VALUES.set(name.replace(/^on_/, ""), value);
}

/** Statuses after which nothing more happens to a task. */
export const TERMINAL_STATUSES: ReadonlySet<string> = new Set([
  "succeeded",
  "failed",
  "dead_lettered",
  "cancelled",
  "skipped",
  "missed",
  "shed",
]);

function choice(field: string, value: unknown, table: Map<string, number>): number {
  const found = typeof value === "string" ? table.get(value.toLowerCase()) : undefined;
  if (found === undefined) {
    throw new RangeError(`${field} must be one of ${[...table.keys()].join(", ")} (got ${JSON.stringify(value)})`);
  }
  return found;
}

export function statusName(value: TaskStatus): string {
  return STATUS_NAMES.get(value) ?? "unspecified";
}

/** `undefined` when the server does not know the priority (UNSPECIFIED). */
export function priorityName(value: Priority): string | undefined {
  return PRIORITY_NAMES.get(value);
}

/** The wire enum for a class name (any case), a class number 0..3, or undefined (normal). */
export function priorityValue(priority: string | number | undefined): Priority {
  if (priority === undefined) {
    return Priority.PRIORITY_NORMAL;
  }
  if (typeof priority === "number") {
    if (!Number.isInteger(priority) || priority < 0 || priority > 3) {
      throw new RangeError(`priority must be 0..3 (got ${priority})`);
    }
    return priority + 1; // the wire enum is offset by UNSPECIFIED
  }
  return choice("priority", priority, PRIORITY_VALUES);
}

export function missValue(onMiss: string | undefined): MissPolicy {
  return onMiss === undefined ? MissPolicy.MISS_POLICY_UNSPECIFIED : choice("onMiss", onMiss, MISS_VALUES);
}

export function edgeValue(cond: string): EdgeCond {
  return choice("dependency condition", cond, EDGE_VALUES);
}

/** A caller's number of seconds, checked here so that the error names the option. */
export function duration(field: string, value: unknown): number | undefined {
  if (value === undefined || value === null) {
    return undefined;
  }
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new RangeError(`${field} must be a finite, non-negative number of seconds (got ${String(value)})`);
  }
  return value;
}

/** A Date, or Unix seconds, as Unix nanoseconds. */
export function unixNs(field: string, when: unknown): bigint | undefined {
  if (when === undefined || when === null) {
    return undefined;
  }
  const ms = when instanceof Date ? when.getTime() : typeof when === "number" ? when * 1000 : Number.NaN;
  if (!Number.isFinite(ms)) {
    throw new RangeError(`${field} must be a valid Date or finite Unix seconds (got ${String(when)})`);
  }
  return BigInt(Math.round(ms * 1000)) * 1000n;
}

/** Unix nanoseconds as a Date (millisecond precision); undefined stays undefined. */
export function dateOf(ns: bigint | undefined): Date | undefined {
  return ns === undefined ? undefined : new Date(Number(ns / 1_000_000n));
}

/** A task id as the wire carries it; a number must be a safe, non-negative integer. */
export function taskId(field: string, id: bigint | number): bigint {
  if (typeof id === "bigint") {
    if (id < 0n || BigInt.asUintN(64, id) !== id) {
      throw new RangeError(`${field}: a task id is an unsigned 64-bit integer (got ${id})`);
    }
    return id;
  }
  if (!Number.isSafeInteger(id) || id < 0) {
    throw new RangeError(`${field}: a task id given as a number must be a safe non-negative integer (got ${id}); pass a bigint`);
  }
  return BigInt(id);
}

/** The wire's TaskRef for an id (bigint or number) or a key (string). */
export function wireRef(ref: TaskRef, field = "task"): WireRef {
  if (typeof ref === "string") {
    return { key: ref };
  }
  if (typeof ref === "bigint" || typeof ref === "number") {
    return { id: taskId(field, ref) };
  }
  throw new TypeError(`${field}: a task is named by its id (bigint or number) or key (string), not ${JSON.stringify(ref)}`);
}
