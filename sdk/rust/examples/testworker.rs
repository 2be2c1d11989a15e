//! A Rust worker for cronoq's integration tests and benchmark (tests/integration/rustsdk.py):
//! run_worker with the options given as flags, stopped (drained) by SIGTERM, printing one JSON line on
//! stdout for each thing it did, so that a test can wait for them. It takes the same flags and payloads
//! as the Go SDK's test worker (sdk/go/internal/testworker):
//!
//!   {"do": "complete", "output": "..."}         returns output (default "attempt <n>")
//!   {"do": "retry", "after": 0.5}                TaskError::retry_after
//!   {"do": "permanent"} {"do": "error"}         TaskError::Permanent; TaskError::from_err
//!   {"do": "reject"} {"do": "cancel"}           TaskError::Reject; TaskError::Cancelled
//!   {"do": "panic"}                              panics
//!   {"do": "sleep", "seconds": 30}               waits that long, or until lease.cancel
//!   {"do": "sleep", "seconds": 30, "first": 1}   the same on attempt 1 only; later ones complete
//!
//! -backoff D is its initial reconnect backoff (default 50ms).
//! -threads N runs it on N tokio threads (1: the current-thread runtime; 0, the default: one per core).
//! With -reject every handler rejects its lease; with -noop every handler returns at once without
//! reading its payload. -noop -expect N is the benchmark's worker: after N tasks it drains, exits, and
//! prints the CPU it spent from its registration to its last task, as bench/worker.py does.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cronoq::worker::{run_worker, Lease, WorkerOptions, WorkerTls};
use cronoq::{CancellationToken, TaskError};
use serde_json::{json, Value};

fn emit(value: Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

fn cpu_seconds() -> f64 {
    // utime and stime of this process, in clock ticks (100 a second on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn parse_duration(text: &str) -> Duration {
    let (number, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(text.len()));
    let n: f64 = number.parse().unwrap_or_else(|_| panic!("a duration: {text}"));
    Duration::from_secs_f64(match unit {
        "ms" => n / 1000.0,
        "s" | "" => n,
        _ => panic!("a duration: {text}"),
    })
}

/// `-threads N` picks tokio's runtime: 1 is the current-thread one, where the handlers that finish
/// together all run before the writer takes the next frame; otherwise a multi-threaded one with N worker
/// threads (0, the default: one per core).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads = args
        .iter()
        .position(|a| a == "-threads")
        .map(|i| {
            args.get(i + 1)
                .and_then(|n| n.parse::<usize>().ok())
                .expect("-threads N")
        })
        .unwrap_or(0);
    let runtime = match threads {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        0 => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    };
    runtime.expect("the tokio runtime").block_on(serve(args));
}

async fn serve(args: Vec<String>) {
    let mut args = args.into_iter();
    let (mut target, mut pool, mut slots) = (String::new(), "default".to_string(), 1);
    let (mut name, mut drain, mut insecure, mut batches) = (String::new(), None, false, true);
    let (mut ca, mut cert, mut key, mut labels) = (None, None, None, String::new());
    let (mut noop, mut reject, mut expect, mut domain) = (false, false, 0i64, None);
    let mut backoff = Duration::from_millis(50);
    while let Some(flag) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "-target" => target = value(),
            "-pool" => pool = value(),
            "-slots" => slots = value().parse().expect("-slots"),
            "-name" => name = value(),
            "-drain" => drain = Some(parse_duration(&value())),
            "-insecure-redirect-http" => insecure = true,
            "-no-batches" => batches = false,
            "-ca" => ca = Some(value()),
            "-cert" => cert = Some(value()),
            "-key" => key = Some(value()),
            "-domain" => domain = Some(value()),
            "-labels" => labels = value(),
            "-noop" => noop = true,
            "-reject" => reject = true,
            "-expect" => expect = value().parse().expect("-expect"),
            "-threads" => drop(value()), // read by main
            "-backoff" => backoff = parse_duration(&value()),
            other => panic!("unknown flag {other}"),
        }
    }
    let mut opts = WorkerOptions::new(target, pool)
        .slots(slots)
        .name(name)
        .insecure_redirect_http(insecure)
        .batches(batches)
        .backoff(backoff, backoff.max(Duration::from_secs(1)));
    if let Ok(token) = std::env::var("CRONOQ_TOKEN") {
        if !token.is_empty() {
            opts = opts.token(token); // not a flag: it would show in ps
        }
    }
    if let Some(drain) = drain {
        opts = opts.drain_timeout(drain);
    }
    for pair in labels.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        opts = opts.label(k, v);
    }
    if let Some(ca) = ca {
        let read = |path: &str| std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        opts = opts.tls(WorkerTls {
            ca_pem: Some(read(&ca)),
            identity: cert.map(|c| (read(&c), read(&key.clone().expect("-key with -cert")))),
            domain,
        });
    }
    let stop = CancellationToken::new();
    let registered_cpu = Arc::new(Mutex::new(None::<f64>));
    let last_cpu = Arc::new(Mutex::new(0.0));
    let handled = Arc::new(AtomicI64::new(0));
    {
        let registered_cpu = registered_cpu.clone();
        opts = opts.on_registered(move |r| {
            registered_cpu.lock().unwrap().get_or_insert_with(cpu_seconds);
            emit(json!({
                "event": "registered", "worker_id": r.worker_id, "slots": r.slots, "batched": r.batched,
                "address": r.address, "lease_ttl": r.lease_ttl.map(|d| d.as_secs_f64()).unwrap_or(0.0),
            }));
        });
    }
    let signals = {
        let stop = stop.clone();
        async move {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM");
            let mut int = signal(SignalKind::interrupt()).expect("SIGINT");
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
                _ = stop.cancelled() => {}
            }
        }
    };
    let result = if noop {
        let (handled, last_cpu, stop) = (handled.clone(), last_cpu.clone(), stop.clone());
        run_worker(
            opts,
            move |_lease: Lease| {
                if handled.fetch_add(1, Ordering::SeqCst) + 1 == expect {
                    *last_cpu.lock().unwrap() = cpu_seconds();
                    stop.cancel();
                }
                async { Ok(Bytes::new()) }
            },
            signals,
        )
        .await
    } else if reject {
        run_worker(
            opts,
            |lease: Lease| async move {
                emit(json!({"event": "reject", "task": lease.task_id, "attempt": lease.attempt}));
                Err(TaskError::reject("not for me"))
            },
            signals,
        )
        .await
    } else {
        run_worker(opts, handle, signals).await
    };
    match result {
        Err(e) => {
            emit(json!({"event": "exit", "error": e.to_string(), "code": format!("{:?}", e.code)}));
            std::process::exit(1);
        }
        Ok(()) if expect > 0 => {
            let began = registered_cpu.lock().unwrap().unwrap_or(0.0);
            let cpu = *last_cpu.lock().unwrap() - began;
            emit(json!({"handled": handled.load(Ordering::SeqCst), "latencies": [], "cpu_s": cpu}));
        }
        Ok(()) => emit(json!({"event": "exit"})),
    }
}

async fn handle(lease: Lease) -> Result<Bytes, TaskError> {
    let instruction: Value = serde_json::from_slice(&lease.payload).map_err(TaskError::permanent)?;
    let field = |name: &str| instruction.get(name).cloned().unwrap_or(Value::Null);
    emit(json!({
        "event": "start", "task": lease.task_id, "attempt": lease.attempt, "lease": lease.lease,
        "do": field("do"), "timeout": lease.timeout.map(|d| d.as_secs_f64()).unwrap_or(0.0),
        "lease_ttl": lease.lease_ttl.map(|d| d.as_secs_f64()).unwrap_or(0.0), "pool": lease.pool,
        "kind": lease.kind, "key": lease.key, "priority": lease.priority, "tags": lease.tags,
    }));
    let mut what = field("do").as_str().unwrap_or("").to_string();
    if let Some(first) = field("first").as_u64() {
        if u64::from(lease.attempt) > first {
            what = "complete".into();
        }
    }
    match what.as_str() {
        "" | "complete" => {
            let output = field("output").as_str().map(String::from).unwrap_or_default();
            let output = if output.is_empty() {
                format!("attempt {}", lease.attempt)
            } else {
                output
            };
            Ok(Bytes::from(output))
        }
        "retry" => Err(TaskError::retry_after(
            format!("flaky {}", lease.attempt),
            Duration::from_secs_f64(field("after").as_f64().unwrap_or(0.0)),
        )),
        "permanent" => Err(TaskError::permanent("bad input")),
        "error" => Err(TaskError::from_err(format!("boom {}", lease.attempt))),
        "reject" => Err(TaskError::reject("not for me")),
        "cancel" => Err(TaskError::Cancelled),
        "panic" => panic!("kaboom {}", lease.attempt),
        "sleep" => {
            let seconds = field("seconds").as_f64().unwrap_or(0.0);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs_f64(seconds)) => {
                    emit(json!({"event": "slept", "task": lease.task_id, "attempt": lease.attempt}));
                    Ok(Bytes::from(format!("slept on attempt {}", lease.attempt)))
                }
                _ = lease.cancel.cancelled() => {
                    emit(json!({
                        "event": "ctx_done", "task": lease.task_id, "attempt": lease.attempt,
                        "err": "cancelled", "reason": lease.abort_reason(),
                    }));
                    Err(TaskError::from_err("cancelled"))
                }
            }
        }
        other => Err(TaskError::permanent(format!("unknown instruction {other:?}"))),
    }
}
