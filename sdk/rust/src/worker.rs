//! [`run_worker`]: a remote worker serving one pool.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use hyper::Body;
use prost::Message;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::errors::{Code, TaskError, WorkerError};
use crate::grpc::{self, Call, Connection, Endpoint, Status};
use crate::pb;
use crate::pb::server_message::Msg as ServerMsg;
use crate::pb::worker_message::Msg as WorkerMsg;
use crate::redirect::{parse_target, redirect_from, Redirect, Redirects};
use crate::{MAX_REDIRECTS, PROTOCOL_VERSION};

const DEFAULT_DRAIN: Duration = Duration::from_secs(30);
const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(200);
const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10);
/// gRPC's default, for servers that do not say.
const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Room for the Complete message around the output bytes.
const OUTPUT_HEADROOM: usize = 1024;
/// What a message adds to a batch: its tag and its length.
const FRAMING_BYTES: usize = 6;
/// The longest message or reason a server keeps.
const MAX_REPORT_CHARS: usize = 8192;
const MIN_HEARTBEAT: Duration = Duration::from_millis(10);
/// How long a drain waits for the server to end the stream.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
const LEADER_HUNT: Duration = Duration::from_secs(15);
const LEADER_HUNT_DELAY: Duration = Duration::from_millis(100);

/// TLS settings: `ca_pem` for a private CA (None: the system's roots), `identity` = (certificate
/// chain PEM, private key PEM) for mTLS, `domain` the name the configured target's certificate is
/// checked against (None: the target's host). rustls 0.20 checks DNS names only: for a target given
/// as an IP address, set `domain` to a DNS name in the server's certificate.
#[derive(Clone, Debug, Default)]
pub struct WorkerTls {
    pub ca_pem: Option<Vec<u8>>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    pub domain: Option<String>,
}

/// A registration with a server, as [`WorkerOptions::on_registered`] sees it.
#[derive(Clone, Debug)]
pub struct Registration {
    pub worker_id: u64,
    /// Granted: at most [`WorkerOptions::slots`].
    pub slots: u32,
    /// None when the pool has none.
    pub lease_ttl: Option<Duration>,
    pub server_protocol: u32,
    pub max_message_bytes: usize,
    /// The stream is `BatchedWorkers.Work`.
    pub batched: bool,
    /// The server's host:port (another shard's after a redirect).
    pub address: String,
}

type OnRegistered = Arc<dyn Fn(&Registration) + Send + Sync>;

/// The options of [`run_worker`], built with [`WorkerOptions::new`] and its setters.
#[derive(Clone)]
pub struct WorkerOptions {
    target: String,
    pool: String,
    slots: u32,
    token: Option<String>,
    name: String,
    labels: HashMap<String, String>,
    tls: Option<WorkerTls>,
    drain_timeout: Duration,
    insecure_redirect_http: bool,
    batches: bool,
    initial_backoff: Duration,
    max_backoff: Duration,
    on_registered: Option<OnRegistered>,
}

impl WorkerOptions {
    /// `target` is host:port or an http://, https:// or grpc:// URL (https:// means TLS); `pool` the
    /// pool to serve. One slot, no token, a drain of 30 s, backoff from 200 ms to 10 s.
    pub fn new(target: impl Into<String>, pool: impl Into<String>) -> Self {
        WorkerOptions {
            target: target.into(),
            pool: pool.into(),
            slots: 1,
            token: None,
            name: String::new(),
            labels: HashMap::new(),
            tls: None,
            drain_timeout: DEFAULT_DRAIN,
            insecure_redirect_http: false,
            batches: true,
            initial_backoff: DEFAULT_INITIAL_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            on_registered: None,
        }
    }
    /// How many handlers run at once at most; the server may grant fewer.
    pub fn slots(mut self, slots: u32) -> Self {
        self.slots = slots;
        self
    }
    /// A worker-role token, sent as `authorization: Bearer <token>`.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }
    /// The name shown in the server's worker list.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    /// Registers the worker with a label: tasks submitted with labels run only on workers that have them.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
    /// TLS (with a host:port target too); refused with an http:// target.
    pub fn tls(mut self, tls: WorkerTls) -> Self {
        self.tls = Some(tls);
        self
    }
    /// How long running handlers may finish once `shutdown` resolves (default 30 s).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }
    /// Lets shard redirects send the token over plain http:// to another host: trusted networks only.
    pub fn insecure_redirect_http(mut self, allow: bool) -> Self {
        self.insecure_redirect_http = allow;
        self
    }
    /// false: always `Workers.Work`, never the `BatchedWorkers` extension.
    pub fn batches(mut self, batches: bool) -> Self {
        self.batches = batches;
        self
    }
    /// The delay between reconnects: from `initial`, doubling up to `max`.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }
    /// Called after each registration (a reconnect registers again).
    pub fn on_registered(mut self, f: impl Fn(&Registration) + Send + Sync + 'static) -> Self {
        self.on_registered = Some(Arc::new(f));
        self
    }
}

/// One attempt of a task, handed to the handler. Use (`task_id`, `attempt`) to make side effects
/// idempotent: a task runs at least once, and can run more than once.
#[derive(Clone, Debug)]
pub struct Lease {
    /// The lease: the attempt on this worker's stream.
    pub lease: u64,
    pub task_id: u64,
    /// Starts at 1.
    pub attempt: u32,
    pub pool: String,
    pub payload: Bytes,
    pub content_type: String,
    pub kind: String,
    /// "" when the task has none.
    pub key: String,
    /// Include traceparent (and tracestate) when the task carries a trace context.
    pub tags: HashMap<String, String>,
    /// "critical", "high", "normal" or "low"; "" when the server does not say.
    pub priority: String,
    /// The limit for this attempt.
    pub timeout: Option<Duration>,
    /// The task's soft deadline.
    pub deadline: Option<SystemTime>,
    /// The heartbeat bound; the worker sends the heartbeats, not the handler.
    pub lease_ttl: Option<Duration>,
    /// Cancelled when the server aborts the attempt (timeout, cancellation, lease expiry), when a drain
    /// runs out of time, or when the worker's stream ends (the server then retries the lease elsewhere).
    pub cancel: CancellationToken,
    abort_reason: Arc<Mutex<String>>,
}

impl Lease {
    /// Why the attempt was aborted ("attempt timed out", "the worker stopped", ...); "" while it runs.
    pub fn abort_reason(&self) -> String {
        self.abort_reason.lock().unwrap().clone()
    }

    fn stop(&self, reason: &str) {
        let mut current = self.abort_reason.lock().unwrap();
        if current.is_empty() {
            *current = reason.to_string();
        }
        drop(current);
        self.cancel.cancel();
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Bytes, TaskError>> + Send>>;
type Handler = Arc<dyn Fn(Lease) -> BoxFuture + Send + Sync>;

/// Serves `opts`' pool with `handler` until `shutdown` resolves, then drains: it stops taking leases
/// (SetSlots 0), lets running handlers finish for up to the drain timeout, fails the rest as
/// retryable, and returns Ok once the server has closed the stream. It enforces the granted slots,
/// heartbeats each lease every TTL/3, cancels `lease.cancel` on Abort, turns a panicking handler into
/// a retryable failure, reconnects with backoff (at once when leadership moved), and follows the pool
/// to the shard that serves it. It returns an error only for what retrying cannot fix: a refused
/// token, an unknown pool, a refused redirect, invalid options.
pub async fn run_worker<F, Fut>(
    opts: WorkerOptions,
    handler: F,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError>
where
    F: Fn(Lease) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, TaskError>> + Send + 'static,
{
    let handler: Handler = Arc::new(move |lease| Box::pin(handler(lease)) as BoxFuture);
    let mut worker = Worker::new(opts, handler)?;
    let stop = CancellationToken::new();
    let main = worker.run(stop.clone());
    tokio::pin!(main);
    tokio::pin!(shutdown);
    let mut signalled = false;
    loop {
        tokio::select! {
            result = &mut main => return result,
            _ = &mut shutdown, if !signalled => {
                signalled = true;
                stop.cancel();
            }
        }
    }
}

struct Worker {
    opts: WorkerOptions,
    handler: Handler,
    home: Endpoint,
    redirects: Redirects,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// Endpoints that answered BatchedWorkers.Work with UNIMPLEMENTED, until a stream with them ends: a
    /// server upgraded meanwhile gets the extension asked for again.
    unbatched: HashSet<Endpoint>,
}

/// The statuses retrying cannot fix: run_worker returns them instead of reconnecting.
fn fatal(code: Code) -> bool {
    matches!(
        code,
        Code::Unauthenticated
            | Code::PermissionDenied
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::InvalidArgument
            | Code::Unimplemented
    )
}

impl Worker {
    fn new(opts: WorkerOptions, handler: Handler) -> Result<Self, WorkerError> {
        if opts.pool.is_empty() {
            return Err(WorkerError::invalid("pool", "empty"));
        }
        if opts.slots == 0 || opts.slots > 1 << 20 {
            return Err(WorkerError::invalid(
                "slots",
                format!("{} is not between 1 and 1048576", opts.slots),
            ));
        }
        if opts.initial_backoff.is_zero() || opts.max_backoff < opts.initial_backoff {
            return Err(WorkerError::invalid(
                "backoff",
                format!(
                    "need 0 < initial <= maximum (got {:?}, {:?})",
                    opts.initial_backoff, opts.max_backoff
                ),
            ));
        }
        if opts.token.as_deref() == Some("") {
            return Err(WorkerError::invalid("token", "empty"));
        }
        let home = parse_target(&opts.target, opts.tls.is_some())?;
        let tls = if home.secure {
            Some(Arc::new(client_config(opts.tls.as_ref())?))
        } else {
            None
        };
        let redirects = Redirects::new(home.clone(), opts.token.is_some(), opts.insecure_redirect_http);
        Ok(Worker {
            opts,
            handler,
            home,
            redirects,
            tls,
            unbatched: HashSet::new(),
        })
    }

    async fn run(&mut self, stop: CancellationToken) -> Result<(), WorkerError> {
        let mut ep = self.home.clone();
        let mut delay = self.opts.initial_backoff;
        let mut redirects_in_row = 0;
        let mut hunt_until: Option<Instant> = None;
        let mut conn: Option<Connection> = None; // kept from a stream refused for want of batches
        while !stop.is_cancelled() {
            let batched = self.opts.batches && !self.unbatched.contains(&ep);
            let began = Instant::now();
            let end = match conn.as_mut() {
                Some(c) => Session::new(self, &ep, batched).serve(c, &stop).await,
                None => match self.connect(&ep, &stop).await {
                    Some(Ok(c)) => {
                        Session::new(self, &ep, batched)
                            .serve(conn.insert(c), &stop)
                            .await
                    }
                    Some(Err(status)) => End::failed(status),
                    None => return Ok(()),
                },
            };
            if end.stopped {
                return Ok(());
            }
            let code = end.status.as_ref().map(|s| s.code);
            if batched && !end.registered && code == Some(Code::Unimplemented) {
                // A server without the extension: Workers.Work at once, on the same connection.
                self.unbatched.insert(ep.clone());
                continue;
            }
            conn = None;
            if !batched && end.registered {
                self.unbatched.remove(&ep);
            }
            if began.elapsed() > self.opts.max_backoff * 10 {
                delay = self.opts.initial_backoff;
            }
            if let Some(status) = &end.status {
                if let Some(redirect) = end
                    .redirect
                    .as_ref()
                    .filter(|_| status.code == Code::FailedPrecondition)
                {
                    redirects_in_row += 1;
                    if redirects_in_row > MAX_REDIRECTS {
                        return Err(WorkerError::new(
                            Code::FailedPrecondition,
                            format!(
                                "gave up after {MAX_REDIRECTS} shard redirects in a row (the last pointed to {:?})",
                                redirect.url
                            ),
                        ));
                    }
                    ep = self.redirects.follow(&ep, redirect)?;
                    continue;
                }
                redirects_in_row = 0;
                if fatal(status.code) {
                    return Err(WorkerError::new(status.code, status.message.clone()));
                }
                eprintln!(
                    "cronoq: worker stream to {} ended: {:?}: {}; reconnecting",
                    ep.address, status.code, status.message
                );
            } else {
                redirects_in_row = 0;
            }
            if code == Some(Code::Unavailable) {
                ep = self.home.clone(); // a redirected-to shard is down: ask the configured target again
            }
            if end.shutdown.as_ref().map(|s| s.not_leader).unwrap_or(false) {
                hunt_until = Some(Instant::now() + LEADER_HUNT);
                continue; // leadership moved: the new leader is ready now, or in a moment
            }
            let pause = if code == Some(Code::Unavailable)
                && hunt_until.map(|t| Instant::now() < t).unwrap_or(false)
            {
                LEADER_HUNT_DELAY // a standby, or the new leader still recovering
            } else {
                let pause = delay;
                delay = (delay * 2).min(self.opts.max_backoff);
                pause
            };
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep(pause) => {}
            }
        }
        Ok(())
    }

    /// A connection to `ep`, or None when `stop` fires first.
    async fn connect(&self, ep: &Endpoint, stop: &CancellationToken) -> Option<Result<Connection, Status>> {
        let tls = if ep.secure {
            // The domain override is for the configured target: another shard is checked by its own name.
            let name = match &self.opts.tls {
                Some(WorkerTls {
                    domain: Some(domain), ..
                }) if *ep == self.home => domain.clone(),
                _ => crate::redirect::address_host(&ep.address),
            };
            // Without TLS settings (an http:// target redirected to https://): the system's roots.
            let config = match &self.tls {
                Some(config) => config.clone(),
                None => match client_config(None) {
                    Ok(config) => Arc::new(config),
                    Err(e) => return Some(Err(Status::new(Code::Unavailable, e.message))),
                },
            };
            Some((config, name))
        } else {
            None
        };
        tokio::select! {
            _ = stop.cancelled() => None,
            result = grpc::connect(ep, tls) => Some(result),
        }
    }
}

/// The rustls client configuration: the CA given or the system's roots, the identity for mTLS, ALPN h2.
fn client_config(tls: Option<&WorkerTls>) -> Result<rustls::ClientConfig, WorkerError> {
    let mut roots = rustls::RootCertStore::empty();
    match tls.and_then(|t| t.ca_pem.as_ref()) {
        Some(pem) => {
            let certs = rustls_pemfile::certs(&mut pem.as_slice())
                .map_err(|e| WorkerError::invalid("tls.ca_pem", e))?;
            if certs.is_empty() {
                return Err(WorkerError::invalid("tls.ca_pem", "no PEM certificate in it"));
            }
            for cert in certs {
                roots
                    .add(&rustls::Certificate(cert))
                    .map_err(|e| WorkerError::invalid("tls.ca_pem", e))?;
            }
        }
        None => {
            let certs = rustls_native_certs::load_native_certs()
                .map_err(|e| WorkerError::invalid("tls", format!("the system's CA certificates: {e}")))?;
            for cert in certs {
                let _ = roots.add(&rustls::Certificate(cert.0));
            }
        }
    }
    let builder = rustls::ClientConfig::builder()
        .with_safe_defaults()
        .with_root_certificates(roots);
    let mut config = match tls.and_then(|t| t.identity.as_ref()) {
        Some((cert_pem, key_pem)) => {
            let chain = rustls_pemfile::certs(&mut cert_pem.as_slice())
                .map_err(|e| WorkerError::invalid("tls.identity", e))?;
            if chain.is_empty() {
                return Err(WorkerError::invalid(
                    "tls.identity",
                    "no PEM certificate in the first part",
                ));
            }
            let key = rustls_pemfile::read_all(&mut key_pem.as_slice())
                .map_err(|e| WorkerError::invalid("tls.identity", e))?
                .into_iter()
                .find_map(|item| match item {
                    rustls_pemfile::Item::PKCS8Key(k)
                    | rustls_pemfile::Item::RSAKey(k)
                    | rustls_pemfile::Item::ECKey(k) => Some(k),
                    _ => None,
                })
                .ok_or_else(|| {
                    WorkerError::invalid("tls.identity", "no PEM private key in the second part")
                })?;
            builder
                .with_single_cert(
                    chain.into_iter().map(rustls::Certificate).collect(),
                    rustls::PrivateKey(key),
                )
                .map_err(|e| WorkerError::invalid("tls.identity", e))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// How a session ended.
struct End {
    stopped: bool,
    registered: bool,
    status: Option<Status>,
    redirect: Option<Redirect>,
    shutdown: Option<pb::Shutdown>,
}

impl End {
    fn failed(status: Status) -> Self {
        End {
            stopped: false,
            registered: false,
            redirect: redirect_from(&status.metadata),
            status: Some(status),
            shutdown: None,
        }
    }
}

/// What the writer is handed.
enum Out {
    Message(pb::WorkerMessage),
    /// Half-close the stream once what was queued before is sent.
    Close,
}

/// The state a session's reader, handlers and heartbeats share.
struct State {
    attempts: HashMap<u64, Lease>,
    stopping: bool,
    registered: bool,
    granted: usize,
    server_protocol: u32,
    lease_ttl: Option<Duration>,
    max_message_bytes: usize,
    /// Counts the times the writer took the outbox.
    frame: u64,
    /// Handlers started since then that are still running: their reports are on their way.
    fresh: usize,
}

struct Shared {
    state: Mutex<State>,
    out: mpsc::UnboundedSender<Out>,
    /// Messages sent and not yet taken by the writer.
    queued: AtomicUsize,
    /// Signalled whenever an attempt ends, for the drain.
    ended: Notify,
}

impl Shared {
    fn send(&self, message: WorkerMsg) {
        self.queued.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .out
            .send(Out::Message(pb::WorkerMessage { msg: Some(message) }));
    }
}

/// One Work stream. It owns the leases that arrived on it: a lease means nothing on any other stream,
/// since when a stream ends the server retries its leases elsewhere, so their tokens are cancelled
/// rather than their outcomes reported.
struct Session<'a> {
    worker: &'a Worker,
    ep: &'a Endpoint,
    batched: bool,
    shared: Arc<Shared>,
    outbox: Option<mpsc::UnboundedReceiver<Out>>,
}

impl<'a> Session<'a> {
    fn new(worker: &'a Worker, ep: &'a Endpoint, batched: bool) -> Self {
        let (out, outbox) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                attempts: HashMap::new(),
                stopping: false,
                registered: false,
                granted: 0,
                server_protocol: 0,
                lease_ttl: None,
                max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
                frame: 0,
                fresh: 0,
            }),
            out,
            queued: AtomicUsize::new(0),
            ended: Notify::new(),
        });
        let opts = &worker.opts;
        shared.send(WorkerMsg::Register(pb::Register {
            pool: opts.pool.clone(),
            slots: opts.slots,
            worker_name: opts.name.clone(),
            protocol_version: PROTOCOL_VERSION,
            labels: opts.labels.clone(),
        }));
        Session {
            worker,
            ep,
            batched,
            shared,
            outbox: Some(outbox),
        }
    }

    /// Runs the stream until it ends, or until `stop` fires and the drain is over (`stopped`).
    async fn serve(mut self, conn: &mut Connection, stop: &CancellationToken) -> End {
        let (sender, body) = Body::channel();
        let writer = tokio::spawn(write(
            self.outbox.take().expect("served once"),
            sender,
            self.batched,
            self.shared.clone(),
        ));
        let path = if self.batched {
            "/cronoq.v1.BatchedWorkers/Work"
        } else {
            "/cronoq.v1.Workers/Work"
        };
        let opened = tokio::select! {
            _ = stop.cancelled() => None,
            call = conn.call(path, self.worker.opts.token.as_deref(), body) => Some(call),
        };
        let mut end = match opened {
            None => End {
                stopped: true,
                ..End::failed(Status::new(Code::Cancelled, "stopped"))
            },
            Some(Err(status)) => End::failed(status),
            Some(Ok(call)) => {
                let reader = self.read(call);
                tokio::pin!(reader);
                tokio::select! {
                    end = &mut reader => end,
                    _ = stop.cancelled() => {
                        let mut end = self.drain(reader).await;
                        end.stopped = true;
                        end
                    }
                }
            }
        };
        end.registered = self.shared.state.lock().unwrap().registered;
        self.end();
        writer.abort();
        end
    }

    /// Acts on the server's messages until the stream ends.
    async fn read(&self, mut call: Call) -> End {
        loop {
            let frame = match call.recv().await {
                Ok(frame) => frame,
                Err(status) if status.code == Code::Ok => {
                    return End {
                        status: None,
                        ..End::failed(status)
                    };
                }
                Err(status) => return End::failed(status),
            };
            let messages = if self.batched {
                pb::ServerBatch::decode(frame).map(|b| b.messages)
            } else {
                pb::ServerMessage::decode(frame).map(|m| vec![m])
            };
            let messages = match messages {
                Ok(messages) => messages,
                Err(e) => {
                    return End::failed(Status::new(
                        Code::Internal,
                        format!("an undecodable message: {e}"),
                    ))
                }
            };
            for message in messages {
                match message.msg {
                    Some(ServerMsg::Registered(m)) => self.on_registered(m),
                    Some(ServerMsg::Lease(m)) => {
                        if !self.shared.state.lock().unwrap().registered {
                            return End::failed(Status::new(
                                Code::Internal,
                                "the server sent a lease before registered",
                            ));
                        }
                        self.on_lease(m);
                    }
                    Some(ServerMsg::Abort(m)) => {
                        let lease = self.shared.state.lock().unwrap().attempts.remove(&m.lease);
                        if let Some(lease) = lease {
                            lease.stop(&m.reason);
                            self.shared.ended.notify_waiters();
                        }
                    }
                    Some(ServerMsg::Shutdown(m)) => {
                        return End {
                            shutdown: Some(m),
                            stopped: false,
                            registered: false,
                            status: None,
                            redirect: None,
                        }
                    }
                    None => {}
                }
            }
        }
    }

    fn on_registered(&self, m: pb::Registered) {
        let opts = &self.worker.opts;
        let registration = {
            let mut state = self.shared.state.lock().unwrap();
            // Servers before protocol 1 sent 0 slots: they granted what was asked.
            state.granted = if m.slots != 0 {
                m.slots.min(opts.slots)
            } else {
                opts.slots
            } as usize;
            state.lease_ttl = m.lease_ttl_s.and_then(seconds);
            if m.max_message_bytes != 0 {
                state.max_message_bytes = m.max_message_bytes as usize;
            }
            state.server_protocol = m.protocol_version;
            state.registered = true;
            Registration {
                worker_id: m.worker_id,
                slots: state.granted as u32,
                lease_ttl: state.lease_ttl,
                server_protocol: m.protocol_version,
                max_message_bytes: state.max_message_bytes,
                batched: self.batched,
                address: self.ep.address.clone(),
            }
        };
        if let Some(f) = &opts.on_registered {
            f(&registration);
        }
    }

    fn on_lease(&self, m: pb::Lease) {
        let mut state = self.shared.state.lock().unwrap();
        if state.stopping {
            let nack = give_back(&state, m.lease, "the worker is stopping");
            self.shared.send(nack);
            return;
        }
        if state.attempts.len() >= state.granted {
            let reason = format!("all {} slots of the worker are busy", state.granted);
            let nack = give_back(&state, m.lease, &reason);
            self.shared.send(nack);
            return;
        }
        let lease = Lease {
            lease: m.lease,
            task_id: m.task_id,
            attempt: m.attempt,
            pool: m.pool,
            payload: m.payload.into(),
            content_type: m.content_type,
            kind: m.kind,
            key: m.key,
            tags: m.tags,
            priority: priority_name(m.priority),
            timeout: m.timeout_s.and_then(seconds),
            deadline: m
                .deadline_unix_ns
                .map(|ns| UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns).unwrap_or(0))),
            lease_ttl: m.lease_ttl_s.and_then(seconds).or(state.lease_ttl),
            cancel: CancellationToken::new(),
            abort_reason: Arc::new(Mutex::new(String::new())),
        };
        state.attempts.insert(lease.lease, lease.clone());
        state.fresh += 1;
        let frame = state.frame;
        drop(state);
        tokio::spawn(execute(
            self.shared.clone(),
            self.worker.handler.clone(),
            lease,
            frame,
        ));
    }

    /// Stops taking leases, gives running ones up to the drain timeout, fails the rest as retryable,
    /// half-closes the stream and waits for the server to close it (for up to CLOSE_WAIT).
    async fn drain(&self, mut reader: Pin<&mut impl Future<Output = End>>) -> End {
        let grace = self.worker.opts.drain_timeout;
        {
            let mut state = self.shared.state.lock().unwrap();
            state.stopping = true;
            self.shared.send(WorkerMsg::SetSlots(pb::SetSlots { slots: 0 }));
        }
        let deadline = tokio::time::sleep(grace);
        tokio::pin!(deadline);
        loop {
            let ended = self.shared.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.shared.state.lock().unwrap().attempts.is_empty() {
                break;
            }
            tokio::select! {
                _ = ended => {}
                _ = &mut deadline => break,
                end = reader.as_mut() => return end,
            }
        }
        {
            let mut state = self.shared.state.lock().unwrap();
            let message = format!(
                "the worker stopped; the handler did not finish within {}",
                format_duration(grace)
            );
            let fail = fail_message(&state, &message, false, None);
            for (id, lease) in state.attempts.drain() {
                lease.stop("the worker stopped");
                let mut fail = fail.clone();
                fail.lease = id;
                self.shared.send(WorkerMsg::Fail(fail));
            }
            let _ = self.shared.out.send(Out::Close);
        }
        tokio::select! {
            end = reader.as_mut() => end,
            _ = tokio::time::sleep(CLOSE_WAIT) => End::failed(Status::new(Code::Cancelled, "the server did not close the stream")),
        }
    }

    /// Cancels every handler still running: the server retries their leases elsewhere.
    fn end(&self) {
        let ended: Vec<Lease> = {
            let mut state = self.shared.state.lock().unwrap();
            state.attempts.drain().map(|(_, lease)| lease).collect()
        };
        for lease in ended {
            lease.stop("the worker's stream ended");
        }
    }
}

/// Runs the handler in its own task (where a panic is caught), heartbeats the lease while it runs, and
/// reports how it ended unless the lease is no longer the session's (aborted, drained, or the stream
/// ended): then the outcome is not wanted.
async fn execute(shared: Arc<Shared>, handler: Handler, lease: Lease, frame: u64) {
    let id = lease.lease;
    let cancel = lease.cancel.clone();
    let beat = lease.lease_ttl.map(|ttl| (ttl / 3).max(MIN_HEARTBEAT));
    let (task_id, attempt) = (lease.task_id, lease.attempt);
    let mut handle = tokio::spawn(async move { handler(lease).await });
    let mut ticks = beat.map(|every| tokio::time::interval_at(tokio::time::Instant::now() + every, every));
    let joined = loop {
        tokio::select! {
            joined = &mut handle => break joined,
            _ = async { ticks.as_mut().unwrap().tick().await }, if ticks.is_some() && !cancel.is_cancelled() => {
                let state = shared.state.lock().unwrap();
                if state.attempts.contains_key(&id) {
                    shared.send(WorkerMsg::Heartbeat(pb::Heartbeat { lease: id }));
                }
            }
        }
    };
    let result = match joined {
        Ok(result) => result,
        Err(e) if e.is_panic() => {
            let panic = e.into_panic();
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "the handler panicked".to_string());
            eprintln!("cronoq: the handler panicked on task {task_id} (attempt {attempt}): {text}");
            Err(TaskError::from_err(format!("panic: {text}")))
        }
        Err(_) => Err(TaskError::from_err("the handler's task was cancelled")),
    };
    let mut state = shared.state.lock().unwrap();
    if state.frame == frame {
        state.fresh = state.fresh.saturating_sub(1);
    }
    let lease = match state.attempts.remove(&id) {
        Some(lease) => lease,
        None => return,
    };
    lease.cancel.cancel();
    let report = outcome(&state, id, result);
    shared.send(report);
    drop(state);
    shared.ended.notify_waiters();
}

/// The message reporting how a handler ended.
fn outcome(state: &State, lease: u64, result: Result<Bytes, TaskError>) -> WorkerMsg {
    let with_lease = |mut fail: pb::Fail| {
        fail.lease = lease;
        WorkerMsg::Fail(fail)
    };
    match result {
        Ok(output) => {
            let limit = state.max_message_bytes.saturating_sub(OUTPUT_HEADROOM);
            if output.len() > limit {
                let message = format!(
                    "the handler's output is {} bytes; the server accepts at most {limit}",
                    output.len()
                );
                return with_lease(fail_message(state, &message, true, None));
            }
            let content_type = if output.is_empty() {
                ""
            } else {
                "application/octet-stream"
            };
            WorkerMsg::Complete(pb::Complete {
                lease,
                output: output.to_vec(),
                content_type: content_type.to_string(),
            })
        }
        Err(TaskError::Reject(reason)) => give_back(state, lease, &reason),
        Err(TaskError::Cancelled) => WorkerMsg::Cancelled(pb::Cancelled { lease }),
        Err(TaskError::Permanent(message)) => with_lease(fail_message(state, &message, true, None)),
        Err(TaskError::Retryable { message, retry_after }) => {
            with_lease(fail_message(state, &message, false, retry_after))
        }
    }
}

/// A Fail (for lease 0: the caller sets it) with its message as a report carries it.
fn fail_message(state: &State, message: &str, permanent: bool, after: Option<Duration>) -> pb::Fail {
    pb::Fail {
        lease: 0,
        message: wire_text(state, message),
        permanent,
        retry_after_s: after.filter(|d| !d.is_zero()).map(|d| d.as_secs_f64()),
    }
}

/// A Nack; servers older than protocol 2 have none, a retryable failure is the closest.
fn give_back(state: &State, lease: u64, reason: &str) -> WorkerMsg {
    if state.server_protocol >= 2 {
        return WorkerMsg::Nack(pb::Nack {
            lease,
            reason: wire_text(state, reason),
        });
    }
    let mut fail = fail_message(state, reason, false, None);
    fail.lease = lease;
    WorkerMsg::Fail(fail)
}

/// Text as a report carries it: cut to what a server keeps and to what fits in its message limit,
/// saying how long it was. A handler's error text can be any length, and a report over the server's
/// limit would end the stream and retry every lease on it.
fn wire_text(state: &State, text: &str) -> String {
    let max_bytes = state.max_message_bytes.saturating_sub(OUTPUT_HEADROOM);
    let chars = text.chars().count();
    if chars <= MAX_REPORT_CHARS && text.len() <= max_bytes {
        return text.to_string();
    }
    let cut = format!("... (cut: {} characters)", thousands(chars));
    let kept_chars = MAX_REPORT_CHARS - cut.chars().count();
    let kept_bytes = max_bytes.saturating_sub(cut.len());
    let mut end = 0;
    for (n, (i, c)) in text.char_indices().enumerate() {
        if n >= kept_chars || i + c.len_utf8() > kept_bytes {
            break;
        }
        end = i + c.len_utf8();
    }
    format!("{}{cut}", &text[..end])
}

/// n with a comma every three digits, as the Python SDK's cut reports write it.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// A duration as Go prints it ("300ms", "30s"), as the other SDKs' drain messages say it.
fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.as_nanos() % 1_000_000 == 0 && d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

/// A duration from the wire's seconds; None for one that is not a duration (negative, NaN, too large).
fn seconds(s: f64) -> Option<Duration> {
    if s.is_finite() && (0.0..1e12).contains(&s) {
        Some(Duration::from_secs_f64(s))
    } else {
        None
    }
}

/// The lower-case class name of a wire priority ("" when unspecified).
fn priority_name(priority: i32) -> String {
    match pb::Priority::from_i32(priority) {
        Some(pb::Priority::Critical) => "critical",
        Some(pb::Priority::High) => "high",
        Some(pb::Priority::Normal) => "normal",
        Some(pb::Priority::Low) => "low",
        _ => "",
    }
    .to_string()
}

/// Hands the outbox to the stream, in order: on a batched stream everything queued by the time the
/// transport takes the next frame goes in it (within the server's max_message_bytes), never waiting
/// for more than [`settle`] does.
async fn write(
    mut outbox: mpsc::UnboundedReceiver<Out>,
    mut sender: hyper::body::Sender,
    batched: bool,
    shared: Arc<Shared>,
) {
    let mut queued = Vec::new();
    loop {
        let mut next = outbox.recv().await;
        if next.is_none() {
            return;
        }
        settle(&shared).await;
        {
            let mut state = shared.state.lock().unwrap();
            state.frame += 1;
            state.fresh = 0;
        }
        let mut close = false;
        while let Some(out) = next.take().or_else(|| outbox.try_recv().ok()) {
            match out {
                Out::Message(m) => {
                    shared.queued.fetch_sub(1, Ordering::Relaxed);
                    queued.push(m);
                }
                Out::Close => {
                    close = true;
                    break;
                }
            }
        }
        let limit = batched.then(|| shared.state.lock().unwrap().max_message_bytes);
        let buffer = encode(queued.drain(..), limit);
        if !buffer.is_empty() && sender.send_data(buffer.freeze()).await.is_err() {
            return; // the reader sees why the stream ended
        }
        if close {
            return; // dropping the sender ends the request stream
        }
    }
}

/// The gRPC messages carrying `messages`: one each on Workers.Work (`limit` None), or on
/// BatchedWorkers.Work as few frames as fit within `limit` bytes, counting each message's size plus its
/// tag and length (a message larger than the limit on its own goes alone).
fn encode(messages: impl Iterator<Item = pb::WorkerMessage>, limit: Option<usize>) -> BytesMut {
    let mut buffer = BytesMut::new();
    let limit = match limit {
        Some(limit) => limit,
        None => {
            messages.for_each(|m| grpc::frame(&m, &mut buffer));
            return buffer;
        }
    };
    let mut messages = messages.peekable();
    while messages.peek().is_some() {
        let mut batch = pb::WorkerBatch::default();
        let mut size = 0;
        while let Some(m) =
            messages.next_if(|m| batch.messages.is_empty() || size + m.encoded_len() + FRAMING_BYTES <= limit)
        {
            size += m.encoded_len() + FRAMING_BYTES;
            batch.messages.push(m);
        }
        grpc::frame(&batch, &mut buffer);
    }
    buffer
}

/// Yields to the tasks ready to run, so that the reports of handlers finishing together leave in one
/// frame: on tokio's multi-threaded runtime, handlers finish on other threads while the writer takes
/// the outbox, and with one yield most frames carried a report or two, which cost the server more than
/// twice the CPU per task. It yields (64 turns at most) while the turns add to the outbox or handlers
/// started since the last frame still run: those are the reports on their way. A turn with nobody else
/// ready to run returns at once, and nothing waits on a timer, so a lone report is delayed by
/// microseconds at most.
async fn settle(shared: &Shared) {
    let mut queued = shared.queued.load(Ordering::Relaxed);
    for _ in 0..64 {
        tokio::task::yield_now().await;
        let now = shared.queued.load(Ordering::Relaxed);
        let fresh = shared.state.lock().unwrap().fresh;
        if now == queued && fresh == 0 {
            return;
        }
        queued = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(max_message_bytes: usize) -> State {
        State {
            attempts: HashMap::new(),
            stopping: false,
            registered: true,
            granted: 1,
            server_protocol: 3,
            lease_ttl: None,
            max_message_bytes,
            frame: 0,
            fresh: 0,
        }
    }

    #[test]
    fn long_reports_are_cut_saying_how_long_they_were() {
        let text = "é".repeat(10_000);
        let cut = wire_text(&state(DEFAULT_MAX_MESSAGE_BYTES), &text);
        assert!(
            cut.ends_with("... (cut: 10,000 characters)"),
            "{}",
            &cut[cut.len() - 40..]
        );
        assert_eq!(cut.chars().count(), MAX_REPORT_CHARS);
        let small = wire_text(&state(OUTPUT_HEADROOM + 100), &"x".repeat(500));
        assert!(
            small.len() <= 100 && small.ends_with("(cut: 500 characters)"),
            "{small}"
        );
    }

    #[test]
    fn batched_frames_stay_within_the_limit() {
        let complete = |lease: u64, bytes: usize| pb::WorkerMessage {
            msg: Some(WorkerMsg::Complete(pb::Complete {
                lease,
                output: vec![b'x'; bytes],
                content_type: String::new(),
            })),
        };
        let messages: Vec<_> = (1..=10)
            .map(|i| complete(i, 100))
            .chain([complete(11, 5000)])
            .collect();
        let limit = 4 * (messages[0].encoded_len() + FRAMING_BYTES);
        let mut wire = encode(messages.clone().into_iter(), Some(limit));
        let mut frames = Vec::new();
        while !wire.is_empty() {
            let length = u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize;
            let frame = wire.split_to(5 + length).split_off(5);
            frames.push(pb::WorkerBatch::decode(frame.freeze()).unwrap().messages);
        }
        let sizes: Vec<usize> = frames.iter().map(Vec::len).collect();
        assert_eq!(sizes, [4, 4, 2, 1]); // the large one alone
        assert_eq!(frames.concat(), messages); // all of them, in order
        let plain = encode(messages.clone().into_iter(), None);
        let expected: usize = messages.iter().map(|m| 5 + m.encoded_len()).sum();
        assert_eq!(plain.len(), expected); // one gRPC message each
    }

    #[test]
    fn outcomes() {
        let s = state(DEFAULT_MAX_MESSAGE_BYTES);
        match outcome(
            &s,
            7,
            Err(TaskError::retry_after("later", Duration::from_millis(400))),
        ) {
            WorkerMsg::Fail(f) => assert_eq!((f.lease, f.permanent, f.retry_after_s), (7, false, Some(0.4))),
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(outcome(&s, 7, Err(TaskError::reject("no"))), WorkerMsg::Nack(n) if n.reason == "no")
        );
        let old = State {
            server_protocol: 1,
            ..state(DEFAULT_MAX_MESSAGE_BYTES)
        };
        assert!(matches!(outcome(&old, 7, Err(TaskError::reject("no"))), WorkerMsg::Fail(f) if !f.permanent));
        let big = Bytes::from(vec![0u8; 5000]);
        assert!(matches!(outcome(&state(4096), 7, Ok(big)), WorkerMsg::Fail(f) if f.permanent));
        assert_eq!(format_duration(Duration::from_millis(300)), "300ms");
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
    }
}
