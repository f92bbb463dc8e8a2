//! `push FILE...`: validate every file locally first (nothing is sent if
//! any is invalid), push each, then wait for each targeted agent's answer.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use baton_proto::RefTime;
use baton_proto::wire;

use super::format;
use super::{Conn, OpError, client};

/// How `push` behaves.
#[derive(Clone, Debug)]
pub struct PushOpts {
    /// Return once stored, without waiting for agents.
    pub no_wait: bool,
    /// How long to wait for agents.
    pub wait: Duration,
    /// JSON lines.
    pub json: bool,
}

/// Push `files`. Exit 0 when every targeted agent acked, 1 when one
/// refused (or the push itself was refused), 3 when some are still
/// pending after the wait.
pub async fn push(
    conn: &Conn,
    files: &[PathBuf],
    opts: &PushOpts,
    out: &mut dyn Write,
) -> Result<(), OpError> {
    let now = RefTime::from_timestamp(jiff::Timestamp::now()).unwrap_or(RefTime::MAX);
    let mut packs = Vec::new();
    let mut errors = String::new();
    for f in files {
        let name = f.display().to_string();
        match baton_proto::pack::read_pack_file(f) {
            Ok((yaml, p)) => match p.check_live(now) {
                Ok(()) => packs.push((name, yaml)),
                Err(e) => errors.push_str(&e.render(&name)),
            },
            Err(rendered) => {
                errors.push_str(&rendered);
                errors.push('\n');
            }
        }
    }
    if !errors.is_empty() {
        return Err(OpError::fail(format!(
            "{}\nnothing pushed",
            errors.trim_end()
        )));
    }
    let mut c = client(conn).await?;
    let mut pushed = Vec::new();
    for (name, yaml) in packs {
        let reply = c
            .push(wire::PushRequest {
                yaml,
                source_name: name.clone(),
            })
            .await?
            .into_inner();
        let r = reply.pack.clone().unwrap_or_default();
        if opts.json {
            let _ = writeln!(
                out,
                "{}",
                serde_json::json!({
                    "event": "stored", "file": name, "tenant": r.tenant, "pack": r.pack,
                    "version": r.version, "unchanged": reply.unchanged, "agents": reply.agents,
                })
            );
        } else {
            let _ = writeln!(
                out,
                "{name}: {} stored{}, {} agent{} targeted",
                format::pack_ref(reply.pack.as_ref()),
                if reply.unchanged { " (unchanged)" } else { "" },
                reply.agents.len(),
                if reply.agents.len() == 1 { "" } else { "s" }
            );
        }
        pushed.push((name, r));
    }
    if opts.no_wait {
        return Ok(());
    }
    let deadline = Instant::now() + opts.wait;
    let mut worst = 0u8;
    for (name, r) in pushed {
        let ds = loop {
            let ds = c
                .deliveries(wire::DeliveriesRequest {
                    tenant: r.tenant.clone(),
                    pack: r.pack.clone(),
                    version: r.version,
                })
                .await?
                .into_inner()
                .deliveries;
            let pending = ds
                .iter()
                .any(|d| d.state == wire::DeliveryState::Pending as i32);
            if !pending || Instant::now() >= deadline {
                break ds;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for d in &ds {
            let state = format::delivery_state(d.state);
            match state {
                "nacked" => worst = worst.max(1),
                "pending" => worst = worst.max(3),
                _ => {}
            }
            if opts.json {
                let errs: Vec<serde_json::Value> = d
                    .errors
                    .iter()
                    .map(|e| {
                        serde_json::json!({"line": e.line, "column": e.column,
                        "instruction": e.instruction, "message": e.message})
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "{}",
                    serde_json::json!({
                        "event": "delivery", "file": name, "agent": d.agent_id,
                        "tenant": r.tenant, "pack": r.pack, "version": r.version,
                        "state": state, "reason": d.reason, "errors": errs,
                    })
                );
            } else {
                let reason = if d.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", d.reason)
                };
                let _ = writeln!(out, "  {:<20} {state}{reason}", d.agent_id);
                for e in &d.errors {
                    let instr = if e.instruction.is_empty() {
                        String::new()
                    } else {
                        format!(" (instruction {})", e.instruction)
                    };
                    let _ = writeln!(
                        out,
                        "    {name}:{}:{}: {}{instr}",
                        e.line, e.column, e.message
                    );
                }
            }
        }
    }
    match worst {
        0 => Ok(()),
        1 => Err(OpError::fail("refused by at least one agent")),
        _ => Err(OpError {
            message: format!(
                "still pending after {:?} (agents offline or busy; the controller keeps delivering)",
                opts.wait
            ),
            code: 3,
        }),
    }
}
