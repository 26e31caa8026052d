//! Function endpoints, one file per endpoint group, each holding its handlers (which parse the
//! request, call the flow beside them and answer), that flow and its request and answer types:
//! `read` (list, get by title), `upload` (an upsert with the reference's merge rules, storing the
//! artifact and removing it again when the database write fails) and `validate` (argument
//! validation, which `jobs::run` shares).

pub mod read;
pub mod upload;
pub mod validate;
