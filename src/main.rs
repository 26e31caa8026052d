use clap::Parser;
use gantry::cli::{Cli, Command};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Serve(args) => args.run().await,
        Command::Gateway(args) => args.run().await,
        Command::Controller(args) => args.run().await,
        Command::Migrate(args) => {
            args.open().await?;
            println!("migrations applied to {}", gantry::db::redact(&args.url()));
            Ok(())
        }
        Command::Admin(args) => (*args).run().await,
        Command::PlaceLauncher { destination } => {
            gantry::launcher::place_launcher(&destination)?;
            println!("launcher placed at {}", destination.display());
            Ok(())
        }
        Command::Crd => {
            print!("{}", gantry::crd::crd_yaml());
            Ok(())
        }
        Command::Rbac => {
            println!("{:#}", gantry::compute::rbac::document());
            Ok(())
        }
        Command::Launch(args) => {
            let code = (*args).run().await?;
            std::process::exit(code);
        }
    }
}
