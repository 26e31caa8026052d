//! Gantry: a job gateway for user-uploaded functions, speaking the qiskit-serverless REST API.
//! See `ARCHITECTURE.md` in the design folder for the roles and the data flow.

pub mod api;
pub mod artifact;
pub mod auth;
pub mod cli;
pub mod db;
pub mod domain;
pub mod events;
pub mod launch;
pub mod runner;
pub mod storage;
