//! `baton-controller`: the server (`serve`) and the operator commands.
//! Exit codes: 0 success, 1 invalid input or refused (errors on stderr as
//! `FILE:LINE:COL: message` where they have a position), 2 usage errors,
//! 3 `push` still pending after its wait, 4 `push` stored a pack that
//! targets no agent.

#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

mod args;
mod ca_cmd;
mod commands;
mod keys_cmd;
mod operator;
mod serve;

fn main() -> ExitCode {
    let args = args::Args::parse();
    let mut out = std::io::stdout();
    // Not locked for the whole run: `serve` logs to stderr from its worker
    // threads, which would wait forever on a lock held by this thread.
    let mut err = std::io::stderr();
    let code = commands::run(args.command, &mut out, &mut err);
    let _ = out.flush();
    ExitCode::from(code as u8)
}
