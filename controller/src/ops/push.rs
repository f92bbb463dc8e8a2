//! `push FILE...`: validate every file locally first (nothing is sent if
//! any is invalid), push each, then wait for each targeted agent's answer
//! on the controller's live event stream (opened before the push, so no
//! answer is missed; read again from the store if the stream lags or
//! drops).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use baton_proto::RefTime;
use baton_proto::wire;

use super::conn::{Conn, client};
use super::error::OpError;
use super::format;

/// How `push` behaves.
#[derive(Clone, Debug)]
pub struct PushOpts {
    /// Return once stored, without waiting for agents.
    pub no_wait: bool,
    /// How long to wait for agents.
    pub wait: Duration,
    /// JSON lines.
    pub json: bool,
    /// Sign each pack with this key (its signature line appended).
    pub sign: Option<std::sync::Arc<baton_trust::SigningKey>>,
}

/// Push `files`. Exit 0 when every targeted agent acked, 1 when one
/// refused (or the push itself was refused), 3 when some are still
/// pending after the wait, 4 when a pack was stored but targets no agent
/// (a typo in `targets` looks exactly like that). Results go to `out`,
/// warnings (a pack that targets no agent) to `warn`.
pub async fn push(
    conn: &Conn,
    files: &[PathBuf],
    opts: &PushOpts,
    out: &mut dyn Write,
    warn: &mut dyn Write,
) -> Result<(), OpError> {
    let mut packs = read_all(files)?;
    if let Some(key) = &opts.sign {
        for (name, yaml, pack) in &mut packs {
            *yaml = baton_trust::pack::sign_text(key, &pack.tenant, yaml).ok_or_else(|| {
                OpError::fail(format!(
                    "{name}: already signed (its last line is a signature); nothing pushed"
                ))
            })?;
        }
    }
    let mut c = client(conn).await?;
    let deadline = Instant::now() + opts.wait;
    let mut outcome = Outcome::default();
    for (name, yaml, pack) in packs {
        // Watch first: every delivery change after the push is seen.
        let watch = if opts.no_wait {
            None
        } else {
            c.watch(wire::WatchRequest {
                tenant: pack.tenant.clone(),
                pack: pack.id.clone(),
            })
            .await
            .ok()
            .map(|r| r.into_inner())
        };
        let reply = c
            .push(wire::PushRequest {
                yaml,
                source_name: name.clone(),
            })
            .await?
            .into_inner();
        let r = reply.pack.clone().unwrap_or_default();
        print_stored(out, opts.json, &name, &reply);
        if reply.rollout {
            // Stages, soak and verdicts take their time: `rollout status`
            // follows them; the push is done once stored.
            continue;
        }
        if reply.agents.is_empty() {
            outcome.no_agent = true;
            let _ = writeln!(
                warn,
                "warning: {name}: {} targets no agent ({}): check its `targets` (agent ids, labels, and that the agents serve tenant {})",
                format::pack_ref(reply.pack.as_ref()),
                targets_words(&pack),
                r.tenant
            );
            continue;
        }
        if opts.no_wait {
            continue;
        }
        let ds = wait_for(&mut c, watch, &r, &reply.agents, deadline).await?;
        report(out, opts.json, &name, &r, &ds, &mut outcome);
    }
    outcome.result(opts.wait)
}

/// Every file read and checked, before anything is sent: (name, YAML,
/// pack) each, or every file's errors and "nothing pushed".
fn read_all(files: &[PathBuf]) -> Result<Vec<(String, String, baton_proto::pack::Pack)>, OpError> {
    let now = RefTime::from_timestamp(jiff::Timestamp::now()).unwrap_or(RefTime::MAX);
    let mut packs = Vec::new();
    let mut errors = String::new();
    for f in files {
        let name = f.display().to_string();
        match baton_proto::pack::read_pack_file(f) {
            Ok((yaml, p)) => match p.check_live(now) {
                Ok(()) => packs.push((name, yaml, p)),
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
    Ok(packs)
}

/// The line saying a pack was stored (and how it reaches its agents).
fn print_stored(out: &mut dyn Write, json: bool, name: &str, reply: &wire::PushReply) {
    let r = reply.pack.clone().unwrap_or_default();
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::json!({
                "event": "stored", "file": name, "tenant": r.tenant, "pack": r.pack,
                "version": r.version, "unchanged": reply.unchanged, "agents": reply.agents,
                "rollout": reply.rollout,
            })
        );
    } else if reply.rollout {
        let _ = writeln!(
            out,
            "{name}: {} stored{}; a rollout gives it to its targets stage by stage: `baton-controller rollout status {}`",
            format::pack_ref(reply.pack.as_ref()),
            if reply.unchanged { " (unchanged)" } else { "" },
            r.pack
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
}

/// What the pushes came to, worst first.
#[derive(Debug, Default)]
struct Outcome {
    refused: bool,
    pending: bool,
    no_agent: bool,
}

impl Outcome {
    /// The command's exit: the worst of what happened.
    fn result(&self, wait: Duration) -> Result<(), OpError> {
        if self.refused {
            return Err(OpError::fail("refused by at least one agent"));
        }
        if self.pending {
            return Err(OpError {
                message: format!(
                    "still pending after {wait:?} (agents offline or busy; the controller keeps delivering)"
                ),
                code: 3,
            });
        }
        if self.no_agent {
            return Err(OpError {
                message: "stored, but at least one pack targets no agent".into(),
                code: 4,
            });
        }
        Ok(())
    }
}

fn targets_words(p: &baton_proto::pack::Pack) -> String {
    use baton_proto::pack::Targets;
    match &p.targets {
        None => "no `targets`".into(),
        Some(Targets::Agents(a)) => format!("agents: {}", a.join(", ")),
        Some(Targets::Labels(l)) => {
            let kv: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("labels: {}", kv.join(", "))
        }
    }
}

type Admin = baton_proto::wire::admin_client::AdminClient<tonic::transport::Channel>;

/// The deliveries of one pushed version, every page.
async fn deliveries(c: &mut Admin, r: &wire::PackRef) -> Result<Vec<wire::Delivery>, OpError> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let page = c
            .deliveries(wire::DeliveriesRequest {
                tenant: r.tenant.clone(),
                pack: r.pack.clone(),
                version: r.version,
                after: after.clone(),
                limit: 0,
            })
            .await?
            .into_inner();
        out.extend(page.deliveries);
        if page.next.is_empty() || page.next == after {
            return Ok(out);
        }
        after = page.next;
    }
}

fn pending(d: &wire::Delivery) -> bool {
    d.state == wire::DeliveryState::Pending as i32
}

/// Waits until no targeted agent is pending, or the deadline: the state
/// read once from the store, then followed on the watch stream; read
/// again when the stream lags or ends.
async fn wait_for(
    c: &mut Admin,
    mut watch: Option<tonic::Streaming<wire::WatchEvent>>,
    r: &wire::PackRef,
    agents: &[String],
    deadline: Instant,
) -> Result<Vec<wire::Delivery>, OpError> {
    use std::collections::BTreeMap;
    let mut state: BTreeMap<String, wire::Delivery> = deliveries(c, r)
        .await?
        .into_iter()
        .filter(|d| agents.contains(&d.agent_id))
        .map(|d| (d.agent_id.clone(), d))
        .collect();
    loop {
        if !state.values().any(pending) {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let ev = match watch.as_mut() {
            Some(w) => tokio::time::timeout(left, w.message()).await,
            None => {
                // No live stream: poll the store now and then.
                tokio::time::sleep(left.min(Duration::from_millis(500))).await;
                Ok(Ok(None))
            }
        };
        match ev {
            Err(_) => break, // the deadline
            Ok(Ok(Some(wire::WatchEvent {
                body: Some(wire::watch_event::Body::Delivery(d)),
            }))) => {
                let about = d.pack.as_ref().map(|p| p.version) == Some(r.version);
                if about && state.contains_key(&d.agent_id) {
                    state.insert(d.agent_id.clone(), d);
                }
            }
            Ok(Ok(Some(wire::WatchEvent {
                body: Some(wire::watch_event::Body::Lagged(_)),
            }))) => reread(c, r, &mut state).await?,
            Ok(Ok(Some(_))) => {}
            // Closed or broken (or no stream): poll the store from now on.
            Ok(Ok(None)) | Ok(Err(_)) => {
                watch = None;
                reread(c, r, &mut state).await?;
            }
        }
    }
    Ok(state.into_values().collect())
}

async fn reread(
    c: &mut Admin,
    r: &wire::PackRef,
    state: &mut std::collections::BTreeMap<String, wire::Delivery>,
) -> Result<(), OpError> {
    for d in deliveries(c, r).await? {
        if let Some(s) = state.get_mut(&d.agent_id) {
            *s = d;
        }
    }
    Ok(())
}

fn report(
    out: &mut dyn Write,
    json: bool,
    name: &str,
    r: &wire::PackRef,
    ds: &[wire::Delivery],
    outcome: &mut Outcome,
) {
    for d in ds {
        let state = format::delivery_state(d.state);
        match state {
            "nacked" => outcome.refused = true,
            "pending" => outcome.pending = true,
            _ => {}
        }
        if json {
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
