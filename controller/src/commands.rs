//! Each subcommand to the code that runs it, and its exit code.

use std::io::Write;

use baton_controller::cli;

use crate::args::Command;
use crate::{ca_cmd, operator, serve};

/// Run `command`; its exit code.
pub(crate) fn run(command: Command, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    match command {
        Command::Serve(s) => serve::run(s.into()),
        Command::Push(p) => p.run(err),
        Command::Cancel {
            conn,
            pack,
            tenant,
            agents,
        } => operator::run(err, async move {
            let (conn, out) = (conn.conn()?, &mut std::io::stdout());
            baton_controller::ops::cancel(&conn, &tenant, &pack, &agents, out).await
        }),
        Command::Packs { conn, json } => operator::run(err, async move {
            baton_controller::ops::packs(&conn.conn()?, json, &mut std::io::stdout()).await
        }),
        Command::Agents { conn, json, cmd } => operator::agents(conn, json, cmd, err),
        Command::Rollout { cmd } => operator::rollout(cmd, err),
        Command::Release { cmd } => operator::release(cmd, err),
        Command::AgentUpdate { cmd } => operator::agent_update(cmd, err),
        Command::Watch(w) => w.run(err),
        Command::Feedback(f) => f.run(err),
        Command::Clock(c) => c.run(err),
        Command::Audit(a) => a.run(err),
        Command::Migrate { from, to, store_ca } => {
            migrate(&from, &to, store_ca.as_deref(), out, err)
        }
        Command::Ca { cmd } => ca_cmd::run(cmd, out, err),
        Command::Keys { cmd } => crate::keys_cmd::run(cmd, out, err),
        Command::Validate { files } => cli::validate(&files, out, err),
        Command::Plan {
            file,
            from,
            count,
            json,
        } => cli::plan_cmd(&file, &from, count, json, out, err),
        Command::Schema => {
            let _ = writeln!(out, "{}", baton_proto::pack::schema::pack_schema_json());
            0
        }
    }
}

/// `migrate`: the embedded store copied into PostgreSQL, table by table.
fn migrate(
    from: &std::path::Path,
    to: &str,
    store_ca: Option<&std::path::Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    use baton_sql::postgres::{Target, import};
    let copied = Target::new(to, store_ca).and_then(|t| import::copy_from_sqlite(from, &t));
    match copied {
        Ok(c) => {
            for (table, read, new) in &c.tables {
                let _ = writeln!(out, "{table}: {read} rows, {new} new");
            }
            0
        }
        Err(e) => {
            let _ = writeln!(err, "error: migrate from {}: {e}", from.display());
            1
        }
    }
}
