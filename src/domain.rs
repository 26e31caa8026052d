//! Pure rules of the gateway: name sanitization, size labels, dependency and version checks,
//! argument-schema validation and function visibility. Nothing here does I/O; the API layer
//! calls these functions with values it has loaded.

pub mod admission;
pub mod dependencies;
pub mod event_data;
pub mod fair_share;
pub mod lifecycle;
pub mod logs;
pub mod names;
pub mod paging;
pub mod runtime_env;
pub mod schema;
pub mod sizes;
pub mod usage;
pub mod visibility;
