//! Gateway tests: the real router on SQLite + local storage and on PostgreSQL + S3.

mod harness;

mod files;
mod jobs;
mod lifecycle;
mod messages;
mod openapi;
mod programs;
mod scoped_access;
mod system;
mod visibility;
