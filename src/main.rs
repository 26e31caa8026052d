use clap::Parser;
use gantry::cli::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Cli { command, log_format } = Cli::parse();
    let telemetry = gantry::telemetry::init(command.service_name(), log_format);
    let ended = run(command).await;
    // The last spans (a launcher's most of all) are sent before the process ends.
    telemetry.shutdown().await;
    match ended {
        Ok(Some(code)) => std::process::exit(code),
        Ok(None) => Ok(()),
        Err(error) => Err(error),
    }
}

/// Runs the subcommand; Some(code) is the exit code a launcher ends with.
async fn run(command: Command) -> anyhow::Result<Option<i32>> {
    match command {
        Command::Serve(args) => args.run().await?,
        Command::Gateway(args) => args.run().await?,
        Command::Controller(args) => args.run().await?,
        Command::Migrate(args) => {
            args.open().await?;
            println!("migrations applied to {}", gantry::db::redact(&args.url()));
        }
        Command::Admin(args) => (*args).run().await?,
        Command::PlaceLauncher { destination } => {
            gantry::launcher::place_launcher(&destination)?;
            println!("launcher placed at {}", destination.display());
        }
        Command::Crd => print!("{}", gantry::crd::crd_yaml()),
        Command::Rbac => println!("{:#}", gantry::compute::rbac::document()),
        Command::Launch(args) => return Ok(Some((*args).run().await?)),
    }
    Ok(None)
}
