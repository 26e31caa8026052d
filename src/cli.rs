//! Command line: one `Args` per subcommand, each beside its role (`serve`, `admin`,
//! `launcher`; the database and storage flags with `db` and `storage`). Every flag also
//! reads an environment variable; the spec's names (`MAX_REQUEST_BODY_SIZE_MB`,
//! `SETTINGS_AUTH_MECHANISM`, ...) are kept, Gantry's own use the `GANTRY_` prefix.

use clap::{Parser, Subcommand};

use crate::admin::AdminArgs;
use crate::db::DatabaseArgs;
use crate::serve::ServeArgs;
use crate::telemetry::LogFormat;

#[derive(Debug, Parser)]
#[command(name = "gantry", version, about = "Job gateway for user-uploaded functions")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How log lines are written to stderr: `text` for people, `json` for a log collector (one
    /// object a line with timestamp, level, target, message, fields and the trace and span ids).
    #[arg(long, global = true, env = "GANTRY_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

impl Command {
    /// The service name of the process's spans (unless `OTEL_SERVICE_NAME` names another).
    pub fn service_name(&self) -> &'static str {
        match self {
            Command::Serve(_) => "gantry",
            Command::Gateway(_) => "gantry-gateway",
            Command::Controller(_) => "gantry-controller",
            Command::Launch(_) => "gantry-launcher",
            _ => "gantry-cli",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway with its embedded defaults (SQLite and a local directory under --data-dir).
    Serve(Box<ServeArgs>),
    /// The REST API with the Kubernetes backend: jobs become FunctionJob resources.
    Gateway(Box<crate::gateway::GatewayArgs>),
    /// The operator: runs FunctionJobs as pods, records their status and archives their logs.
    Controller(Box<crate::controller::ControllerArgs>),
    /// Apply database migrations and exit.
    Migrate(DatabaseArgs),
    /// Manage users, groups, providers and grants without SQL; delete old finished jobs (`gc`).
    Admin(Box<AdminArgs>),
    /// Run one job: unpack its artifact, run `python <entrypoint>`, ship result and logs. Started
    /// by the runner for each job, never by hand.
    Launch(Box<crate::launcher::LaunchArgs>),
    /// Print the FunctionJob CustomResourceDefinition (YAML) for `kubectl apply -f -`.
    Crd,
    /// Print the Kubernetes permissions each role uses (JSON: group, resource, verbs, scope),
    /// what the Helm chart's Roles grant.
    Rbac,
    /// Copy this executable to DESTINATION (executable): what a job pod's init container runs to
    /// give the job's image the launcher.
    PlaceLauncher { destination: std::path::PathBuf },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
