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
fn main() -> std::process::ExitCode {
    cli::main()
}

/// Under the loom cfg only the library's models are built.
#[cfg(streamalloc_loom)]
fn main() {}
