use std::fmt;
use std::time::Duration;

/// How a handler's attempt ended other than with an output. Any error a handler converts with
/// [`TaskError::from_err`] is retryable: retries are the safe default for an error the handler did not
/// classify.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskError {
    /// The attempt failed and is retried, no sooner than `retry_after` (and the pool's backoff).
    Retryable {
        message: String,
        retry_after: Option<Duration>,
    },
    /// A retry cannot fix it (invalid input, a 4xx answer): the task fails at once.
    Permanent(String),
    /// Hand the lease back unrun: the server offers it to another worker of the pool with the same
    /// labels without counting an attempt or, when none can take it, fails the attempt as retryable.
    Reject(String),
    /// End the task as cancelled.
    Cancelled,
}

impl TaskError {
    /// A retryable failure carrying `err`'s text.
    pub fn from_err<E: fmt::Display>(err: E) -> Self {
        TaskError::Retryable {
            message: err.to_string(),
            retry_after: None,
        }
    }

    /// A retryable failure to be retried no sooner than `after`, for example when a remote service said
    /// when to come back.
    pub fn retry_after<E: fmt::Display>(err: E, after: Duration) -> Self {
        TaskError::Retryable {
            message: err.to_string(),
            retry_after: Some(after),
        }
    }

    /// A permanent failure: the task fails without a retry.
    pub fn permanent<E: fmt::Display>(err: E) -> Self {
        TaskError::Permanent(err.to_string())
    }

    /// Give the lease back unrun, saying why.
    pub fn reject(reason: impl Into<String>) -> Self {
        TaskError::Reject(reason.into())
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Retryable { message, .. } | TaskError::Permanent(message) => f.write_str(message),
            TaskError::Reject(reason) => write!(f, "rejected: {reason}"),
            TaskError::Cancelled => f.write_str("cancelled"),
        }
    }
}

impl std::error::Error for TaskError {}

/// The gRPC status codes, named as gRPC names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    pub(crate) fn from_i32(value: i32) -> Code {
        use Code::*;
        [
            Ok,
            Cancelled,
            Unknown,
            InvalidArgument,
            DeadlineExceeded,
            NotFound,
            AlreadyExists,
            PermissionDenied,
            ResourceExhausted,
            FailedPrecondition,
            Aborted,
            OutOfRange,
            Unimplemented,
            Internal,
            Unavailable,
            DataLoss,
            Unauthenticated,
        ]
        .get(usize::try_from(value).unwrap_or(usize::MAX))
        .copied()
        .unwrap_or(Unknown)
    }
}

/// Why [`crate::worker::run_worker`] gave up: a status from the server that retrying cannot fix (a
/// refused token, an unknown pool, a refused shard redirect), or invalid options (`InvalidArgument`,
/// naming the option).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerError {
    pub code: Code,
    pub message: String,
}

impl WorkerError {
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Self {
        WorkerError {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(option: &str, why: impl fmt::Display) -> Self {
        WorkerError::new(Code::InvalidArgument, format!("WorkerOptions.{option}: {why}"))
    }
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cronoq: {:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for WorkerError {}
