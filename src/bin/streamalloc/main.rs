//! `streamalloc`: simulate an inference server on the service, replay real
//! allocation traces, convert between trace formats, and plot memory over
//! time. `streamalloc --help` explains every option.

#[cfg(not(streamalloc_loom))]
mod cli;
#[cfg(not(streamalloc_loom))]
mod output;
#[cfg(not(streamalloc_loom))]
mod progress;
#[cfg(not(streamalloc_loom))]
mod replay_cmd;
#[cfg(not(streamalloc_loom))]
mod simulate_cmd;

#[cfg(not(streamalloc_loom))]
fn main() -> std::process::ExitCode {
    use clap::Parser;
    use cli::{Cli, Command, EXIT_DOES_NOT_FIT, Outcome};
    use std::process::ExitCode;

    let result = match Cli::parse().command {
        Command::Simulate(args) => simulate_cmd::simulate(args).map(|()| Outcome::Done),
        Command::Replay(args) => replay_cmd::replay(args),
        Command::Convert(args) => replay_cmd::convert(args).map(|()| Outcome::Done),
    };
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::DoesNotFit) => ExitCode::from(EXIT_DOES_NOT_FIT),
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Under the loom cfg only the library's models are built.
#[cfg(streamalloc_loom)]
fn main() {}
