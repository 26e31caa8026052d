//! Gateway tests: the real router on SQLite + local storage and on PostgreSQL + S3.
//!
//! What the scenarios share comes first: the harness (a gateway on either backend), the
//! `eventually` wait, the doubles (the Kubernetes API server and the kubelet) and the
//! benchmarks (ignored tests run by `bench/`); the scenario modules follow.

mod eventually;
mod harness;

mod benches;
mod doubles;

mod auth;
mod big_indexes;
mod connections;
mod console;
mod controller;
mod db_faults;
mod docs;
mod e2e_kubernetes;
mod fault_guards;
mod files;
mod gpus;
mod idempotency;
mod isolation;
mod job_limits;
mod jobs;
mod kube_double_tests;
mod lifecycle;
mod log_order;
mod messages;
mod openapi;
mod openapi_drift;
mod pagination;
mod pod_endings;
mod programs;
mod queue_places;
mod reasons;
mod replicas;
mod retention;
mod runtime_stop;
mod scoped_access;
mod storage_faults;
mod streams;
mod system;
mod tenants;
mod traces;
mod trials;
mod usage;
mod usage_events;
mod visibility;
