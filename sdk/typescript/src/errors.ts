/**
 * The errors of the SDK: those a handler throws to say how its attempt ended (`Retryable`, `Permanent`,
 * `Reject`, `CancelTask`), and `ApiError`, one class per gRPC status, for what a server or the channel
 * answered. The Python SDK has the same classes under the same names, so a failure reads the same in
 * either language.
 *
 * This module loads no gRPC code: the package's main entry point re-exports it for code that only
 * classifies errors.
 */

/** Base of every error the SDK throws or lets a handler throw. */
export class CronoqError extends Error {
  constructor(message?: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Options of {@link Retryable}. */
export interface RetryableOptions {
  /** Seconds to wait at least before the next attempt (the pool's backoff still applies). */
  retryAfter?: number;
  cause?: unknown;
}

/**
 * Thrown by a handler: the attempt failed and may be retried, after at least `retryAfter` seconds.
 * A `retryAfter` that is not a finite number >= 0 throws a `RangeError` here, at construction.
 */
export class Retryable extends CronoqError {
  retryAfter: number | undefined;

  constructor(message: string, options: RetryableOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.retryAfter = checkRetryAfter(options.retryAfter);
  }
}

/** Thrown by a handler: the task fails now, without another attempt. */
export class Permanent extends CronoqError {
  constructor(message: string, options: { cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
  }
}

/**
 * Thrown by a handler to hand its lease back unrun: the server offers it to another worker of the pool
 * with the same labels without counting an attempt, or fails the attempt as retryable when no other
 * worker can take it.
 */
export class Reject extends CronoqError {
  constructor(readonly reason: string = "") {
    super(reason);
  }
}

/** Thrown by a handler to end its task as cancelled, without retries. */
export class CancelTask extends CronoqError {}

/**
 * `retryAfter` as the wire carries it: undefined, or a finite number of seconds >= 0. A server ends the
 * stream on anything else (failing every other lease on it), so the worker checks again before it sends.
 */
export function checkRetryAfter(value: unknown): number | undefined {
  if (value === undefined || value === null) {
    return undefined;
  }
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new RangeError(`retryAfter must be a finite number of seconds >= 0 (got ${String(value)})`);
  }
  return value;
}

/** Lower-case gRPC status names, as the servers and the Python SDK spell them. */
export type StatusCode =
  | "ok"
  | "cancelled"
  | "unknown"
  | "invalid_argument"
  | "deadline_exceeded"
  | "not_found"
  | "already_exists"
  | "permission_denied"
  | "resource_exhausted"
  | "failed_precondition"
  | "aborted"
  | "out_of_range"
  | "unimplemented"
  | "internal"
  | "unavailable"
  | "data_loss"
  | "unauthenticated";

/** gRPC's numeric codes in order: the index is the number. */
export const STATUS_CODES: readonly StatusCode[] = [
  "ok",
  "cancelled",
  "unknown",
  "invalid_argument",
  "deadline_exceeded",
  "not_found",
  "already_exists",
  "permission_denied",
  "resource_exhausted",
  "failed_precondition",
  "aborted",
  "out_of_range",
  "unimplemented",
  "internal",
  "unavailable",
  "data_loss",
  "unauthenticated",
];

/**
 * An error with a gRPC status: `code` is its lower-case name, `retryable` whether the same call may
 * succeed later (`unavailable`, `resource_exhausted`), `metadata` the call's `cronoq-*` trailing
 * metadata. Each status has a subclass named as in the Python SDK (`NotFound`, `Unavailable`, ...).
 */
export class ApiError extends CronoqError {
  readonly code: StatusCode;
  /** The server's message, without the status name that `message` starts with. */
  readonly details: string;
  readonly retryable: boolean;
  metadata: Record<string, string> = {};

  /** `retryable` defaults to what the code says; a message over a size limit is no better next time. */
  constructor(message: string, code: StatusCode = "unknown", retryable?: boolean) {
    super(message ? `${code}: ${message}` : code);
    this.code = code;
    this.retryable = retryable ?? (code === "unavailable" || code === "resource_exhausted");
    this.details = message;
  }
}

export class InvalidArgument extends ApiError {
  constructor(message = "") {
    super(message, "invalid_argument");
  }
}
export class Unauthenticated extends ApiError {
  constructor(message = "") {
    super(message, "unauthenticated");
  }
}
export class PermissionDenied extends ApiError {
  constructor(message = "") {
    super(message, "permission_denied");
  }
}
export class NotFound extends ApiError {
  constructor(message = "") {
    super(message, "not_found");
  }
}
export class FailedPrecondition extends ApiError {
  constructor(message = "") {
    super(message, "failed_precondition");
  }
}
export class AlreadyExists extends ApiError {
  constructor(message = "") {
    super(message, "already_exists");
  }
}
export class ResourceExhausted extends ApiError {
  constructor(message = "") {
    super(message, "resource_exhausted");
  }
}
export class Unavailable extends ApiError {
  constructor(message = "") {
    super(message, "unavailable");
  }
}
export class DeadlineExceeded extends ApiError {
  constructor(message = "") {
    super(message, "deadline_exceeded");
  }
}
export class DataLoss extends ApiError {
  constructor(message = "") {
    super(message, "data_loss");
  }
}
export class Cancelled extends ApiError {
  constructor(message = "") {
    super(message, "cancelled");
  }
}
export class Unimplemented extends ApiError {
  constructor(message = "") {
    super(message, "unimplemented");
  }
}
export class Internal extends ApiError {
  constructor(message = "") {
    super(message, "internal");
  }
}

const BY_CODE: Partial<Record<StatusCode, new (message?: string) => ApiError>> = {
  invalid_argument: InvalidArgument,
  unauthenticated: Unauthenticated,
  permission_denied: PermissionDenied,
  not_found: NotFound,
  failed_precondition: FailedPrecondition,
  already_exists: AlreadyExists,
  resource_exhausted: ResourceExhausted,
  unavailable: Unavailable,
  deadline_exceeded: DeadlineExceeded,
  data_loss: DataLoss,
  cancelled: Cancelled,
  unimplemented: Unimplemented,
  internal: Internal,
};

/** The error for a status name; a status without a class of its own is a plain `ApiError`. */
export function errorFor(code: StatusCode, message: string): ApiError {
  const cls = BY_CODE[code];
  return cls === undefined ? new ApiError(message, code) : new cls(message);
}

/** Thrown by `Client` calls that wait for a task (`wait`, `submit` with `wait`) when the wait ran out. */
export class TimeoutError extends CronoqError {}
