//! Progress on stderr: a bar with an ETA on a terminal, a plain line at
//! every tenth elsewhere (a CI log, a redirected run), nothing with
//! `--quiet`. stdout keeps only the report.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Off a terminal, the least time between two progress lines.
const MIN_BETWEEN_LINES: Duration = Duration::from_secs(1);

/// How far a long job is.
pub(crate) enum Progress {
    /// Nothing is shown.
    Quiet,
    /// A bar on a terminal.
    Bar(ProgressBar),
    /// Plain lines at every tenth.
    Lines {
        /// What is done ("replay trace.csv").
        what: String,
        /// Units in all.
        total: u64,
        /// The next tenth to print.
        next: u64,
        /// When it began.
        start: Instant,
        /// When a line was last printed (or the start).
        printed: Instant,
    },
}

impl Progress {
    /// Progress over `total` bytes of input.
    pub(crate) fn bytes(total: u64, what: &str, quiet: bool) -> Self {
        if quiet {
            return Self::Quiet;
        }
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:40}] {binary_bytes}/{binary_total_bytes} ({elapsed}, about {eta} left)",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_message(what.to_string());
            return Self::Bar(bar);
        }
        Self::Lines {
            what: what.to_string(),
            total: total.max(1),
            next: 1,
            start: Instant::now(),
            printed: Instant::now(),
        }
    }

    /// A step that shows no fraction (decoding a pickle whole).
    pub(crate) fn note(&self, message: &str) {
        match self {
            Self::Quiet => {}
            Self::Bar(bar) => bar.set_message(message.to_string()),
            Self::Lines { .. } => eprintln!("{message}"),
        }
    }

    /// `done` units of the total are done.
    pub(crate) fn set(&mut self, done: u64) {
        match self {
            Self::Quiet => {}
            Self::Bar(bar) => bar.set_position(done),
            Self::Lines {
                what,
                total,
                next,
                start,
                printed,
            } => {
                // The latest tenth reached, once: a job that jumps (a
                // pickle decoded whole) prints one line, not ten, and a
                // line at most a second, so a fast job prints none.
                let reached = (u128::from(done) * 10 / u128::from(*total)).min(10) as u64;
                if reached < *next {
                    return;
                }
                *next = reached + 1;
                if reached == 10 || printed.elapsed() < MIN_BETWEEN_LINES {
                    return;
                }
                *printed = Instant::now();
                let elapsed = start.elapsed().as_secs_f64();
                let left = elapsed * (10 - reached) as f64 / reached as f64;
                eprintln!(
                    "{what}: {}% ({elapsed:.1} s, about {left:.0} s left)",
                    reached * 10
                );
            }
        }
    }

    /// The job is done: the bar goes.
    pub(crate) fn finish(self) {
        if let Self::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}
