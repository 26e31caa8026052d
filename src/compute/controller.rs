//! The Kubernetes controller (`gantry controller`): drives each `FunctionJob` towards its spec.
//! What to build and what was observed are pure functions (`build`, `status`); the reconcile
//! that talks to the cluster, the database and storage around them comes next.

pub mod build;
pub mod status;
