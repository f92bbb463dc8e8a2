//! The operator commands: each a call of the controller's API on a small
//! runtime, its output on stdout and its error on stderr.

use std::future::Future;
use std::io::Write;

use baton_controller::ops;

use crate::args::{
    AgentsCmd, AuditArgs, ClockArgs, ConnArgs, FeedbackArgs, PushArgs, ReleaseCmd, RolloutCmd,
    RolloutPack, UpdateCmd, UpdateRef, WatchArgs,
};

impl PushArgs {
    /// `push`: exit 3 when still pending after the wait, 4 when the pack
    /// targets no agent.
    pub(crate) fn run(self, err: &mut dyn Write) -> i32 {
        let PushArgs {
            conn,
            files,
            no_wait,
            wait,
            json,
            sign,
        } = self;
        run(err, async move {
            let sign = match sign {
                Some(path) => Some(std::sync::Arc::new(
                    crate::keys_cmd::read_key(&path).map_err(ops::OpError::fail)?,
                )),
                None => None,
            };
            ops::push(
                &conn.conn()?,
                &files,
                &ops::PushOpts {
                    no_wait,
                    wait,
                    json,
                    sign,
                },
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            )
            .await
        })
    }
}

/// `agents`: the list, or one of its management subcommands.
pub(crate) fn agents(
    conn: ConnArgs,
    json: bool,
    cmd: Option<AgentsCmd>,
    err: &mut dyn Write,
) -> i32 {
    match cmd {
        None => run(err, async move {
            ops::agents(&conn.conn()?, json, &mut std::io::stdout()).await
        }),
        Some(AgentsCmd::Label {
            conn,
            agent,
            labels,
            remove,
            reset,
            tenant,
            json,
        }) => run(err, async move {
            let change = ops::LabelChange::parse(&labels, &remove, &reset)?;
            ops::label_agent(
                &conn.conn()?,
                &agent,
                &tenant,
                change,
                json,
                &mut std::io::stdout(),
            )
            .await
        }),
        Some(AgentsCmd::Grant {
            conn,
            agent,
            tenant,
            revoke,
        }) => run(err, async move {
            ops::grant_agent(
                &conn.conn()?,
                &agent,
                &tenant,
                revoke,
                &mut std::io::stdout(),
            )
            .await
        }),
        Some(AgentsCmd::Forget {
            conn,
            agent,
            tenant,
        }) => run(err, async move {
            ops::forget_agent(&conn.conn()?, &agent, &tenant, &mut std::io::stdout()).await
        }),
    }
}

/// `rollout`: every subcommand is one call naming a pack (none for
/// `list`).
pub(crate) fn rollout(cmd: RolloutCmd, err: &mut dyn Write) -> i32 {
    let (op, p) = match cmd {
        RolloutCmd::List { conn, json } => (
            ops::RolloutOp::List,
            RolloutPack {
                conn,
                pack: String::new(),
                tenant: String::new(),
                json,
            },
        ),
        RolloutCmd::Status(p) => (ops::RolloutOp::Status, p),
        RolloutCmd::Pause(p) => (ops::RolloutOp::Pause, p),
        RolloutCmd::Resume(p) => (ops::RolloutOp::Resume, p),
        RolloutCmd::Abort(p) => (ops::RolloutOp::Abort, p),
    };
    run(err, async move {
        ops::rollout(
            &p.conn.conn()?,
            op,
            &p.tenant,
            &p.pack,
            p.json,
            &mut std::io::stdout(),
        )
        .await
    })
}

/// `release upload|list`.
pub(crate) fn release(cmd: ReleaseCmd, err: &mut dyn Write) -> i32 {
    match cmd {
        ReleaseCmd::List { conn, json } => run(err, async move {
            ops::releases(&conn.conn()?, json, &mut std::io::stdout()).await
        }),
        ReleaseCmd::Upload {
            conn,
            file,
            manifest,
            sign,
            version,
            arch,
        } => run(err, async move {
            let binary = std::fs::read(&file)
                .map_err(|e| ops::OpError::fail(format!("{}: cannot read: {e}", file.display())))?;
            let signed = match (manifest, sign, version, arch) {
                (Some(m), None, _, _) => {
                    let text = std::fs::read_to_string(&m).map_err(|e| {
                        ops::OpError::fail(format!("{}: cannot read: {e}", m.display()))
                    })?;
                    serde_json::from_str::<baton_trust::SignedRelease>(&text).map_err(|e| {
                        ops::OpError::fail(format!(
                            "{}: not a signed release manifest: {e}",
                            m.display()
                        ))
                    })?
                }
                (None, Some(key), Some(version), Some(arch)) => {
                    crate::keys_cmd::signed_release(&key, &file, &binary, &version, &arch)
                        .map_err(ops::OpError::fail)?
                }
                _ => {
                    return Err(ops::OpError::usage(
                        "release upload: give --manifest M.json, or --sign KEY --version V --arch A",
                    ));
                }
            };
            ops::upload_release(&conn.conn()?, &signed, binary, &mut std::io::stdout()).await
        }),
    }
}

/// `agent-update …`.
pub(crate) fn agent_update(cmd: UpdateCmd, err: &mut dyn Write) -> i32 {
    let (op, r) = match cmd {
        UpdateCmd::Start {
            conn,
            version,
            plan,
            json,
        } => {
            let text = match std::fs::read_to_string(&plan) {
                Ok(t) => t,
                Err(e) => {
                    let _ = writeln!(err, "error: {}: cannot read: {e}", plan.display());
                    return 1;
                }
            };
            (
                ops::UpdateOp::Start {
                    version,
                    plan: text,
                },
                UpdateRef {
                    conn,
                    id: None,
                    reason: String::new(),
                    json,
                },
            )
        }
        UpdateCmd::List { conn, json } => (
            ops::UpdateOp::List,
            UpdateRef {
                conn,
                id: None,
                reason: String::new(),
                json,
            },
        ),
        UpdateCmd::Status(r) => (ops::UpdateOp::Status, r),
        UpdateCmd::Pause(r) => (ops::UpdateOp::Pause, r),
        UpdateCmd::Resume(r) => (ops::UpdateOp::Resume, r),
        UpdateCmd::Abort(r) => {
            if r.id.is_none() {
                let _ = writeln!(
                    err,
                    "error: agent-update abort: name the update (agent-update list): an abort is final"
                );
                return 2;
            }
            (ops::UpdateOp::Abort, r)
        }
    };
    run(err, async move {
        ops::agent_update(
            &r.conn.conn()?,
            op,
            r.id.unwrap_or(0),
            &r.reason,
            r.json,
            &mut std::io::stdout(),
        )
        .await
    })
}

impl WatchArgs {
    /// `watch`: until interrupted.
    pub(crate) fn run(self, err: &mut dyn Write) -> i32 {
        let WatchArgs {
            conn,
            tenant,
            pack,
            json,
        } = self;
        run(err, async move {
            ops::watch(&conn.conn()?, &tenant, &pack, json, &mut std::io::stdout()).await
        })
    }
}

impl FeedbackArgs {
    /// `feedback`: a pack's stored feedback.
    pub(crate) fn run(self, err: &mut dyn Write) -> i32 {
        let FeedbackArgs {
            conn,
            pack,
            tenant,
            agent,
            since,
            limit,
            json,
        } = self;
        run_since(err, since.as_deref(), move |since_ns| async move {
            ops::feedback(
                &conn.conn()?,
                &tenant,
                &pack,
                agent.as_deref(),
                since_ns,
                limit,
                json,
                &mut std::io::stdout(),
            )
            .await
        })
    }
}

impl ClockArgs {
    /// `clock`: an agent's clock history.
    pub(crate) fn run(self, err: &mut dyn Write) -> i32 {
        let ClockArgs {
            conn,
            agent,
            since,
            limit,
            json,
        } = self;
        run_since(err, since.as_deref(), move |since_ns| async move {
            ops::clock(
                &conn.conn()?,
                &agent,
                since_ns,
                limit,
                json,
                &mut std::io::stdout(),
            )
            .await
        })
    }
}

impl AuditArgs {
    /// `audit`: the audit log.
    pub(crate) fn run(self, err: &mut dyn Write) -> i32 {
        let AuditArgs {
            conn,
            since,
            limit,
            json,
        } = self;
        run_since(err, since.as_deref(), move |since_ns| async move {
            ops::audit(&conn.conn()?, since_ns, limit, json, &mut std::io::stdout()).await
        })
    }
}

/// A command reading history from `--since`: a bad instant is a usage
/// error (exit 2) before anything is asked of the controller.
fn run_since<F, Fut>(err: &mut dyn Write, since: Option<&str>, f: F) -> i32
where
    F: FnOnce(i64) -> Fut,
    Fut: Future<Output = Result<(), ops::OpError>>,
{
    match since_ns(since) {
        Ok(since_ns) => run(err, f(since_ns)),
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            2
        }
    }
}

/// `--since T` as ns since the epoch (0 without it).
fn since_ns(since: Option<&str>) -> Result<i64, String> {
    since.map_or(Ok(0), |s| {
        baton_proto::time::parse_instant_arg("--since", s)
            .map(|t| t.as_nanos())
            .map_err(|e| e.to_string())
    })
}

/// Run an operator command on a small runtime; its error goes to stderr.
pub(crate) fn run(
    err: &mut dyn Write,
    f: impl std::future::Future<Output = Result<(), ops::OpError>>,
) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(err, "error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match rt.block_on(f) {
        Ok(()) => 0,
        Err(e) => {
            if !e.message.is_empty() {
                let _ = writeln!(err, "error: {}", e.message);
            }
            i32::from(e.code)
        }
    }
}
