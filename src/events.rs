//! The outbound event stream: every job status move is published after it is committed. A
//! publisher failure is logged and dropped; it never blocks or undoes the move.

use std::sync::Arc;

use serde::Serialize;

/// One published status move.
#[derive(Debug, Clone, Serialize)]
pub struct StatusEvent {
    pub job_id: String,
    pub status: String,
    pub origin: String,
    pub context: String,
    pub created: String,
}

/// Where status moves go. Implementations must be quick; slow sinks should queue internally.
pub trait Publisher: Send + Sync {
    fn publish(&self, event: &StatusEvent) -> Result<(), String>;
}

/// The default sink: one structured log line per move (`target: gantry::events`).
pub struct LogPublisher;

impl Publisher for LogPublisher {
    fn publish(&self, event: &StatusEvent) -> Result<(), String> {
        tracing::info!(
            target: "gantry::events",
            job_id = %event.job_id,
            status = %event.status,
            origin = %event.origin,
            context = %event.context,
            "job status changed"
        );
        Ok(())
    }
}

/// Publishes, logging and dropping a failure.
pub fn publish(publisher: &Arc<dyn Publisher>, event: StatusEvent) {
    if let Err(error) = publisher.publish(&event) {
        tracing::warn!(job.id = %event.job_id, error = %error, "failed to publish a job status event; dropped");
    }
}
