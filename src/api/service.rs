//! What the endpoints do, one function per action (`jobs::run`, `programs::upload`,
//! `files::upload`, ...): each holds the whole flow of its action, its permission checks and
//! the compensation of a step that fails after another succeeded, and returns the typed answer
//! (`api::answers`). Handlers parse the request, call one of these and return what it returns.
//! Services never import handlers.

pub mod access;
pub mod files;
pub mod jobs;
pub mod programs;
