package cronoq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	pb "github.com/cronoq/cronoq/sdk/go/cronoqv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// waitMargin is added to a waiting call's own deadline so that the server's answer (the result, or its
// DEADLINE_EXCEEDED) arrives before the client gives up on the call.
const waitMargin = 5 * time.Second

// ClientOptions configure NewClient.
type ClientOptions struct {
	// Token is sent as "authorization: Bearer <token>".
	Token string
	// TLS turns TLS on with these settings (RootCAs, Certificates for mTLS); nil with an https://
	// target uses the system roots.
	TLS *tls.Config
	// DialOptions are added to the SDK's own.
	DialOptions []grpc.DialOption
}

// Client submits, inspects, waits for, cancels and watches tasks over one connection. Failed calls
// return gRPC status errors (status.Code(err) is codes.NotFound for an unknown task, and so on); a wait
// that runs out returns an error wrapping ErrTimeout. A Client is safe for concurrent use.
type Client struct {
	conn  *grpc.ClientConn
	tasks pb.TasksClient
	token string
}

// NewClient connects to target (host:port or an http://, https:// or grpc:// URL) lazily: the first
// call makes the connection.
func NewClient(target string, opts ClientOptions) (*Client, error) {
	ep, err := parseTarget(target, opts.TLS != nil)
	if err != nil {
		return nil, err
	}
	conn, err := dial(ep, opts.TLS, true, opts.DialOptions)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, tasks: pb.NewTasksClient(conn), token: opts.Token}, nil
}

// Close closes the connection; calls in flight fail.
func (c *Client) Close() error { return c.conn.Close() }

// Ref names a task: by id (ID) or by key (Key), optionally within a pool (InPool). A key names one task
// in the whole cluster, but two submissions of a key racing on two shards can leave a task on each; a
// lookup by that key alone then fails with FailedPrecondition naming both, and the pool picks one.
type Ref struct {
	id   uint64
	key  string
	pool string
}

// ID names the task with this id.
func ID(id uint64) Ref { return Ref{id: id} }

// Key names the task with this key.
func Key(key string) Ref { return Ref{key: key} }

// InPool names the task's pool: a task of another pool is then NotFound.
func (r Ref) InPool(pool string) Ref { r.pool = pool; return r }

func (r Ref) wire() *pb.TaskRef {
	if r.key != "" {
		return &pb.TaskRef{Target: &pb.TaskRef_Key{Key: r.key}}
	}
	return &pb.TaskRef{Target: &pb.TaskRef_Id{Id: r.id}}
}

// Task is what Submit sends. Zero values mean the pool's defaults.
type Task struct {
	Payload      []byte
	ContentType  string // default: application/octet-stream for a non-empty payload
	Pool         string
	Kind         string
	Key          string // unique; a Submit with the key of an existing task returns that task (Duplicate)
	Tenant       string
	Priority     string        // "critical", "high", "normal" or "low"
	Timeout      time.Duration // the limit for each attempt
	DeadlineIn   time.Duration // a soft deadline, relative; or DeadlineAt
	DeadlineAt   time.Time
	StartIn      time.Duration // a fixed start, relative; or StartAt
	StartAt      time.Time
	Tolerance    time.Duration // the allowed lateness of a fixed start
	OnMiss       string        // "run_late", "skip" or "fail"
	DurationHint time.Duration
	Retry        *RetryPolicy
	After        []Ref // tasks that must succeed first
	Resources    map[string]uint32
	Tags         map[string]string
	Labels       map[string]string // the task runs only on workers with all of these labels
}

// RetryPolicy overrides the pool's retries; a zero field means the pool's value.
type RetryPolicy struct {
	MaxAttempts    uint32
	InitialBackoff time.Duration
	Multiplier     float64
	MaxBackoff     time.Duration
	NoJitter       bool
}

var priorities = map[string]pb.Priority{
	"critical": pb.Priority_PRIORITY_CRITICAL, "high": pb.Priority_PRIORITY_HIGH,
	"normal": pb.Priority_PRIORITY_NORMAL, "low": pb.Priority_PRIORITY_LOW,
}

var missPolicies = map[string]pb.MissPolicy{
	"run_late": pb.MissPolicy_MISS_POLICY_RUN_LATE, "skip": pb.MissPolicy_MISS_POLICY_SKIP,
	"fail": pb.MissPolicy_MISS_POLICY_FAIL,
}

// spec checks t and builds its wire message; the error names the field.
func (t Task) spec() (*pb.TaskSpec, error) {
	s := &pb.TaskSpec{
		Payload: t.Payload, ContentType: t.ContentType, Kind: t.Kind, Pool: t.Pool, Key: t.Key,
		Tenant: t.Tenant, Resources: t.Resources, Tags: t.Tags, Labels: t.Labels,
	}
	if s.ContentType == "" && len(t.Payload) > 0 {
		s.ContentType = "application/octet-stream"
	}
	if t.Priority != "" {
		p, ok := priorities[strings.ToLower(t.Priority)]
		if !ok {
			return nil, fmt.Errorf("cronoq: Task.Priority: %q is not critical, high, normal or low", t.Priority)
		}
		s.Priority = p
	}
	if t.OnMiss != "" {
		m, ok := missPolicies[strings.ToLower(t.OnMiss)]
		if !ok {
			return nil, fmt.Errorf("cronoq: Task.OnMiss: %q is not run_late, skip or fail", t.OnMiss)
		}
		s.OnMiss = m
	}
	if t.DeadlineIn != 0 && !t.DeadlineAt.IsZero() {
		return nil, errors.New("cronoq: Task.DeadlineIn, DeadlineAt: give at most one")
	}
	if t.StartIn != 0 && !t.StartAt.IsZero() {
		return nil, errors.New("cronoq: Task.StartIn, StartAt: give at most one")
	}
	durations := []struct {
		name  string
		value time.Duration
		field **float64
	}{
		{"Timeout", t.Timeout, &s.TimeoutS}, {"DeadlineIn", t.DeadlineIn, &s.DeadlineInS},
		{"StartIn", t.StartIn, &s.StartInS}, {"Tolerance", t.Tolerance, &s.ToleranceS},
		{"DurationHint", t.DurationHint, &s.DurationHintS},
	}
	for _, d := range durations {
		if d.value < 0 {
			return nil, fmt.Errorf("cronoq: Task.%s: %v is negative", d.name, d.value)
		}
		if d.value > 0 {
			secs := d.value.Seconds()
			*d.field = &secs
		}
	}
	if !t.DeadlineAt.IsZero() {
		ns := t.DeadlineAt.UnixNano()
		s.DeadlineUnixNs = &ns
	}
	if !t.StartAt.IsZero() {
		ns := t.StartAt.UnixNano()
		s.StartUnixNs = &ns
	}
	if r := t.Retry; r != nil {
		if r.InitialBackoff < 0 || r.MaxBackoff < 0 || r.Multiplier < 0 || math.IsNaN(r.Multiplier) {
			return nil, errors.New("cronoq: Task.Retry: backoffs and multiplier must not be negative")
		}
		s.Retry = &pb.RetryPolicy{
			MaxAttempts: r.MaxAttempts, InitialBackoffS: r.InitialBackoff.Seconds(), Multiplier: r.Multiplier,
			MaxBackoffS: r.MaxBackoff.Seconds(), Jitter: !r.NoJitter,
		}
	}
	for i, ref := range t.After {
		if ref.id == 0 && ref.key == "" {
			return nil, fmt.Errorf("cronoq: Task.After[%d]: names no task", i)
		}
		s.Deps = append(s.Deps, &pb.Dep{Target: ref.wire(), Cond: pb.EdgeCond_EDGE_COND_ON_SUCCESS})
	}
	return s, nil
}

// Submitted is the answer to a submission. Duplicate means the key named a task that already exists:
// ID is that task's, and what was sent is ignored. Result is set by SubmitWait.
type Submitted struct {
	ID        uint64
	Duplicate bool
	Result    *Result
}

// Result is a task's outcome. Output is nil unless the task succeeded; OutputAvailable false for a task
// that succeeded means the server no longer holds the output.
type Result struct {
	ID              uint64
	Status          string // "succeeded", "failed", "dead_lettered", "cancelled", ...
	Output          []byte
	ContentType     string // of the output, when the server says
	Message         string
	OutputAvailable bool
}

// OK is true when the task succeeded.
func (r Result) OK() bool { return r.Status == "succeeded" }

// TaskInfo describes a task. Only ID and Status are guaranteed; a field the server does not know is
// zero.
type TaskInfo struct {
	ID              uint64
	Status          string
	Pool            string
	Key             string
	Kind            string
	Attempt         uint32
	MaxAttempts     uint32
	CreatedAt       time.Time
	StartedAt       time.Time
	FinishedAt      time.Time
	Message         string
	OutputAvailable bool
	Tenant          string
	Priority        string
}

// Done is true for a terminal status.
func (t TaskInfo) Done() bool { return terminal[t.Status] }

var terminal = map[string]bool{
	"succeeded": true, "failed": true, "dead_lettered": true, "cancelled": true, "skipped": true,
	"missed": true, "shed": true,
}

// Event is a status change seen by Watch.
type Event struct {
	ID      uint64
	Pool    string
	Key     string
	Status  string
	Attempt uint32
	At      time.Time
	Message string
}

func statusName(s pb.TaskStatus) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "TASK_STATUS_"))
}

func unixNanos(ns *int64) time.Time {
	if ns == nil {
		return time.Time{}
	}
	return time.Unix(0, *ns)
}

func (c *Client) ctx(ctx context.Context, pool string) context.Context {
	ctx = withToken(ctx, c.token)
	if pool != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, poolKey, pool)
	}
	return ctx
}

// Submit submits one task.
func (c *Client) Submit(ctx context.Context, t Task) (Submitted, error) {
	return c.submit(ctx, t, false, 0)
}

// SubmitWait submits one task and waits until it has finished, for up to timeout (0: as long as the
// server allows, limits.max_wait_s); Result is set. When the wait runs out the error wraps ErrTimeout
// and the task stays submitted.
func (c *Client) SubmitWait(ctx context.Context, t Task, timeout time.Duration) (Submitted, error) {
	return c.submit(ctx, t, true, timeout)
}

func (c *Client) submit(ctx context.Context, t Task, wait bool, timeout time.Duration) (Submitted, error) {
	spec, err := t.spec()
	if err != nil {
		return Submitted{}, err
	}
	req := &pb.SubmitRequest{Task: spec, Wait: wait}
	ctx, cancel := waitContext(ctx, req.Wait, timeout, &req.WaitTimeoutS)
	defer cancel()
	var trailer metadata.MD
	resp, err := c.tasks.Submit(c.ctx(ctx, ""), req, grpc.Trailer(&trailer))
	if err != nil {
		return Submitted{}, waitError(err, wait)
	}
	out := Submitted{ID: resp.Id, Duplicate: resp.Duplicate}
	if wait && resp.Result != nil {
		r := result(resp.Result, trailer)
		out.Result = &r
	}
	return out, nil
}

// waitContext bounds a waiting call by the wait plus waitMargin, and sets the request's timeout field.
func waitContext(ctx context.Context, wait bool, timeout time.Duration, field **float64) (context.Context, context.CancelFunc) {
	if !wait || timeout <= 0 {
		return ctx, func() {}
	}
	secs := timeout.Seconds()
	*field = &secs
	return context.WithTimeout(ctx, timeout+waitMargin)
}

// waitError: for a call that waits, DEADLINE_EXCEEDED (the server's wait limit, or the call's own
// deadline) means the wait ran out.
func waitError(err error, waits bool) error {
	if waits && status.Code(err) == codes.DeadlineExceeded {
		return fmt.Errorf("%w: %s", ErrTimeout, status.Convert(err).Message())
	}
	return err
}

func result(r *pb.TaskResult, trailer metadata.MD) Result {
	out := Result{
		ID: r.Id, Status: statusName(r.Status), Output: r.Output, Message: r.Message,
		OutputAvailable: r.OutputAvailable,
	}
	if values := trailer.Get(outputTypeKey); len(values) > 0 {
		out.ContentType = values[0]
	}
	return out
}

// SubmitBatch submits tasks atomically: the server accepts all or none. The answers are in input
// order; tasks may depend (After) on keys defined in the same batch.
func (c *Client) SubmitBatch(ctx context.Context, tasks []Task) ([]Submitted, error) {
	req := &pb.SubmitBatchRequest{}
	for i, t := range tasks {
		spec, err := t.spec()
		if err != nil {
			return nil, fmt.Errorf("tasks[%d]: %w", i, err)
		}
		req.Tasks = append(req.Tasks, spec)
	}
	resp, err := c.tasks.SubmitBatch(c.ctx(ctx, ""), req)
	if err != nil {
		return nil, err
	}
	out := make([]Submitted, len(resp.Tasks))
	for i, r := range resp.Tasks {
		out[i] = Submitted{ID: r.Id, Duplicate: r.Duplicate}
	}
	return out, nil
}

// Get describes the task ref names; NotFound if the server does not know (or no longer keeps) it.
func (c *Client) Get(ctx context.Context, ref Ref) (TaskInfo, error) {
	t, err := c.tasks.Get(c.ctx(ctx, ref.pool), &pb.GetRequest{Task: ref.wire()})
	if err != nil {
		return TaskInfo{}, err
	}
	return TaskInfo{
		ID: t.Id, Status: statusName(t.Status), Pool: t.Pool, Key: t.Key, Kind: t.Kind, Attempt: t.Attempt,
		MaxAttempts: t.MaxAttempts, CreatedAt: unixNanos(t.CreatedUnixNs), StartedAt: unixNanos(t.StartedUnixNs),
		FinishedAt: unixNanos(t.FinishedUnixNs), Message: t.Message, OutputAvailable: t.OutputAvailable,
		Tenant: t.Tenant, Priority: priorityName(t.Priority),
	}, nil
}

// Cancel cancels a live task; false when it had already finished.
func (c *Client) Cancel(ctx context.Context, ref Ref) (bool, error) {
	resp, err := c.tasks.Cancel(c.ctx(ctx, ref.pool), &pb.CancelRequest{Task: ref.wire()})
	if err != nil {
		return false, err
	}
	return resp.Cancelled, nil
}

// Wait waits until the task is terminal, for up to timeout (0: as long as the server allows). When the
// wait runs out the error wraps ErrTimeout; when leadership moves meanwhile it is Unavailable.
func (c *Client) Wait(ctx context.Context, ref Ref, timeout time.Duration) (Result, error) {
	req := &pb.WaitRequest{Task: ref.wire()}
	ctx, cancel := waitContext(ctx, true, timeout, &req.TimeoutS)
	defer cancel()
	var trailer metadata.MD
	r, err := c.tasks.Wait(c.ctx(ctx, ref.pool), req, grpc.Trailer(&trailer))
	if err != nil {
		return Result{}, waitError(err, true)
	}
	return result(r, trailer), nil
}

// WatchOptions select what Watch reports: the tasks of Pools, IDs and Keys (everything when all are
// empty), terminal statuses only unless AllTransitions.
type WatchOptions struct {
	Pools          []string
	IDs            []uint64
	Keys           []string
	AllTransitions bool
}

// Events is an open Watch: Next returns the status changes in order.
type Events struct {
	stream pb.Tasks_WatchClient
	cancel context.CancelFunc
}

// Watch opens a stream of status changes; Close it when done (ending ctx closes it too). The stream ends
// with Unavailable when the server shuts down or leadership moves (open a new one), and with DataLoss
// when this consumer falls too far behind.
func (c *Client) Watch(ctx context.Context, opts WatchOptions) (*Events, error) {
	ctx, cancel := context.WithCancel(c.ctx(ctx, ""))
	stream, err := c.tasks.Watch(ctx, &pb.WatchRequest{
		Pools: opts.Pools, Ids: opts.IDs, Keys: opts.Keys, AllTransitions: opts.AllTransitions,
	})
	if err != nil {
		cancel()
		return nil, err
	}
	return &Events{stream: stream, cancel: cancel}, nil
}

// Next waits for the next event; io.EOF when the server ended the stream cleanly.
func (e *Events) Next() (Event, error) {
	m, err := e.stream.Recv()
	if err != nil {
		if err == io.EOF {
			return Event{}, io.EOF
		}
		return Event{}, err
	}
	return Event{
		ID: m.Id, Pool: m.Pool, Key: m.Key, Status: statusName(m.Status), Attempt: m.Attempt,
		At: time.Unix(0, m.AtUnixNs), Message: m.Message,
	}, nil
}

// UnavailableShards names the shards whose events this stream does not carry because they could not be
// reached when it opened (through a router or a server of a sharded cluster); empty when every shard
// answered. It waits for the server to accept the call.
func (e *Events) UnavailableShards() ([]string, error) {
	md, err := e.stream.Header()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, value := range md.Get("cronoq-unavailable-shards") {
		for _, name := range strings.Split(value, ",") {
			if name != "" {
				names = append(names, name)
			}
		}
	}
	return names, nil
}

// Close cancels the call.
func (e *Events) Close() { e.cancel() }
