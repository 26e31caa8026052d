//! Job endpoints, one file per endpoint group, each holding its handlers (which parse the
//! request, call the flow beside them and answer), that flow and its request and answer types:
//! `run` (queue a job within the caller's active-job limit), `list` (the caller's jobs, a
//! provider's, one function's), `queue` (where the caller's unfinished jobs stand), `read` (one
//! job, its arguments, its trace), `result`, `stop`, `sub_status`, `events` and `runtime_jobs`.
//! Unknown jobs and jobs the caller may not see answer the same 404. A body sent to one job is
//! parsed once the job is found, the order in which the reference checks them.

pub mod events;
pub mod list;
pub mod queue;
pub mod read;
pub mod result;
pub mod run;
pub mod runtime_jobs;
pub mod stop;
pub mod sub_status;
