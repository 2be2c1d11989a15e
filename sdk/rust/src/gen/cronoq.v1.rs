// ------------------------------------------------------------------- tasks

/// Names a task by its numeric id or by its unique key.
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct TaskRef {
    #[prost(oneof="task_ref::Target", tags="1, 2")]
    pub target: ::core::option::Option<task_ref::Target>,
}
/// Nested message and enum types in `TaskRef`.
pub mod task_ref {
    #[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Target {
        #[prost(uint64, tag="1")]
        Id(u64),
        #[prost(string, tag="2")]
        Key(::prost::alloc::string::String),
    }
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Dep {
    #[prost(message, optional, tag="1")]
    pub target: ::core::option::Option<TaskRef>,
    #[prost(enumeration="EdgeCond", tag="2")]
    pub cond: i32,
}
/// Zero values mean "use the pool's policy" for the whole message when absent.
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RetryPolicy {
    #[prost(uint32, tag="1")]
    pub max_attempts: u32,
    #[prost(double, tag="2")]
    pub initial_backoff_s: f64,
    #[prost(double, tag="3")]
    pub multiplier: f64,
    #[prost(double, tag="4")]
    pub max_backoff_s: f64,
    #[prost(bool, tag="5")]
    pub jitter: bool,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct TaskSpec {
    #[prost(bytes="vec", tag="1")]
    pub payload: ::prost::alloc::vec::Vec<u8>,
    #[prost(string, tag="2")]
    pub content_type: ::prost::alloc::string::String,
    #[prost(string, tag="3")]
    pub kind: ::prost::alloc::string::String,
    #[prost(string, tag="4")]
    pub pool: ::prost::alloc::string::String,
    #[prost(enumeration="Priority", tag="5")]
    pub priority: i32,
    #[prost(string, tag="6")]
    pub key: ::prost::alloc::string::String,
    /// A soft deadline, relative or absolute; it raises urgency, never fails.
    #[prost(double, optional, tag="7")]
    pub deadline_in_s: ::core::option::Option<f64>,
    #[prost(int64, optional, tag="8")]
    pub deadline_unix_ns: ::core::option::Option<i64>,
    /// A fixed start, relative or absolute.
    #[prost(double, optional, tag="9")]
    pub start_in_s: ::core::option::Option<f64>,
    #[prost(int64, optional, tag="10")]
    pub start_unix_ns: ::core::option::Option<i64>,
    #[prost(double, optional, tag="11")]
    pub tolerance_s: ::core::option::Option<f64>,
    #[prost(enumeration="MissPolicy", tag="12")]
    pub on_miss: i32,
    #[prost(double, optional, tag="13")]
    pub duration_hint_s: ::core::option::Option<f64>,
    /// Limit for each attempt.
    #[prost(double, optional, tag="14")]
    pub timeout_s: ::core::option::Option<f64>,
    #[prost(message, optional, tag="15")]
    pub retry: ::core::option::Option<RetryPolicy>,
    #[prost(message, repeated, tag="16")]
    pub deps: ::prost::alloc::vec::Vec<Dep>,
    #[prost(map="string, uint32", tag="17")]
    pub resources: ::std::collections::HashMap<::prost::alloc::string::String, u32>,
    #[prost(map="string, string", tag="18")]
    pub tags: ::std::collections::HashMap<::prost::alloc::string::String, ::prost::alloc::string::String>,
    /// Worker labels the task requires.
    #[prost(map="string, string", tag="19")]
    pub labels: ::std::collections::HashMap<::prost::alloc::string::String, ::prost::alloc::string::String>,
    #[prost(string, tag="20")]
    pub tenant: ::prost::alloc::string::String,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct SubmitRequest {
    #[prost(message, optional, tag="1")]
    pub task: ::core::option::Option<TaskSpec>,
    #[prost(bool, tag="2")]
    pub wait: bool,
    #[prost(double, optional, tag="3")]
    pub wait_timeout_s: ::core::option::Option<f64>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct SubmitResponse {
    #[prost(uint64, tag="1")]
    pub id: u64,
    /// the key named an existing task, which is returned
    #[prost(bool, tag="2")]
    pub duplicate: bool,
    /// set when the request asked to wait
    #[prost(message, optional, tag="3")]
    pub result: ::core::option::Option<TaskResult>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct SubmitBatchRequest {
    #[prost(message, repeated, tag="1")]
    pub tasks: ::prost::alloc::vec::Vec<TaskSpec>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct SubmitBatchResponse {
    /// in request order
    #[prost(message, repeated, tag="1")]
    pub tasks: ::prost::alloc::vec::Vec<SubmitResponse>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct CancelRequest {
    #[prost(message, optional, tag="1")]
    pub task: ::core::option::Option<TaskRef>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct CancelResponse {
    /// false when the task had already finished
    #[prost(bool, tag="1")]
    pub cancelled: bool,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct GetRequest {
    #[prost(message, optional, tag="1")]
    pub task: ::core::option::Option<TaskRef>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct TaskInfo {
    #[prost(uint64, tag="1")]
    pub id: u64,
    #[prost(enumeration="TaskStatus", tag="2")]
    pub status: i32,
    #[prost(string, tag="3")]
    pub pool: ::prost::alloc::string::String,
    #[prost(string, tag="4")]
    pub key: ::prost::alloc::string::String,
    #[prost(string, tag="5")]
    pub kind: ::prost::alloc::string::String,
    #[prost(uint32, tag="6")]
    pub attempt: u32,
    #[prost(uint32, tag="7")]
    pub max_attempts: u32,
    #[prost(int64, optional, tag="8")]
    pub created_unix_ns: ::core::option::Option<i64>,
    #[prost(int64, optional, tag="9")]
    pub started_unix_ns: ::core::option::Option<i64>,
    #[prost(int64, optional, tag="10")]
    pub finished_unix_ns: ::core::option::Option<i64>,
    #[prost(string, tag="11")]
    pub message: ::prost::alloc::string::String,
    #[prost(bool, tag="12")]
    pub output_available: bool,
    #[prost(string, tag="13")]
    pub tenant: ::prost::alloc::string::String,
    #[prost(enumeration="Priority", tag="14")]
    pub priority: i32,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ListTasksRequest {
    #[prost(string, repeated, tag="1")]
    pub pools: ::prost::alloc::vec::Vec<::prost::alloc::string::String>,
    #[prost(enumeration="TaskStatus", repeated, tag="2")]
    pub statuses: ::prost::alloc::vec::Vec<i32>,
    /// return ids greater than this
    #[prost(uint64, tag="3")]
    pub after: u64,
    #[prost(uint32, tag="4")]
    pub limit: u32,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ListTasksResponse {
    #[prost(message, repeated, tag="1")]
    pub tasks: ::prost::alloc::vec::Vec<TaskInfo>,
    /// 0 on the last page
    #[prost(uint64, tag="2")]
    pub next_after: u64,
    #[prost(string, repeated, tag="3")]
    pub unavailable_shards: ::prost::alloc::vec::Vec<::prost::alloc::string::String>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct TaskResult {
    #[prost(uint64, tag="1")]
    pub id: u64,
    #[prost(enumeration="TaskStatus", tag="2")]
    pub status: i32,
    #[prost(bytes="vec", optional, tag="3")]
    pub output: ::core::option::Option<::prost::alloc::vec::Vec<u8>>,
    #[prost(string, tag="4")]
    pub message: ::prost::alloc::string::String,
    #[prost(bool, tag="5")]
    pub output_available: bool,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WaitRequest {
    #[prost(message, optional, tag="1")]
    pub task: ::core::option::Option<TaskRef>,
    #[prost(double, optional, tag="2")]
    pub timeout_s: ::core::option::Option<f64>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WatchRequest {
    #[prost(string, repeated, tag="1")]
    pub pools: ::prost::alloc::vec::Vec<::prost::alloc::string::String>,
    #[prost(uint64, repeated, tag="2")]
    pub ids: ::prost::alloc::vec::Vec<u64>,
    #[prost(string, repeated, tag="3")]
    pub keys: ::prost::alloc::vec::Vec<::prost::alloc::string::String>,
    #[prost(bool, tag="4")]
    pub all_transitions: bool,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct StatusEvent {
    #[prost(uint64, tag="1")]
    pub id: u64,
    #[prost(string, tag="2")]
    pub pool: ::prost::alloc::string::String,
    #[prost(string, tag="3")]
    pub key: ::prost::alloc::string::String,
    #[prost(enumeration="TaskStatus", tag="4")]
    pub status: i32,
    #[prost(uint32, tag="5")]
    pub attempt: u32,
    #[prost(int64, tag="6")]
    pub at_unix_ns: i64,
    #[prost(string, tag="7")]
    pub message: ::prost::alloc::string::String,
}
// ------------------------------------------------------------------ workers

#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Register {
    #[prost(string, tag="1")]
    pub pool: ::prost::alloc::string::String,
    #[prost(uint32, tag="2")]
    pub slots: u32,
    #[prost(string, tag="3")]
    pub worker_name: ::prost::alloc::string::String,
    #[prost(uint32, tag="4")]
    pub protocol_version: u32,
    #[prost(map="string, string", tag="5")]
    pub labels: ::std::collections::HashMap<::prost::alloc::string::String, ::prost::alloc::string::String>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Heartbeat {
    #[prost(uint64, tag="1")]
    pub lease: u64,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Complete {
    #[prost(uint64, tag="1")]
    pub lease: u64,
    #[prost(bytes="vec", tag="2")]
    pub output: ::prost::alloc::vec::Vec<u8>,
    #[prost(string, tag="3")]
    pub content_type: ::prost::alloc::string::String,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Fail {
    #[prost(uint64, tag="1")]
    pub lease: u64,
    #[prost(string, tag="2")]
    pub message: ::prost::alloc::string::String,
    #[prost(bool, tag="3")]
    pub permanent: bool,
    #[prost(double, optional, tag="4")]
    pub retry_after_s: ::core::option::Option<f64>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct SetSlots {
    #[prost(uint32, tag="1")]
    pub slots: u32,
}
/// Hands a lease back unrun.
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Nack {
    #[prost(uint64, tag="1")]
    pub lease: u64,
    #[prost(string, tag="2")]
    pub reason: ::prost::alloc::string::String,
}
/// Ends the task as cancelled.
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Cancelled {
    #[prost(uint64, tag="1")]
    pub lease: u64,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WorkerMessage {
    #[prost(oneof="worker_message::Msg", tags="1, 2, 3, 4, 5, 6, 7")]
    pub msg: ::core::option::Option<worker_message::Msg>,
}
/// Nested message and enum types in `WorkerMessage`.
pub mod worker_message {
    #[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Msg {
        #[prost(message, tag="1")]
        Register(super::Register),
        #[prost(message, tag="2")]
        Heartbeat(super::Heartbeat),
        #[prost(message, tag="3")]
        Complete(super::Complete),
        #[prost(message, tag="4")]
        Fail(super::Fail),
        #[prost(message, tag="5")]
        SetSlots(super::SetSlots),
        #[prost(message, tag="6")]
        Nack(super::Nack),
        #[prost(message, tag="7")]
        Cancelled(super::Cancelled),
    }
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Registered {
    #[prost(uint64, tag="1")]
    pub worker_id: u64,
    #[prost(double, optional, tag="2")]
    pub lease_ttl_s: ::core::option::Option<f64>,
    /// granted, at most what was asked for
    #[prost(uint32, tag="3")]
    pub slots: u32,
    #[prost(uint32, tag="4")]
    pub protocol_version: u32,
    #[prost(uint64, tag="5")]
    pub max_message_bytes: u64,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Lease {
    #[prost(uint64, tag="1")]
    pub lease: u64,
    #[prost(uint64, tag="2")]
    pub task_id: u64,
    #[prost(uint32, tag="3")]
    pub attempt: u32,
    #[prost(bytes="vec", tag="4")]
    pub payload: ::prost::alloc::vec::Vec<u8>,
    #[prost(string, tag="5")]
    pub content_type: ::prost::alloc::string::String,
    #[prost(string, tag="6")]
    pub kind: ::prost::alloc::string::String,
    #[prost(string, tag="7")]
    pub key: ::prost::alloc::string::String,
    #[prost(map="string, string", tag="8")]
    pub tags: ::std::collections::HashMap<::prost::alloc::string::String, ::prost::alloc::string::String>,
    #[prost(double, optional, tag="9")]
    pub timeout_s: ::core::option::Option<f64>,
    #[prost(int64, optional, tag="10")]
    pub deadline_unix_ns: ::core::option::Option<i64>,
    #[prost(string, tag="11")]
    pub pool: ::prost::alloc::string::String,
    #[prost(enumeration="Priority", tag="12")]
    pub priority: i32,
    #[prost(double, optional, tag="13")]
    pub lease_ttl_s: ::core::option::Option<f64>,
}
/// Stop this attempt; its slot is already free.
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Abort {
    #[prost(uint64, tag="1")]
    pub lease: u64,
    #[prost(string, tag="2")]
    pub reason: ::prost::alloc::string::String,
}
/// Reconnect; at once when not_leader is set.
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Shutdown {
    #[prost(string, tag="1")]
    pub reason: ::prost::alloc::string::String,
    #[prost(bool, tag="2")]
    pub not_leader: bool,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ServerMessage {
    #[prost(oneof="server_message::Msg", tags="1, 2, 3, 4")]
    pub msg: ::core::option::Option<server_message::Msg>,
}
/// Nested message and enum types in `ServerMessage`.
pub mod server_message {
    #[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Msg {
        #[prost(message, tag="1")]
        Registered(super::Registered),
        #[prost(message, tag="2")]
        Lease(super::Lease),
        #[prost(message, tag="3")]
        Abort(super::Abort),
        #[prost(message, tag="4")]
        Shutdown(super::Shutdown),
    }
}
// ------------------------------------------------------------------- admin

#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Empty {
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct PoolSnapshot {
    #[prost(string, tag="1")]
    pub name: ::prost::alloc::string::String,
    #[prost(uint32, tag="2")]
    pub capacity: u32,
    #[prost(uint32, tag="3")]
    pub busy: u32,
    #[prost(uint32, tag="4")]
    pub held: u32,
    #[prost(uint32, tag="5")]
    pub desired: u32,
    /// critical, high, normal, low
    #[prost(uint64, repeated, tag="6")]
    pub pending_by_class: ::prost::alloc::vec::Vec<u64>,
    #[prost(uint64, tag="7")]
    pub reservations: u64,
    #[prost(uint64, tag="8")]
    pub dispatched: u64,
    #[prost(uint64, tag="9")]
    pub succeeded: u64,
    #[prost(uint64, tag="10")]
    pub failed: u64,
    #[prost(double, tag="11")]
    pub priority_adherence: f64,
    #[prost(double, tag="12")]
    pub fixed_start_hit_rate: f64,
    #[prost(double, tag="13")]
    pub utilization: f64,
    #[prost(double, tag="14")]
    pub schedule_efficiency: f64,
    #[prost(double, tag="15")]
    pub wait_p50_s: f64,
    #[prost(double, tag="16")]
    pub wait_p90_s: f64,
    #[prost(double, tag="17")]
    pub wait_p99_s: f64,
    #[prost(double, tag="18")]
    pub cost: f64,
    #[prost(uint64, tag="19")]
    pub workers_connected: u64,
    #[prost(message, repeated, tag="20")]
    pub groups: ::prost::alloc::vec::Vec<WorkerGroup>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WorkerGroup {
    #[prost(map="string, string", tag="1")]
    pub labels: ::std::collections::HashMap<::prost::alloc::string::String, ::prost::alloc::string::String>,
    #[prost(uint32, tag="2")]
    pub capacity: u32,
    #[prost(uint32, tag="3")]
    pub busy: u32,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Totals {
    #[prost(uint64, tag="1")]
    pub submitted: u64,
    #[prost(uint64, tag="2")]
    pub dispatched: u64,
    #[prost(uint64, tag="3")]
    pub succeeded: u64,
    #[prost(uint64, tag="4")]
    pub failed: u64,
    #[prost(uint64, tag="5")]
    pub dead_lettered: u64,
    #[prost(uint64, tag="6")]
    pub cancelled: u64,
    #[prost(uint64, tag="7")]
    pub skipped: u64,
    #[prost(uint64, tag="8")]
    pub missed: u64,
    #[prost(uint64, tag="9")]
    pub shed: u64,
    #[prost(uint64, tag="10")]
    pub retries: u64,
    #[prost(uint64, tag="11")]
    pub timeouts: u64,
    #[prost(uint64, tag="12")]
    pub lease_expiries: u64,
    #[prost(uint64, tag="13")]
    pub stale_completions: u64,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct SnapshotResponse {
    #[prost(message, repeated, tag="1")]
    pub pools: ::prost::alloc::vec::Vec<PoolSnapshot>,
    #[prost(uint64, tag="2")]
    pub live_tasks: u64,
    #[prost(uint64, tag="3")]
    pub running: u64,
    #[prost(uint64, tag="4")]
    pub pending: u64,
    #[prost(message, optional, tag="5")]
    pub totals: ::core::option::Option<Totals>,
    #[prost(uint64, tag="6")]
    pub workers_connected: u64,
    #[prost(string, repeated, tag="7")]
    pub unavailable_shards: ::prost::alloc::vec::Vec<::prost::alloc::string::String>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RecurringRequest {
    #[prost(string, tag="1")]
    pub name: ::prost::alloc::string::String,
    #[prost(string, tag="2")]
    pub cron: ::prost::alloc::string::String,
    #[prost(string, tag="3")]
    pub tz: ::prost::alloc::string::String,
    #[prost(message, optional, tag="4")]
    pub template: ::core::option::Option<TaskSpec>,
    #[prost(enumeration="Overlap", tag="6")]
    pub overlap: i32,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RemoveRecurringRequest {
    #[prost(string, tag="1")]
    pub name: ::prost::alloc::string::String,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RemoveRecurringResponse {
    #[prost(bool, tag="1")]
    pub removed: bool,
}
/// BatchedWorkers.Work: one or more messages each way, never none.
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WorkerBatch {
    #[prost(message, repeated, tag="1")]
    pub messages: ::prost::alloc::vec::Vec<WorkerMessage>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ServerBatch {
    #[prost(message, repeated, tag="1")]
    pub messages: ::prost::alloc::vec::Vec<ServerMessage>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WorkerInfo {
    #[prost(uint64, tag="1")]
    pub id: u64,
    #[prost(string, tag="2")]
    pub name: ::prost::alloc::string::String,
    #[prost(string, tag="3")]
    pub pool: ::prost::alloc::string::String,
    #[prost(map="string, string", tag="4")]
    pub labels: ::std::collections::HashMap<::prost::alloc::string::String, ::prost::alloc::string::String>,
    #[prost(uint32, tag="5")]
    pub slots: u32,
    #[prost(uint32, tag="6")]
    pub busy: u32,
    #[prost(int64, tag="7")]
    pub connected_unix_ns: i64,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ListWorkersResponse {
    #[prost(message, repeated, tag="1")]
    pub workers: ::prost::alloc::vec::Vec<WorkerInfo>,
    #[prost(string, repeated, tag="2")]
    pub unavailable_shards: ::prost::alloc::vec::Vec<::prost::alloc::string::String>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RecurringInfo {
    #[prost(string, tag="1")]
    pub name: ::prost::alloc::string::String,
    #[prost(string, tag="2")]
    pub cron: ::prost::alloc::string::String,
    #[prost(string, tag="3")]
    pub tz: ::prost::alloc::string::String,
    #[prost(string, tag="4")]
    pub pool: ::prost::alloc::string::String,
    #[prost(string, tag="5")]
    pub kind: ::prost::alloc::string::String,
    #[prost(enumeration="Overlap", tag="6")]
    pub overlap: i32,
    #[prost(int64, optional, tag="7")]
    pub next_unix_ns: ::core::option::Option<i64>,
    #[prost(uint64, optional, tag="8")]
    pub last_task_id: ::core::option::Option<u64>,
}
#[allow(clippy::derive_partial_eq_without_eq)]
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ListRecurringResponse {
    #[prost(message, repeated, tag="1")]
    pub schedules: ::prost::alloc::vec::Vec<RecurringInfo>,
    #[prost(string, repeated, tag="2")]
    pub unavailable_shards: ::prost::alloc::vec::Vec<::prost::alloc::string::String>,
}
// ------------------------------------------------------------------- enums

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum Priority {
    /// treated as NORMAL
    Unspecified = 0,
    Critical = 1,
    High = 2,
    Normal = 3,
    Low = 4,
}
impl Priority {
    /// String value of the enum field names used in the ProtoBuf definition.
    ///
    /// The values are not transformed in any way and thus are considered stable
    /// (if the ProtoBuf definition does not change) and safe for programmatic use.
    pub fn as_str_name(&self) -> &'static str {
        match self {
            Priority::Unspecified => "PRIORITY_UNSPECIFIED",
            Priority::Critical => "PRIORITY_CRITICAL",
            Priority::High => "PRIORITY_HIGH",
            Priority::Normal => "PRIORITY_NORMAL",
            Priority::Low => "PRIORITY_LOW",
        }
    }
    /// Creates an enum from field names used in the ProtoBuf definition.
    pub fn from_str_name(value: &str) -> ::core::option::Option<Self> {
        match value {
            "PRIORITY_UNSPECIFIED" => Some(Self::Unspecified),
            "PRIORITY_CRITICAL" => Some(Self::Critical),
            "PRIORITY_HIGH" => Some(Self::High),
            "PRIORITY_NORMAL" => Some(Self::Normal),
            "PRIORITY_LOW" => Some(Self::Low),
            _ => None,
        }
    }
}
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum TaskStatus {
    Unspecified = 0,
    /// waiting for dependencies
    Blocked = 1,
    /// waiting for a fixed start time
    Scheduled = 2,
    /// queued, eligible for dispatch
    Ready = 3,
    /// an attempt holds a lease
    Running = 4,
    /// backing off before the next attempt
    Retrying = 5,
    Succeeded = 6,
    /// permanent failure
    Failed = 7,
    /// retries used up
    DeadLettered = 8,
    Cancelled = 9,
    /// a dependency can no longer be met
    Skipped = 10,
    /// fixed start missed with on_miss = skip
    Missed = 11,
    /// evicted under overload
    Shed = 12,
}
impl TaskStatus {
    /// String value of the enum field names used in the ProtoBuf definition.
    ///
    /// The values are not transformed in any way and thus are considered stable
    /// (if the ProtoBuf definition does not change) and safe for programmatic use.
    pub fn as_str_name(&self) -> &'static str {
        match self {
            TaskStatus::Unspecified => "TASK_STATUS_UNSPECIFIED",
            TaskStatus::Blocked => "TASK_STATUS_BLOCKED",
            TaskStatus::Scheduled => "TASK_STATUS_SCHEDULED",
            TaskStatus::Ready => "TASK_STATUS_READY",
            TaskStatus::Running => "TASK_STATUS_RUNNING",
            TaskStatus::Retrying => "TASK_STATUS_RETRYING",
            TaskStatus::Succeeded => "TASK_STATUS_SUCCEEDED",
            TaskStatus::Failed => "TASK_STATUS_FAILED",
            TaskStatus::DeadLettered => "TASK_STATUS_DEAD_LETTERED",
            TaskStatus::Cancelled => "TASK_STATUS_CANCELLED",
            TaskStatus::Skipped => "TASK_STATUS_SKIPPED",
            TaskStatus::Missed => "TASK_STATUS_MISSED",
            TaskStatus::Shed => "TASK_STATUS_SHED",
        }
    }
    /// Creates an enum from field names used in the ProtoBuf definition.
    pub fn from_str_name(value: &str) -> ::core::option::Option<Self> {
        match value {
            "TASK_STATUS_UNSPECIFIED" => Some(Self::Unspecified),
            "TASK_STATUS_BLOCKED" => Some(Self::Blocked),
            "TASK_STATUS_SCHEDULED" => Some(Self::Scheduled),
            "TASK_STATUS_READY" => Some(Self::Ready),
            "TASK_STATUS_RUNNING" => Some(Self::Running),
            "TASK_STATUS_RETRYING" => Some(Self::Retrying),
            "TASK_STATUS_SUCCEEDED" => Some(Self::Succeeded),
            "TASK_STATUS_FAILED" => Some(Self::Failed),
            "TASK_STATUS_DEAD_LETTERED" => Some(Self::DeadLettered),
            "TASK_STATUS_CANCELLED" => Some(Self::Cancelled),
            "TASK_STATUS_SKIPPED" => Some(Self::Skipped),
            "TASK_STATUS_MISSED" => Some(Self::Missed),
            "TASK_STATUS_SHED" => Some(Self::Shed),
            _ => None,
        }
    }
}
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum EdgeCond {
    /// treated as ON_SUCCESS
    Unspecified = 0,
    OnSuccess = 1,
    OnComplete = 2,
    OnFailure = 3,
}
impl EdgeCond {
    /// String value of the enum field names used in the ProtoBuf definition.
    ///
    /// The values are not transformed in any way and thus are considered stable
    /// (if the ProtoBuf definition does not change) and safe for programmatic use.
    pub fn as_str_name(&self) -> &'static str {
        match self {
            EdgeCond::Unspecified => "EDGE_COND_UNSPECIFIED",
            EdgeCond::OnSuccess => "EDGE_COND_ON_SUCCESS",
            EdgeCond::OnComplete => "EDGE_COND_ON_COMPLETE",
            EdgeCond::OnFailure => "EDGE_COND_ON_FAILURE",
        }
    }
    /// Creates an enum from field names used in the ProtoBuf definition.
    pub fn from_str_name(value: &str) -> ::core::option::Option<Self> {
        match value {
            "EDGE_COND_UNSPECIFIED" => Some(Self::Unspecified),
            "EDGE_COND_ON_SUCCESS" => Some(Self::OnSuccess),
            "EDGE_COND_ON_COMPLETE" => Some(Self::OnComplete),
            "EDGE_COND_ON_FAILURE" => Some(Self::OnFailure),
            _ => None,
        }
    }
}
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum MissPolicy {
    /// treated as RUN_LATE
    Unspecified = 0,
    RunLate = 1,
    Skip = 2,
    Fail = 3,
}
impl MissPolicy {
    /// String value of the enum field names used in the ProtoBuf definition.
    ///
    /// The values are not transformed in any way and thus are considered stable
    /// (if the ProtoBuf definition does not change) and safe for programmatic use.
    pub fn as_str_name(&self) -> &'static str {
        match self {
            MissPolicy::Unspecified => "MISS_POLICY_UNSPECIFIED",
            MissPolicy::RunLate => "MISS_POLICY_RUN_LATE",
            MissPolicy::Skip => "MISS_POLICY_SKIP",
            MissPolicy::Fail => "MISS_POLICY_FAIL",
        }
    }
    /// Creates an enum from field names used in the ProtoBuf definition.
    pub fn from_str_name(value: &str) -> ::core::option::Option<Self> {
        match value {
            "MISS_POLICY_UNSPECIFIED" => Some(Self::Unspecified),
            "MISS_POLICY_RUN_LATE" => Some(Self::RunLate),
            "MISS_POLICY_SKIP" => Some(Self::Skip),
            "MISS_POLICY_FAIL" => Some(Self::Fail),
            _ => None,
        }
    }
}
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum Overlap {
    /// treated as SKIP
    Unspecified = 0,
    Skip = 1,
    Allow = 2,
    Queue = 3,
    QueueOnSuccess = 4,
}
impl Overlap {
    /// String value of the enum field names used in the ProtoBuf definition.
    ///
    /// The values are not transformed in any way and thus are considered stable
    /// (if the ProtoBuf definition does not change) and safe for programmatic use.
    pub fn as_str_name(&self) -> &'static str {
        match self {
            Overlap::Unspecified => "OVERLAP_UNSPECIFIED",
            Overlap::Skip => "OVERLAP_SKIP",
            Overlap::Allow => "OVERLAP_ALLOW",
            Overlap::Queue => "OVERLAP_QUEUE",
            Overlap::QueueOnSuccess => "OVERLAP_QUEUE_ON_SUCCESS",
        }
    }
    /// Creates an enum from field names used in the ProtoBuf definition.
    pub fn from_str_name(value: &str) -> ::core::option::Option<Self> {
        match value {
            "OVERLAP_UNSPECIFIED" => Some(Self::Unspecified),
            "OVERLAP_SKIP" => Some(Self::Skip),
            "OVERLAP_ALLOW" => Some(Self::Allow),
            "OVERLAP_QUEUE" => Some(Self::Queue),
            "OVERLAP_QUEUE_ON_SUCCESS" => Some(Self::QueueOnSuccess),
            _ => None,
        }
    }
}
