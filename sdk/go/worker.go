package cronoq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	pb "github.com/cronoq/cronoq/sdk/go/cronoqv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Handler runs one attempt. Its context ends when the server aborts the attempt (timeout, cancellation,
// lease expiry), when a drain runs out of time, or when the worker's stream ends (the server then retries
// the lease elsewhere). It carries the values of RunWorker's context, not its cancellation: a running
// handler may finish during a drain.
//
// A nil error completes the task with the returned output. Retryable, Permanent, Reject and CancelTask
// (also wrapped, as errors.As and errors.Is find them) mean what they say; any other error, and a panic,
// fail the attempt as retryable.
type Handler func(ctx context.Context, l *Lease) ([]byte, error)

// WorkerOptions configure RunWorker. Target and Pool are required.
type WorkerOptions struct {
	// Target is host:port or an http://, https:// or grpc:// URL; https:// means TLS.
	Target string
	// Pool is the pool the worker serves.
	Pool string
	// Slots is how many handlers run at once at most (default 1); the server may grant fewer.
	Slots int
	// Token is sent as "authorization: Bearer <token>" (a worker-role token).
	Token string
	// Name is shown in the server's worker list.
	Name string
	// Labels register the worker for tasks submitted with labels it has.
	Labels map[string]string
	// TLS turns TLS on (with a host:port target too) with these settings: RootCAs for a private CA,
	// Certificates for mTLS. nil with an https:// target uses the system roots. TLS with an http://
	// target is an error, rather than a plaintext connection.
	TLS *tls.Config
	// DrainTimeout is how long running handlers may finish once ctx ends (default 30 s; negative: none).
	DrainTimeout time.Duration
	// InsecureRedirectHTTP lets shard redirects send the token over plain http:// to another host. Use
	// it only on trusted networks.
	InsecureRedirectHTTP bool
	// DisableBatches always uses Workers.Work, never the BatchedWorkers extension.
	DisableBatches bool
	// InitialBackoff and MaxBackoff bound the delay between reconnects (default 200 ms, doubling up to
	// 10 s).
	InitialBackoff, MaxBackoff time.Duration
	// OnRegistered, if set, is called after each registration (a reconnect registers again).
	OnRegistered func(Registration)
	// ErrorLog receives what the worker cannot report to the server (a handler's panic with its stack)
	// and why it reconnects. nil: the log package's standard logger.
	ErrorLog *log.Logger
	// DialOptions are added to the SDK's own when the worker connects.
	DialOptions []grpc.DialOption
}

// Registration describes the worker's registration with a server.
type Registration struct {
	WorkerID        uint64
	Slots           int           // granted: at most WorkerOptions.Slots
	LeaseTTL        time.Duration // 0 when the pool has none
	ServerProtocol  uint32
	MaxMessageBytes int
	Batched         bool   // the stream is BatchedWorkers.Work
	Address         string // the server's address (another shard's after a redirect)
}

const (
	defaultDrain           = 30 * time.Second
	defaultInitialBackoff  = 200 * time.Millisecond
	defaultMaxBackoff      = 10 * time.Second
	defaultMaxMessageBytes = 4 * 1024 * 1024 // gRPC's default, for servers that do not say
	outputHeadroom         = 1024            // room for the Complete message around the output bytes
	framingBytes           = 6               // what a message adds to a batch: its tag and its length
	maxReportChars         = 8192            // the longest message or reason a server keeps
	minHeartbeat           = 10 * time.Millisecond
	closeWait              = 5 * time.Second // how long a drain waits for the server to end the stream
	leaderHunt             = 15 * time.Second
	leaderHuntDelay        = 100 * time.Millisecond
)

// fatal are the statuses retrying cannot fix: RunWorker returns them instead of reconnecting.
var fatal = map[codes.Code]bool{
	codes.Unauthenticated:    true,
	codes.PermissionDenied:   true,
	codes.NotFound:           true,
	codes.FailedPrecondition: true,
	codes.InvalidArgument:    true,
	codes.Unimplemented:      true,
}

// RunWorker serves opts.Pool with handler until ctx ends, then drains: it stops taking leases
// (SetSlots 0), lets running handlers finish for up to DrainTimeout, fails the rest as retryable, and
// returns nil once the server has closed the stream. It reconnects with backoff when the stream drops
// (at once when leadership moved) and follows the pool to the shard that serves it. It returns a gRPC
// status error for what retrying cannot fix: a refused token, an unknown pool, a refused redirect.
func RunWorker(ctx context.Context, opts WorkerOptions, handler Handler) error {
	w, err := newWorker(opts, handler)
	if err != nil {
		return err
	}
	return w.run(ctx)
}

type worker struct {
	opts      WorkerOptions
	handler   Handler
	home      endpoint
	redirects redirects
	logf      func(format string, args ...any)
	// Endpoints that answered BatchedWorkers.Work with UNIMPLEMENTED, until a stream with them ends: a
	// server upgraded meanwhile gets the extension asked for again.
	unbatched map[endpoint]bool
}

func newWorker(opts WorkerOptions, handler Handler) (*worker, error) {
	if handler == nil {
		return nil, errors.New("cronoq: RunWorker: the handler is nil")
	}
	if opts.Pool == "" {
		return nil, errors.New("cronoq: WorkerOptions.Pool: empty")
	}
	if opts.Slots == 0 {
		opts.Slots = 1
	}
	if opts.Slots < 0 || opts.Slots > 1<<20 {
		return nil, fmt.Errorf("cronoq: WorkerOptions.Slots: %d is not between 1 and 1048576", opts.Slots)
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = defaultDrain
	} else if opts.DrainTimeout < 0 {
		opts.DrainTimeout = 0
	}
	if opts.InitialBackoff == 0 {
		opts.InitialBackoff = defaultInitialBackoff
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = defaultMaxBackoff
	}
	if opts.InitialBackoff < 0 || opts.MaxBackoff < opts.InitialBackoff {
		return nil, fmt.Errorf("cronoq: WorkerOptions.InitialBackoff, MaxBackoff: need 0 < initial <= maximum (got %v, %v)", opts.InitialBackoff, opts.MaxBackoff)
	}
	home, err := parseTarget(opts.Target, opts.TLS != nil)
	if err != nil {
		return nil, err
	}
	logger := opts.ErrorLog
	if logger == nil {
		logger = log.Default()
	}
	return &worker{
		opts:      opts,
		handler:   handler,
		home:      home,
		redirects: redirects{home: home, sendsToken: opts.Token != "", allowHTTP: opts.InsecureRedirectHTTP},
		logf:      logger.Printf,
		unbatched: map[endpoint]bool{},
	}, nil
}

func (w *worker) run(ctx context.Context) error {
	ep := w.home
	delay := w.opts.InitialBackoff
	redirectsInRow := 0
	var huntUntil time.Time
	var conn *grpc.ClientConn // kept from a stream refused for want of batches
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for ctx.Err() == nil {
		batched := !w.opts.DisableBatches && !w.unbatched[ep]
		if conn == nil {
			var err error
			if conn, err = dial(ep, w.opts.TLS, ep == w.home, w.opts.DialOptions); err != nil {
				return err
			}
		}
		s := newSession(w, ep, batched)
		began := time.Now()
		stopped := s.serve(ctx, conn)
		if stopped {
			return nil
		}
		if s.refusedBatches() { // a server without the extension: Workers.Work at once, same connection
			w.unbatched[ep] = true
			continue
		}
		conn.Close()
		conn = nil
		if !batched && s.registered {
			delete(w.unbatched, ep)
		}
		if time.Since(began) > 10*w.opts.MaxBackoff {
			delay = w.opts.InitialBackoff
		}
		code := status.Code(s.err)
		if s.err != nil && s.redirect != nil {
			redirectsInRow++
			if redirectsInRow > MaxRedirects {
				return status.Errorf(codes.FailedPrecondition, "gave up after %d shard redirects in a row (the last pointed to %q)", MaxRedirects, s.redirect.url)
			}
			next, err := w.redirects.follow(ep, s.redirect)
			if err != nil {
				return err
			}
			ep = next
			continue
		}
		redirectsInRow = 0
		if s.err != nil && fatal[code] {
			return s.err
		}
		if s.err != nil {
			w.logf("cronoq: worker stream to %s ended: %v; reconnecting", ep.address, s.err)
		}
		if code == codes.Unavailable {
			ep = w.home // a redirected-to shard is down: ask the configured target again
		}
		if s.shutdown != nil && s.shutdown.NotLeader {
			huntUntil = time.Now().Add(leaderHunt)
			continue // leadership moved: the new leader is ready now, or in a moment
		}
		pause := delay
		if code == codes.Unavailable && time.Now().Before(huntUntil) {
			pause = leaderHuntDelay // a standby, or the new leader still recovering
		} else {
			delay *= 2
			if delay > w.opts.MaxBackoff {
				delay = w.opts.MaxBackoff
			}
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
	}
	return nil
}

// session is one Work stream. It owns the leases that arrived on it: a lease means nothing on any
// other stream, since when a stream ends the server retries its leases elsewhere, so their handlers'
// contexts end rather than being reported. After serve returns, err, redirect and shutdown say why the
// stream ended.
type session struct {
	w       *worker
	ep      endpoint
	batched bool
	wire    wire
	values  context.Context // the parent of the handlers' contexts: RunWorker's values, never done

	mu              sync.Mutex
	attempts        map[uint64]*attempt
	stopping        bool
	registered      bool
	granted         int
	serverProtocol  uint32
	leaseTTL        time.Duration
	maxMessageBytes int

	outbox    []*pb.WorkerMessage // not yet handed to gRPC
	frame     uint64              // counts the times the writer took the outbox
	fresh     int                 // handlers started since then that are still running
	halfClose bool                // end the requests once the outbox is empty
	wake      chan struct{}

	err      error
	redirect *redirect
	shutdown *pb.Shutdown
}

type attempt struct {
	lease  *Lease
	frame  uint64 // the writer's frame count when it started
	cancel context.CancelFunc
	done   chan struct{}
	beat   *time.Timer
}

func newSession(w *worker, ep endpoint, batched bool) *session {
	s := &session{
		w:               w,
		ep:              ep,
		batched:         batched,
		attempts:        map[uint64]*attempt{},
		maxMessageBytes: defaultMaxMessageBytes,
		wake:            make(chan struct{}, 1),
	}
	s.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{
		Pool:            w.opts.Pool,
		Slots:           uint32(w.opts.Slots),
		WorkerName:      w.opts.Name,
		ProtocolVersion: ProtocolVersion,
		Labels:          w.opts.Labels,
	}}})
	return s
}

// serve runs the stream until it ends, or until ctx ends and the drain is over (true).
func (s *session) serve(ctx context.Context, conn *grpc.ClientConn) (stopped bool) {
	s.values = valuesOnly{ctx}
	// Not ctx itself: when ctx ends, the stream carries the drain.
	streamCtx, cancelStream := context.WithCancel(withToken(context.Background(), s.w.opts.Token))
	defer cancelStream()
	opened := make(chan struct{})
	go func() { // opening waits while the connection is being made: ctx ending cuts that short
		select {
		case <-ctx.Done():
			cancelStream()
		case <-opened:
		}
	}()
	var err error
	if s.batched {
		s.wire, err = openBatched(streamCtx, conn)
	} else {
		s.wire, err = openPlain(streamCtx, conn)
	}
	close(opened)
	if err != nil {
		s.err = err
		return ctx.Err() != nil
	}
	writerDone := make(chan struct{})
	go s.write(streamCtx, writerDone)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		s.read()
	}()
	select {
	case <-readerDone:
	case <-ctx.Done():
		s.drain(readerDone, cancelStream)
		stopped = true
	}
	s.end()
	cancelStream()
	<-writerDone
	return stopped
}

// read acts on the server's messages until the stream ends.
func (s *session) read() {
	for {
		msgs, err := s.wire.recv()
		if err != nil {
			if err != io.EOF {
				s.err = err
				if status.Code(err) == codes.FailedPrecondition {
					s.redirect = redirectFrom(s.wire.trailer(), s.wire.header())
				}
			}
			return
		}
		for _, m := range msgs {
			if s.ends(m) {
				return
			}
		}
	}
}

// ends acts on one message from the server; whether it ends the stream (a Shutdown, or a protocol
// error recorded in err).
func (s *session) ends(m *pb.ServerMessage) bool {
	switch msg := m.Msg.(type) {
	case *pb.ServerMessage_Registered:
		s.onRegistered(msg.Registered)
	case *pb.ServerMessage_Shutdown:
		s.shutdown = msg.Shutdown
		return true
	case *pb.ServerMessage_Lease:
		if !s.isRegistered() {
			s.err = status.Error(codes.Internal, "the server sent a lease before registered")
			return true
		}
		s.onLease(msg.Lease)
	case *pb.ServerMessage_Abort:
		s.onAbort(msg.Abort)
	}
	return false
}

func (s *session) isRegistered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.registered
}

func (s *session) onRegistered(m *pb.Registered) {
	s.mu.Lock()
	// Servers before protocol 1 sent 0 slots: they granted what was asked.
	s.granted = s.w.opts.Slots
	if m.Slots != 0 && int(m.Slots) < s.granted {
		s.granted = int(m.Slots)
	}
	if m.LeaseTtlS != nil {
		s.leaseTTL = seconds(*m.LeaseTtlS)
	}
	if m.MaxMessageBytes != 0 {
		s.maxMessageBytes = int(m.MaxMessageBytes)
	}
	s.serverProtocol = m.ProtocolVersion
	s.registered = true
	reg := Registration{
		WorkerID: m.WorkerId, Slots: s.granted, LeaseTTL: s.leaseTTL, ServerProtocol: m.ProtocolVersion,
		MaxMessageBytes: s.maxMessageBytes, Batched: s.batched, Address: s.ep.address,
	}
	s.mu.Unlock()
	if s.w.opts.OnRegistered != nil {
		s.w.opts.OnRegistered(reg)
	}
}

func (s *session) onLease(m *pb.Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		s.sendLocked(s.giveBack(m.Lease, "the worker is stopping"))
		return
	}
	if len(s.attempts) >= s.granted {
		s.sendLocked(s.giveBack(m.Lease, fmt.Sprintf("all %d slots of the worker are busy", s.granted)))
		return
	}
	lease := leaseFrom(m, s.leaseTTL)
	ctx, cancel := context.WithCancel(s.values)
	a := &attempt{lease: lease, cancel: cancel, done: make(chan struct{}), frame: s.frame}
	s.fresh++
	s.attempts[lease.ID] = a
	if lease.LeaseTTL > 0 {
		interval := lease.LeaseTTL / 3
		if interval < minHeartbeat {
			interval = minHeartbeat
		}
		a.beat = time.AfterFunc(interval, func() { s.heartbeat(a, interval) })
	}
	go s.execute(ctx, a)
}

func (s *session) heartbeat(a *attempt, interval time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.attempts[a.lease.ID] != a {
		return
	}
	s.sendLocked(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{Lease: a.lease.ID}}})
	a.beat.Reset(interval)
}

// onAbort: the server already freed the slot and expects nothing more for this lease.
func (s *session) onAbort(m *pb.Abort) {
	s.mu.Lock()
	a := s.attempts[m.Lease]
	delete(s.attempts, m.Lease)
	s.mu.Unlock()
	if a != nil {
		a.stop(m.Reason)
	}
}

func (a *attempt) stop(reason string) {
	if a.beat != nil {
		a.beat.Stop()
	}
	a.lease.setAbortReason(reason)
	a.cancel()
}

// execute runs the handler and reports how it ended, unless the lease is no longer this session's
// (aborted, drained, or the stream ended): then the outcome is not wanted.
func (s *session) execute(ctx context.Context, a *attempt) {
	defer close(a.done)
	output, err := s.invoke(ctx, a.lease)
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.frame == s.frame {
		s.fresh--
	}
	if s.attempts[a.lease.ID] != a {
		return
	}
	delete(s.attempts, a.lease.ID)
	if a.beat != nil {
		a.beat.Stop()
	}
	a.cancel()
	s.sendLocked(s.outcome(a.lease, output, err))
}

// invoke calls the handler, turning a panic into an error: a retryable failure, with the stack logged.
func (s *session) invoke(ctx context.Context, l *Lease) (output []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.w.logf("cronoq: the handler panicked on task %d (attempt %d): %v\n%s", l.TaskID, l.Attempt, p, debug.Stack())
			output, err = nil, fmt.Errorf("panic: %v", p)
		}
	}()
	return s.w.handler(ctx, l)
}

// outcome is the message reporting how the handler ended. Called with s.mu held.
func (s *session) outcome(l *Lease, output []byte, err error) *pb.WorkerMessage {
	var retryable *RetryableError
	var permanent *PermanentError
	var reject *RejectError
	switch {
	case err == nil:
		if limit := s.maxMessageBytes - outputHeadroom; len(output) > limit {
			return s.fail(l.ID, fmt.Sprintf("the handler's output is %d bytes; the server accepts at most %d", len(output), limit), true, 0)
		}
		contentType := l.OutputContentType
		if contentType == "" && len(output) > 0 {
			contentType = "application/octet-stream"
		}
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{
			Lease: l.ID, Output: output, ContentType: s.wireText(contentType),
		}}}
	case errors.As(err, &reject):
		return s.giveBack(l.ID, reject.Reason)
	case errors.Is(err, CancelTask):
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Cancelled{Cancelled: &pb.Cancelled{Lease: l.ID}}}
	case errors.As(err, &permanent):
		return s.fail(l.ID, permanent.Error(), true, 0)
	case errors.As(err, &retryable):
		return s.fail(l.ID, retryable.Error(), false, retryable.After)
	default:
		return s.fail(l.ID, err.Error(), false, 0)
	}
}

func (s *session) fail(lease uint64, message string, permanent bool, after time.Duration) *pb.WorkerMessage {
	f := &pb.Fail{Lease: lease, Message: s.wireText(message), Permanent: permanent}
	if after > 0 {
		secs := after.Seconds()
		f.RetryAfterS = &secs
	}
	return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: f}}
}

// giveBack is a Nack; servers older than protocol 2 have none, a retryable failure is the closest.
func (s *session) giveBack(lease uint64, reason string) *pb.WorkerMessage {
	if s.serverProtocol >= 2 {
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Nack{Nack: &pb.Nack{Lease: lease, Reason: s.wireText(reason)}}}
	}
	return s.fail(lease, reason, false, 0)
}

// wireText is text as a report carries it: valid UTF-8 (protobuf refuses to encode anything else, which
// would end the stream), cut to what a server keeps and to what fits in its message limit, saying how
// long it was. A handler's error text can be any length, and a report over the server's limit would end
// the stream and retry every lease on it.
func (s *session) wireText(text string) string {
	text = strings.ToValidUTF8(text, "\uFFFD")
	maxBytes := s.maxMessageBytes - outputHeadroom
	runes := utf8.RuneCountInString(text)
	if runes <= maxReportChars && len(text) <= maxBytes {
		return text
	}
	cut := fmt.Sprintf("... (cut: %s characters)", thousands(runes))
	keptRunes := maxReportChars - utf8.RuneCountInString(cut)
	keptBytes := maxBytes - len(cut)
	n, i := 0, 0
	for i < len(text) && n < keptRunes {
		_, size := utf8.DecodeRuneInString(text[i:])
		if i+size > keptBytes {
			break
		}
		i += size
		n++
	}
	return text[:i] + cut
}

// drain stops taking leases, gives running ones up to the drain timeout, fails the rest as retryable,
// half-closes the stream and waits for the server to close it (cancelling it after closeWait).
func (s *session) drain(readerDone <-chan struct{}, cancelStream context.CancelFunc) {
	grace := s.w.opts.DrainTimeout
	s.mu.Lock()
	s.stopping = true
	s.sendLocked(&pb.WorkerMessage{Msg: &pb.WorkerMessage_SetSlots{SetSlots: &pb.SetSlots{Slots: 0}}})
	running := make([]*attempt, 0, len(s.attempts))
	for _, a := range s.attempts {
		running = append(running, a)
	}
	s.mu.Unlock()
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
wait:
	for _, a := range running {
		select {
		case <-a.done:
		case <-readerDone:
			break wait
		case <-deadline.C:
			break wait
		}
	}
	s.mu.Lock()
	for id, a := range s.attempts {
		delete(s.attempts, id)
		a.stop("the worker stopped")
		s.sendLocked(s.fail(id, fmt.Sprintf("the worker stopped; the handler did not finish within %v", grace), false, 0))
	}
	s.halfClose = true
	s.mu.Unlock()
	s.wakeWriter()
	closed := time.NewTimer(closeWait)
	defer closed.Stop()
	select {
	case <-readerDone:
	case <-closed.C:
		cancelStream()
		<-readerDone
	}
}

// end ends every handler still running (the server retries their leases elsewhere) and lets the writer
// finish.
func (s *session) end() {
	s.mu.Lock()
	ended := s.attempts
	s.attempts = map[uint64]*attempt{}
	s.halfClose = true
	s.mu.Unlock()
	for _, a := range ended {
		a.stop("the worker's stream ended")
	}
	s.wakeWriter()
}

// refusedBatches: the stream ended because the server has no BatchedWorkers.Work (UNIMPLEMENTED before
// anything else; a server that has it never answers so).
func (s *session) refusedBatches() bool {
	return s.batched && !s.registered && status.Code(s.err) == codes.Unimplemented
}

// valuesOnly is a context with the values of another and none of its cancellation or deadline.
type valuesOnly struct{ context.Context }

func (valuesOnly) Deadline() (time.Time, bool) { return time.Time{}, false }
func (valuesOnly) Done() <-chan struct{}       { return nil }
func (valuesOnly) Err() error                  { return nil }

// ------------------------------------------------------------------------------------- outbound

func (s *session) send(m *pb.WorkerMessage) {
	s.mu.Lock()
	s.sendLocked(m)
	s.mu.Unlock()
}

func (s *session) sendLocked(m *pb.WorkerMessage) {
	s.outbox = append(s.outbox, m)
	if len(s.outbox) == 1 {
		s.wakeWriter()
	}
}

func (s *session) wakeWriter() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// write hands the outbox to gRPC, in order: on a batched stream everything queued by the time gRPC
// takes the next frame goes in it (within the server's max_message_bytes), never waiting for more. The
// stream is half-closed only once a drain asked for it and nothing is left to send, so that a nack for a
// lease that arrived meanwhile still reaches the server.
func (s *session) write(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	var queued []*pb.WorkerMessage
	for {
		s.settle()
		s.mu.Lock()
		queued, s.outbox = s.outbox, queued[:0]
		s.frame++
		s.fresh = 0
		halfClose, limit := s.halfClose, s.maxMessageBytes
		s.mu.Unlock()
		if len(queued) == 0 {
			if halfClose {
				_ = s.wire.closeSend()
				return
			}
			select {
			case <-s.wake:
			case <-ctx.Done():
				return
			}
			continue
		}
		if err := s.wire.send(queued, limit); err != nil {
			return // the reader sees why the stream ended
		}
		for i := range queued {
			queued[i] = nil
		}
	}
}

// settle yields to the goroutines ready to run, so that the reports of handlers finishing together
// leave in one frame: gRPC-go takes a frame at once (Send only queues it), and without this nearly every
// report went alone, which cost the server several times the CPU per task. It yields (64 turns at most)
// while the turns add to the outbox or handlers started since the last frame still run: those are
// the reports on their way. A turn with nobody else ready to run returns at once, and nothing waits on a
// timer, so a lone report is delayed by microseconds at most.
func (s *session) settle() {
	s.mu.Lock()
	queued := len(s.outbox)
	s.mu.Unlock()
	for i := 0; i < 64; i++ {
		runtime.Gosched()
		s.mu.Lock()
		grew := len(s.outbox) > queued
		queued = len(s.outbox)
		fresh := s.fresh
		s.mu.Unlock()
		if !grew && fresh == 0 {
			return
		}
	}
}

// ------------------------------------------------------------------------------------- streams

// wire is one of the two services' streams, as messages one by one.
type wire interface {
	send(msgs []*pb.WorkerMessage, maxBytes int) error
	recv() ([]*pb.ServerMessage, error)
	closeSend() error
	header() metadata.MD
	trailer() metadata.MD
}

type plainWire struct{ stream pb.Workers_WorkClient }

func openPlain(ctx context.Context, conn *grpc.ClientConn) (wire, error) {
	stream, err := pb.NewWorkersClient(conn).Work(ctx)
	return plainWire{stream}, err
}

func (p plainWire) send(msgs []*pb.WorkerMessage, _ int) error {
	for _, m := range msgs {
		if err := p.stream.Send(m); err != nil {
			return err
		}
	}
	return nil
}

func (p plainWire) recv() ([]*pb.ServerMessage, error) {
	m, err := p.stream.Recv()
	if err != nil {
		return nil, err
	}
	return []*pb.ServerMessage{m}, nil
}

func (p plainWire) closeSend() error { return p.stream.CloseSend() }
func (p plainWire) header() metadata.MD {
	md, _ := p.stream.Header()
	return md
}
func (p plainWire) trailer() metadata.MD { return p.stream.Trailer() }

type batchedWire struct{ stream pb.BatchedWorkers_WorkClient }

func openBatched(ctx context.Context, conn *grpc.ClientConn) (wire, error) {
	stream, err := pb.NewBatchedWorkersClient(conn).Work(ctx)
	return batchedWire{stream}, err
}

// send sends msgs in as few frames as fit: each message counts its size plus framingBytes.
func (b batchedWire) send(msgs []*pb.WorkerMessage, maxBytes int) error {
	for len(msgs) > 0 {
		n, size := 1, proto.Size(msgs[0])+framingBytes
		for n < len(msgs) {
			next := proto.Size(msgs[n]) + framingBytes
			if size+next > maxBytes {
				break
			}
			size += next
			n++
		}
		if err := b.stream.Send(&pb.WorkerBatch{Messages: msgs[:n]}); err != nil {
			return err
		}
		msgs = msgs[n:]
	}
	return nil
}

func (b batchedWire) recv() ([]*pb.ServerMessage, error) {
	batch, err := b.stream.Recv()
	if err != nil {
		return nil, err
	}
	return batch.Messages, nil
}

func (b batchedWire) closeSend() error { return b.stream.CloseSend() }
func (b batchedWire) header() metadata.MD {
	md, _ := b.stream.Header()
	return md
}
func (b batchedWire) trailer() metadata.MD { return b.stream.Trailer() }

// thousands writes n with a comma every three digits, as the Python SDK's cut reports do.
func thousands(n int) string {
	digits := strconv.Itoa(n)
	var b strings.Builder
	for i, d := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	return b.String()
}
