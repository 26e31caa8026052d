//! Gantry: a job gateway for user-uploaded functions, speaking the qiskit-serverless REST API.
//! See `docs/architecture.md` for the layout and `docs/kubernetes.md` for the roles on a cluster.

#![recursion_limit = "256"]

pub mod admin;
pub mod api;
pub mod artifact;
pub mod auth;
pub mod cli;
pub mod compute;
pub mod controller;
pub mod crd;
pub mod db;
pub mod domain;
pub mod events;
pub mod follow;
pub mod gateway;
pub mod http;
pub mod launcher;
pub mod ops;
pub mod retention;
pub mod secrets;
pub mod serve;
pub mod shared;
pub mod storage;
pub mod telemetry;
