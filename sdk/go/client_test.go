package cronoq

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// serverTarget is the address of a real cronoq server started for these tests with the integration
// tests' default configuration (pools "default" and "other"), which tests/integration/test_go_sdk.py
// passes in CRONOQ_TEST_TARGET.
func serverTarget(t *testing.T) string {
	target := os.Getenv("CRONOQ_TEST_TARGET")
	if target == "" {
		t.Skip("CRONOQ_TEST_TARGET names no server (tests/integration/test_go_sdk.py starts one)")
	}
	return target
}

// must is the value of a call that must not fail; a failure panics, which fails the test with its stack
// (Go 1.19 cannot pass a call's two results to a function that also takes the *testing.T).
func must[T any](value T, err error) T {
	if err != nil {
		panic(err)
	}
	return value
}

// The producer Client's calls against a real server, with a worker of this SDK in this process serving
// the pool "other": it echoes the payload, or waits for its context to end when the payload is "block".
func TestClientAgainstServer(t *testing.T) {
	target := serverTarget(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	registered := make(chan Registration, 1)
	workerCtx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan error, 1)
	go func() {
		workerDone <- RunWorker(workerCtx, WorkerOptions{Target: target, Pool: "other", Slots: 4, OnRegistered: func(r Registration) { registered <- r }},
			func(ctx context.Context, l *Lease) ([]byte, error) {
				if l.Text() == "block" {
					<-ctx.Done()
					return nil, ctx.Err()
				}
				l.OutputContentType = "text/plain"
				return []byte("echo: " + l.Text()), nil
			})
	}()
	select {
	case <-registered:
	case <-time.After(bound):
		t.Fatal("the worker did not register")
	}
	c := must(NewClient(target, ClientOptions{}))
	defer c.Close()

	// Submit and wait; a duplicate key; Get by key within the pool.
	done := must(c.SubmitWait(ctx, Task{Payload: []byte("hi"), Pool: "other", Key: "go-1", Priority: "High"}, 10*time.Second))
	if r := done.Result; r == nil || !r.OK() || string(r.Output) != "echo: hi" || r.ContentType != "text/plain" {
		t.Fatalf("SubmitWait: %+v", r)
	}
	dup := must(c.Submit(ctx, Task{Payload: []byte("ignored"), Pool: "other", Key: "go-1"}))
	if !dup.Duplicate || dup.ID != done.ID {
		t.Fatalf("a duplicate key: %+v, want task %d", dup, done.ID)
	}
	info := must(c.Get(ctx, Key("go-1").InPool("other")))
	if info.ID != done.ID || info.Status != "succeeded" || !info.Done() || info.Attempt != 1 || info.Priority != "high" || info.Pool != "other" || info.FinishedAt.IsZero() {
		t.Fatalf("Get: %+v", info)
	}
	if _, err := c.Get(ctx, Key("go-1").InPool("default")); status.Code(err) != codes.NotFound {
		t.Fatalf("Get in another pool: %v, want NotFound", err)
	}

	// Watch every transition of the batch's tasks; the batch is atomic and the second waits for the first.
	events := must(c.Watch(ctx, WatchOptions{Keys: []string{"extract", "load"}, AllTransitions: true}))
	defer events.Close()
	if shards := must(events.UnavailableShards()); len(shards) != 0 {
		t.Fatalf("a single server named unavailable shards %v", shards)
	}
	batch := must(c.SubmitBatch(ctx, []Task{
		{Payload: []byte("1"), Pool: "other", Key: "extract"},
		{Payload: []byte("2"), Pool: "other", Key: "load", After: []Ref{Key("extract")}},
	}))
	for i, want := range []string{"echo: 1", "echo: 2"} {
		r := must(c.Wait(ctx, ID(batch[i].ID), 10*time.Second))
		if !r.OK() || string(r.Output) != want {
			t.Fatalf("batch task %d: %+v", i, r)
		}
	}
	order := map[uint64][]string{}
	for len(order[batch[1].ID]) == 0 || order[batch[1].ID][len(order[batch[1].ID])-1] != "succeeded" {
		e := must(events.Next())
		order[e.ID] = append(order[e.ID], e.Status)
	}
	if first, second := strings.Join(order[batch[0].ID], ","), strings.Join(order[batch[1].ID], ","); !strings.HasSuffix(first, "running,succeeded") || !strings.HasPrefix(second, "blocked") {
		t.Fatalf("watched %q and %q", first, second)
	}

	// Cancel a running task; a second cancel finds it finished.
	blocked := must(c.Submit(ctx, Task{Payload: []byte("block"), Pool: "other"}))
	for deadline := time.Now().Add(bound); must(c.Get(ctx, ID(blocked.ID))).Status != "running"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the task never ran")
		}
	}
	if !must(c.Cancel(ctx, ID(blocked.ID))) {
		t.Fatal("Cancel of a running task returned false")
	}
	if r := must(c.Wait(ctx, ID(blocked.ID), 10*time.Second)); r.Status != "cancelled" || r.Output != nil {
		t.Fatalf("a cancelled task: %+v", r)
	}
	if must(c.Cancel(ctx, ID(blocked.ID))) {
		t.Fatal("Cancel of a finished task returned true")
	}

	// A wait that runs out (no worker serves "default" here); bad options name the field.
	idle := must(c.Submit(ctx, Task{Pool: "default"}))
	if _, err := c.Wait(ctx, ID(idle.ID), 200*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a wait that ran out: %v, want ErrTimeout", err)
	}
	if _, err := c.Submit(ctx, Task{Priority: "urgent"}); err == nil || !strings.Contains(err.Error(), "Task.Priority") {
		t.Fatalf("a bad priority: %v", err)
	}
	if _, err := c.Get(ctx, ID(1<<40)); status.Code(err) != codes.NotFound {
		t.Fatalf("an unknown task: %v, want NotFound", err)
	}

	stopWorker()
	if err := <-workerDone; err != nil {
		t.Fatalf("RunWorker after its context ended: %v", err)
	}
}

// A task's options are checked before anything is sent, and the error names the field.
func TestTaskSpec(t *testing.T) {
	bad := map[string]Task{
		"Task.Priority: \"urgent\"":                 {Priority: "urgent"},
		"Task.OnMiss: \"later\"":                    {OnMiss: "later"},
		"Task.DeadlineIn, DeadlineAt: give at most": {DeadlineIn: time.Second, DeadlineAt: time.Now()},
		"Task.StartIn, StartAt: give at most":       {StartIn: time.Second, StartAt: time.Now()},
		"Task.Timeout: -1s is negative":             {Timeout: -time.Second},
		"Task.Retry: backoffs and multiplier":       {Retry: &RetryPolicy{InitialBackoff: -time.Second}},
		"Task.After[1]: names no task":              {After: []Ref{ID(1), {}}},
	}
	for want, task := range bad {
		if _, err := task.spec(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: error %v, want one saying %q", task, err, want)
		}
	}
	at := time.Unix(100, 5)
	s, err := Task{
		Payload: []byte("x"), Priority: "LOW", Timeout: 1500 * time.Millisecond, StartAt: at, OnMiss: "skip",
		Retry: &RetryPolicy{MaxAttempts: 5, NoJitter: true}, After: []Ref{Key("extract")},
	}.spec()
	if err != nil {
		t.Fatal(err)
	}
	if s.ContentType != "application/octet-stream" || s.Priority.String() != "PRIORITY_LOW" || s.GetTimeoutS() != 1.5 ||
		s.GetStartUnixNs() != at.UnixNano() || s.OnMiss.String() != "MISS_POLICY_SKIP" || s.Retry.MaxAttempts != 5 ||
		s.Retry.Jitter || s.Deps[0].Target.GetKey() != "extract" || s.DeadlineInS != nil {
		t.Errorf("spec %v", s)
	}
}
