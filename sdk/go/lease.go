package cronoq

import (
	"encoding/json"
	"strings"
	"sync"
	"time"

	pb "github.com/cronoq/cronoq/sdk/go/cronoqv1"
)

// Lease is one attempt of a task, handed to the handler. Use (TaskID, Attempt) to make side effects
// idempotent: a task runs at least once, and can run more than once.
type Lease struct {
	ID          uint64            // the lease: the attempt on this worker's stream
	TaskID      uint64            // the task
	Attempt     uint32            // starts at 1
	Payload     []byte            // as submitted
	ContentType string            // of the payload
	Kind        string            // the task's kind
	Key         string            // the task's key ("" when it has none)
	Tags        map[string]string // include traceparent (and tracestate) when the task carries a trace context
	Timeout     time.Duration     // the limit for this attempt; 0 when there is none
	Deadline    time.Time         // the task's soft deadline; zero when there is none
	Pool        string
	Priority    string        // "critical", "high", "normal" or "low"; "" when the server does not say
	LeaseTTL    time.Duration // the heartbeat bound; the worker sends the heartbeats, not the handler

	// OutputContentType is the content type the handler's output is reported with: set it in the
	// handler ("application/json", say). Empty means application/octet-stream for a non-empty output.
	OutputContentType string

	mu          sync.Mutex
	abortReason string
}

// JSON parses the payload as JSON into v; an empty payload leaves v as it is.
func (l *Lease) JSON(v any) error {
	if len(l.Payload) == 0 {
		return nil
	}
	return json.Unmarshal(l.Payload, v)
}

// Text is the payload as text.
func (l *Lease) Text() string { return string(l.Payload) }

// AbortReason is why the server aborted this attempt ("attempt timed out", "cancelled", ...), or why the
// worker ended it (drained, its stream ended); "" while it runs. The handler's context ends at the same
// moment.
func (l *Lease) AbortReason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.abortReason
}

func (l *Lease) setAbortReason(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.abortReason == "" {
		l.abortReason = reason
	}
}

// leaseFrom builds the handler's Lease; a TTL on the lease itself takes precedence over the one from
// registration.
func leaseFrom(m *pb.Lease, registeredTTL time.Duration) *Lease {
	l := &Lease{
		ID:          m.Lease,
		TaskID:      m.TaskId,
		Attempt:     m.Attempt,
		Payload:     m.Payload,
		ContentType: m.ContentType,
		Kind:        m.Kind,
		Key:         m.Key,
		Tags:        m.Tags,
		Pool:        m.Pool,
		Priority:    priorityName(m.Priority),
		LeaseTTL:    registeredTTL,
	}
	if l.Tags == nil {
		l.Tags = map[string]string{}
	}
	if m.TimeoutS != nil {
		l.Timeout = seconds(*m.TimeoutS)
	}
	if m.DeadlineUnixNs != nil {
		l.Deadline = time.Unix(0, *m.DeadlineUnixNs)
	}
	if m.LeaseTtlS != nil {
		l.LeaseTTL = seconds(*m.LeaseTtlS)
	}
	return l
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// priorityName is the lower-case class name of a wire priority ("" when unspecified).
func priorityName(p pb.Priority) string {
	if p == pb.Priority_PRIORITY_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(p.String(), "PRIORITY_"))
}
