package cronoq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	pb "github.com/cronoq/cronoq/sdk/go/cronoqv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const bound = 10 * time.Second // no condition these tests wait for takes this long

// scripted is a server of the worker protocol whose Workers.Work answers are the test's: each stream
// is handed to the test as a call, which the test ends with a status by refuse. BatchedWorkers.Work is
// unimplemented, as on a server without the extension.
type scripted struct {
	pb.UnimplementedWorkersServer
	calls        chan *call
	batchedCalls atomic.Int32
	address      string
}

type call struct {
	pb.Workers_WorkServer
	end chan error
}

func (s *scripted) Work(stream pb.Workers_WorkServer) error {
	c := &call{stream, make(chan error, 1)}
	s.calls <- c
	select {
	case err := <-c.end:
		return err
	case <-stream.Context().Done():
		return nil
	}
}

// refuse ends a call with err, as a server refusing the stream does.
func refuse(c *call, err error) { c.end <- err }

func serveScripted(t *testing.T) *scripted {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scripted{calls: make(chan *call, 4), address: listener.Addr().String()}
	server := grpc.NewServer(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if info.FullMethod == "/cronoq.v1.BatchedWorkers/Work" {
			s.batchedCalls.Add(1)
		}
		return handler(srv, ss)
	}))
	pb.RegisterWorkersServer(server, s)
	pb.RegisterBatchedWorkersServer(server, &pb.UnimplementedBatchedWorkersServer{})
	go server.Serve(listener)
	t.Cleanup(server.Stop)
	return s
}

func (s *scripted) next(t *testing.T) *call {
	t.Helper()
	select {
	case c := <-s.calls:
		return c
	case <-time.After(bound):
		t.Fatal("the worker opened no stream")
		return nil
	}
}

func recv(t *testing.T, stream *call) *pb.WorkerMessage {
	t.Helper()
	got := make(chan *pb.WorkerMessage, 1)
	go func() {
		m, err := stream.Recv()
		if err != nil {
			close(got)
			return
		}
		got <- m
	}()
	select {
	case m, ok := <-got:
		if !ok {
			t.Fatal("the stream ended")
		}
		return m
	case <-time.After(bound):
		t.Fatal("the worker sent nothing")
		return nil
	}
}

func register(t *testing.T, stream *call, slots uint32) {
	t.Helper()
	if m := recv(t, stream); m.GetRegister() == nil {
		t.Fatalf("first message %v, want register", m)
	}
	send(t, stream, &pb.ServerMessage{Msg: &pb.ServerMessage_Registered{Registered: &pb.Registered{
		WorkerId: 1, Slots: slots, ProtocolVersion: 3, MaxMessageBytes: 1 << 20,
	}}})
}

func send(t *testing.T, stream *call, m *pb.ServerMessage) {
	t.Helper()
	if err := stream.Send(m); err != nil {
		t.Fatal(err)
	}
}

func lease(id uint64) *pb.ServerMessage {
	return &pb.ServerMessage{Msg: &pb.ServerMessage_Lease{Lease: &pb.Lease{Lease: id, TaskId: id, Attempt: 1}}}
}

// A server without the batched extension: the worker asks for it once per connection and uses
// Workers.Work at once. It hands back a lease beyond its granted slots, and reconnects at once, without
// its (here hour-long) backoff, when the server says leadership moved.
func TestFallbackSlotsAndNotLeader(t *testing.T) {
	s := serveScripted(t)
	release := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- RunWorker(ctx, WorkerOptions{Target: s.address, Pool: "p", Slots: 4, InitialBackoff: time.Hour, MaxBackoff: time.Hour},
			func(ctx context.Context, l *Lease) ([]byte, error) {
				<-release
				return []byte("done"), nil
			})
	}()
	stream := s.next(t)
	register(t, stream, 1) // 1 of the 4 slots asked for
	send(t, stream, lease(1))
	send(t, stream, lease(2))
	nack := recv(t, stream).GetNack()
	if nack == nil || nack.Lease != 2 || nack.Reason != "all 1 slots of the worker are busy" {
		t.Fatalf("got %v, want the nack of lease 2", nack)
	}
	close(release)
	if done := recv(t, stream).GetComplete(); done == nil || done.Lease != 1 || string(done.Output) != "done" || done.ContentType != "application/octet-stream" {
		t.Fatalf("got %v, want lease 1 completed", done)
	}
	send(t, stream, &pb.ServerMessage{Msg: &pb.ServerMessage_Shutdown{Shutdown: &pb.Shutdown{Reason: "moved", NotLeader: true}}})
	again := s.next(t)
	register(t, again, 1)
	if calls := s.batchedCalls.Load(); calls != 2 {
		t.Fatalf("BatchedWorkers.Work asked %d times, want once per connection (2)", calls)
	}
	cancel() // the drain: SetSlots(0), then the half-close, and the server ends the stream
	if m := recv(t, again).GetSetSlots(); m == nil || m.Slots != 0 {
		t.Fatalf("got %v, want SetSlots(0)", m)
	}
	refuse(again, nil)
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
}

// A redirect in the trailing metadata of FAILED_PRECONDITION is followed; a fatal status ends RunWorker
// with it.
func TestRedirectThenFatal(t *testing.T) {
	home, shard := serveScripted(t), serveScripted(t)
	ran := make(chan error, 1)
	go func() {
		ran <- RunWorker(context.Background(), WorkerOptions{Target: home.address, Pool: "p", Token: "secret"},
			func(context.Context, *Lease) ([]byte, error) { return nil, nil })
	}()
	stream := home.next(t)
	recv(t, stream)
	url := "http://" + shard.address
	stream.SetTrailer(metadata.Pairs(shardEndpointKey, url, shardEndpointsKey, url))
	refuse(stream, status.Error(codes.FailedPrecondition, "pool p is served by shard b"))
	moved := shard.next(t)
	if m := recv(t, moved); m.GetRegister().GetPool() != "p" {
		t.Fatalf("got %v on the shard, want the registration", m)
	}
	if md, _ := metadata.FromIncomingContext(moved.Context()); strings.Join(md.Get("authorization"), "") != "Bearer secret" {
		t.Fatalf("the token did not reach the shard: %v", md)
	}
	refuse(moved, status.Error(codes.NotFound, "no pool p"))
	select {
	case err := <-ran:
		if status.Code(err) != codes.NotFound {
			t.Fatalf("RunWorker returned %v, want NotFound", err)
		}
	case <-time.After(bound):
		t.Fatal("RunWorker did not return")
	}
}

func TestOutcomes(t *testing.T) {
	s := &session{w: &worker{}, maxMessageBytes: 1 << 20, serverProtocol: 3}
	l := &Lease{ID: 7}
	if m := s.outcome(l, nil, fmt.Errorf("wrapped: %w", Permanent(errors.New("bad")))).GetFail(); !m.Permanent || m.Message != "bad" {
		t.Errorf("a wrapped Permanent: %v", m)
	}
	if m := s.outcome(l, nil, Retryable(errors.New("later"), 1500*time.Millisecond)).GetFail(); m.Permanent || m.GetRetryAfterS() != 1.5 || m.Message != "later" {
		t.Errorf("Retryable: %v", m)
	}
	if m := s.outcome(l, nil, Reject("busy")).GetNack(); m.GetReason() != "busy" {
		t.Errorf("Reject: %v", m)
	}
	if m := s.outcome(l, nil, fmt.Errorf("giving up: %w", CancelTask)).GetCancelled(); m.GetLease() != 7 {
		t.Errorf("CancelTask: %v", m)
	}
	if m := s.outcome(l, nil, errors.New("boom")).GetFail(); m.Permanent || m.RetryAfterS != nil || m.Message != "boom" {
		t.Errorf("another error: %v", m)
	}
	if m := s.outcome(l, make([]byte, 1<<20), nil).GetFail(); !m.Permanent || !strings.HasPrefix(m.Message, "the handler's output is 1048576 bytes") {
		t.Errorf("an output over the limit: %v", m)
	}
	if m := s.outcome(l, nil, nil).GetComplete(); m.ContentType != "" || len(m.Output) != 0 {
		t.Errorf("no output: %v", m)
	}
	// Servers before protocol 2 have no nack: a retryable failure is the closest.
	s.serverProtocol = 1
	if m := s.outcome(l, nil, Reject("busy")).GetFail(); m == nil || m.Permanent {
		t.Errorf("Reject on protocol 1: %v", m)
	}
}

// A report's text is cut to what a server keeps (8,192 characters) and to what fits its message limit,
// saying how long it was, and is always valid UTF-8.
func TestWireText(t *testing.T) {
	s := &session{maxMessageBytes: 1 << 20}
	long := s.wireText(strings.Repeat("x", 10000))
	if utf8.RuneCountInString(long) != maxReportChars || !strings.HasSuffix(long, "... (cut: 10,000 characters)") {
		t.Errorf("cut to %d characters: ...%s", utf8.RuneCountInString(long), long[len(long)-40:])
	}
	s.maxMessageBytes = 4096
	wide := s.wireText(strings.Repeat("é", 8000))
	if len(wide) > 4096-outputHeadroom || !strings.HasSuffix(wide, "... (cut: 8,000 characters)") || !utf8.ValidString(wide) {
		t.Errorf("cut to %d bytes: %q", len(wide), wide[len(wide)-40:])
	}
	if got := s.wireText("bad \xff byte"); got != "bad \uFFFD byte" {
		t.Errorf("invalid UTF-8 sent as %q", got)
	}
}

type frames struct {
	pb.BatchedWorkers_WorkClient
	sent []*pb.WorkerBatch
}

func (f *frames) Send(b *pb.WorkerBatch) error {
	f.sent = append(f.sent, proto.Clone(b).(*pb.WorkerBatch))
	return nil
}

// What is queued goes out in as few frames as fit the server's limit, each message counting its tag and
// length, in order.
func TestBatchedFramesStayWithinTheLimit(t *testing.T) {
	var msgs []*pb.WorkerMessage
	for i := 0; i < 50; i++ {
		msgs = append(msgs, &pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{Lease: uint64(i + 1), Output: make([]byte, 100)}}})
	}
	f := &frames{}
	if err := (batchedWire{f}).send(msgs, 1024); err != nil {
		t.Fatal(err)
	}
	var next uint64 = 1
	for _, frame := range f.sent {
		if size := proto.Size(frame); size > 1024 {
			t.Errorf("a frame of %d bytes", size)
		}
		for _, m := range frame.Messages {
			if m.GetComplete().Lease != next {
				t.Fatalf("lease %d out of order", m.GetComplete().Lease)
			}
			next++
		}
	}
	if next != 51 || len(f.sent) != 6 { // 9 messages of 113 bytes (107 + 6) to a 1,024-byte frame
		t.Errorf("%d messages in %d frames", next-1, len(f.sent))
	}
}
