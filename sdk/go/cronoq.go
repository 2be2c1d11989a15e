// Package cronoq is the Go SDK of cronoq: RunWorker serves a pool as a remote worker over the worker
// protocol (docs/worker-protocol.md), and Client submits, inspects, waits for, cancels and watches tasks.
//
// The wire messages are in the cronoqv1 package, generated from proto/cronoq/v1/cronoq.proto.
package cronoq

import (
	"errors"
	"time"
)

// ProtocolVersion is the worker protocol version the SDK speaks.
const ProtocolVersion = 3

// MaxRedirects is the number of shard redirects a worker follows in a row before RunWorker gives up.
const MaxRedirects = 3

// RetryableError is the error Retryable returns: the attempt failed and is retried, after at least
// After (and the pool's backoff) when After is positive.
type RetryableError struct {
	Err   error
	After time.Duration
}

func (e *RetryableError) Error() string { return errorText(e.Err) }
func (e *RetryableError) Unwrap() error { return e.Err }

// Retryable marks a handler's error as a retryable failure, to be retried no sooner than after (0: the
// pool's backoff alone). Any error a handler returns that is none of this package's is retryable too;
// Retryable adds the delay, for example when a remote service says when to come back.
func Retryable(err error, after time.Duration) error {
	return &RetryableError{Err: err, After: after}
}

// PermanentError is the error Permanent returns: the task fails without a retry.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return errorText(e.Err) }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks a handler's error as one a retry cannot fix (invalid input, a 4xx answer): the task
// fails at once.
func Permanent(err error) error { return &PermanentError{Err: err} }

// RejectError is the error Reject returns: the lease is handed back unrun.
type RejectError struct{ Reason string }

func (e *RejectError) Error() string { return "rejected: " + e.Reason }

// Reject hands the lease back unrun: the server offers it to another worker of the pool with the same
// labels without counting an attempt or, when none can take it, fails the attempt as retryable.
func Reject(reason string) error { return &RejectError{Reason: reason} }

// CancelTask, returned by a handler (or wrapped in its error), ends the task as cancelled.
var CancelTask = errors.New("cronoq: cancel the task")

// ErrTimeout is wrapped by the error of a Client call that waited for a task when the wait ran out;
// the task itself is not affected.
var ErrTimeout = errors.New("cronoq: timed out waiting for the task")

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
