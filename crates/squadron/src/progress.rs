//! Progress of long work for a person at a terminal: one line on stderr, redrawn in place,
//! with what is under way and the time elapsed (`indicatif`). Nothing is drawn when stderr is
//! not a terminal or the output is `--output json`, so scripts and log collectors see only
//! the result.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::OutputFormat;

/// How often the line is redrawn (the elapsed time ticks on its own).
const PROGRESS_TICK_MS: u64 = 200;

#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A spinner saying `message`, for output in `out`.
    pub fn start(out: OutputFormat, message: impl Into<String>) -> Self {
        if !Self::shown(out) {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template("{spinner} {msg} · {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(style);
        bar.set_message(message.into());
        bar.enable_steady_tick(Duration::from_millis(PROGRESS_TICK_MS));
        Progress { bar: Some(bar) }
    }

    fn shown(out: OutputFormat) -> bool {
        out != OutputFormat::Json && std::io::stderr().is_terminal()
    }

    /// What is under way now.
    pub fn say(&self, message: impl Into<String>) {
        if let Some(bar) = &self.bar {
            bar.set_message(message.into());
        }
    }

    /// Leaves `message` and the elapsed time as a line of its own, above what follows.
    pub fn finish(self, message: impl Into<String>) {
        if let Some(bar) = &self.bar {
            bar.finish_with_message(message.into());
            // indicatif leaves the cursor at the end of the finished line.
            eprintln!();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            if !bar.is_finished() {
                bar.finish_and_clear();
            }
        }
    }
}
