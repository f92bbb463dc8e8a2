//! `baton-controller`: operator commands. Exit codes: 0 success, 1 invalid
//! input (errors on stderr as `FILE:LINE:COL: message`), 2 usage errors.

#![forbid(unsafe_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use baton_controller::cli;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "baton-controller",
    version,
    about = "baton controller: validate, plan and (later) push instruction packs"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate pack files; print each error as FILE:LINE:COL: message.
    Validate {
        /// Pack files (YAML).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Show the next firing instants of a pack.
    Plan {
        /// Pack file (YAML).
        file: PathBuf,
        /// Plan strictly after this RFC 3339 instant (also the acceptance time).
        #[arg(long)]
        from: String,
        /// How many firings in total.
        #[arg(long, default_value_t = 20)]
        count: usize,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of the pack language (for editors).
    Schema,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    let code = match args.command {
        Command::Validate { files } => cli::validate(&files, &mut out, &mut err),
        Command::Plan {
            file,
            from,
            count,
            json,
        } => cli::plan_cmd(&file, &from, count, json, &mut out, &mut err),
        Command::Schema => {
            let _ = writeln!(out, "{}", baton_proto::pack::schema::pack_schema_json());
            0
        }
    };
    let _ = out.flush();
    ExitCode::from(code as u8)
}
