// Command testworker is a Go worker for cronoq's integration tests and benchmark: RunWorker with the
// options given as flags, stopped (drained) by SIGTERM, printing one JSON line on stdout for each thing
// it did, so that a test can wait for them. Each task's payload says what the handler does:
//
//	{"do": "complete", "output": "..."}         returns output (default "attempt <n>")
//	{"do": "retry", "after": 0.5}                cronoq.Retryable(err, after seconds)
//	{"do": "permanent"} {"do": "error"}         cronoq.Permanent(err); a plain error
//	{"do": "reject"} {"do": "cancel"}           cronoq.Reject; cronoq.CancelTask
//	{"do": "panic"}                              panics
//	{"do": "sleep", "seconds": 30}               waits that long, or until its context ends
//	{"do": "sleep", "seconds": 30, "first": 1}   the same on attempt 1 only; later ones complete
//
// With -reject every handler rejects its lease; with -noop every handler returns at once without reading
// its payload. -noop -expect N is the benchmark's worker (bench/sdk_workers.py): after N tasks it drains,
// exits, and prints the CPU it spent from its registration to its last task, as bench/worker.py does.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	cronoq "github.com/cronoq/cronoq/sdk/go"
	"google.golang.org/grpc/status"
)

type instruction struct {
	Do      string  `json:"do"`
	Output  string  `json:"output"`
	After   float64 `json:"after"`
	Seconds float64 `json:"seconds"`
	First   uint32  `json:"first"`
}

var (
	outMu sync.Mutex
	out   = json.NewEncoder(os.Stdout)
)

func emit(fields map[string]any) {
	outMu.Lock()
	defer outMu.Unlock()
	_ = out.Encode(fields)
}

func main() {
	var opts cronoq.WorkerOptions
	var ca, cert, key, labels string
	var noop, reject bool
	var expect int64
	flag.StringVar(&opts.Target, "target", "", "server address")
	flag.StringVar(&opts.Pool, "pool", "default", "pool")
	flag.IntVar(&opts.Slots, "slots", 1, "slots")
	flag.StringVar(&opts.Name, "name", "", "worker name")
	flag.DurationVar(&opts.DrainTimeout, "drain", 0, "drain timeout (0: the default)")
	flag.BoolVar(&opts.InsecureRedirectHTTP, "insecure-redirect-http", false, "InsecureRedirectHTTP")
	flag.BoolVar(&opts.DisableBatches, "no-batches", false, "DisableBatches")
	flag.StringVar(&ca, "ca", "", "PEM file of the CA: TLS")
	flag.StringVar(&cert, "cert", "", "PEM client certificate: mTLS (with -key)")
	flag.StringVar(&key, "key", "", "PEM client key")
	flag.StringVar(&labels, "labels", "", "k=v,k=v")
	flag.BoolVar(&noop, "noop", false, "return at once (benchmark)")
	flag.BoolVar(&reject, "reject", false, "reject every lease")
	flag.Int64Var(&expect, "expect", 0, "with -noop: stop after this many tasks (benchmark)")
	flag.Parse()
	opts.Token = os.Getenv("CRONOQ_TOKEN") // not a flag: it would show in ps
	opts.InitialBackoff = 50 * time.Millisecond
	opts.MaxBackoff = time.Second
	opts.ErrorLog = log.New(os.Stderr, "", log.LstdFlags)
	if labels != "" {
		opts.Labels = map[string]string{}
		for _, pair := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(pair, "=")
			opts.Labels[k] = v
		}
	}
	if ca != "" {
		opts.TLS = tlsConfig(ca, cert, key)
	}
	opts.OnRegistered = func(r cronoq.Registration) {
		emit(map[string]any{
			"event": "registered", "worker_id": r.WorkerID, "slots": r.Slots, "batched": r.Batched,
			"address": r.Address, "lease_ttl": r.LeaseTTL.Seconds(),
		})
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	handler := handle
	var handled atomic.Int64
	var registeredCPU, lastCPU time.Duration
	if noop {
		registered := opts.OnRegistered
		opts.OnRegistered = func(r cronoq.Registration) {
			if registeredCPU == 0 {
				registeredCPU = cpuTime()
			}
			registered(r)
		}
		handler = func(context.Context, *cronoq.Lease) ([]byte, error) {
			if handled.Add(1) == expect {
				lastCPU = cpuTime()
				stop()
			}
			return nil, nil
		}
	}
	if reject {
		handler = func(_ context.Context, l *cronoq.Lease) ([]byte, error) {
			emit(map[string]any{"event": "reject", "task": l.TaskID, "attempt": l.Attempt})
			return nil, cronoq.Reject("not for me")
		}
	}
	err := cronoq.RunWorker(ctx, opts, handler)
	if err != nil {
		emit(map[string]any{"event": "exit", "error": err.Error(), "code": status.Code(err).String()})
		os.Exit(1)
	}
	if expect > 0 {
		emit(map[string]any{"handled": handled.Load(), "latencies": []float64{}, "cpu_s": (lastCPU - registeredCPU).Seconds()})
		return
	}
	emit(map[string]any{"event": "exit"})
}

// cpuTime is the CPU this process has spent so far, in user and system mode.
func cpuTime() time.Duration {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		log.Fatal(err)
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}

func tlsConfig(ca, cert, key string) *tls.Config {
	pem, err := os.ReadFile(ca)
	if err != nil {
		log.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	cfg := &tls.Config{RootCAs: roots}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			log.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

func handle(ctx context.Context, l *cronoq.Lease) ([]byte, error) {
	var in instruction
	if err := l.JSON(&in); err != nil {
		return nil, cronoq.Permanent(err)
	}
	emit(map[string]any{
		"event": "start", "task": l.TaskID, "attempt": l.Attempt, "lease": l.ID, "do": in.Do,
		"timeout": l.Timeout.Seconds(), "lease_ttl": l.LeaseTTL.Seconds(), "pool": l.Pool, "kind": l.Kind,
		"key": l.Key, "priority": l.Priority, "tags": l.Tags,
	})
	if in.First != 0 && l.Attempt > in.First {
		in.Do = "complete"
	}
	switch in.Do {
	case "", "complete":
		output := in.Output
		if output == "" {
			output = fmt.Sprintf("attempt %d", l.Attempt)
		}
		l.OutputContentType = "text/plain"
		return []byte(output), nil
	case "retry":
		return nil, cronoq.Retryable(fmt.Errorf("flaky %d", l.Attempt), time.Duration(in.After*float64(time.Second)))
	case "permanent":
		return nil, cronoq.Permanent(errors.New("bad input"))
	case "error":
		return nil, fmt.Errorf("boom %d", l.Attempt)
	case "reject":
		return nil, cronoq.Reject("not for me")
	case "cancel":
		return nil, cronoq.CancelTask
	case "panic":
		panic(fmt.Sprintf("kaboom %d", l.Attempt))
	case "sleep":
		timer := time.NewTimer(time.Duration(in.Seconds * float64(time.Second)))
		defer timer.Stop()
		select {
		case <-timer.C:
			emit(map[string]any{"event": "slept", "task": l.TaskID, "attempt": l.Attempt})
			return []byte(fmt.Sprintf("slept on attempt %d", l.Attempt)), nil
		case <-ctx.Done():
			emit(map[string]any{"event": "ctx_done", "task": l.TaskID, "attempt": l.Attempt, "err": ctx.Err().Error(), "reason": l.AbortReason()})
			return nil, ctx.Err()
		}
	}
	return nil, cronoq.Permanent(fmt.Errorf("unknown instruction %q", in.Do))
}
