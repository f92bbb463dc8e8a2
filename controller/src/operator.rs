//! The operator commands: each a call of the controller's API on a small
//! runtime, its output on stdout and its error on stderr.

use std::future::Future;
use std::io::Write;

use baton_controller::ops;

use crate::args::{
    AgentsCmd, AuditArgs, ClockArgs, ConnArgs, FeedbackArgs, PushArgs, RolloutCmd, RolloutPack,
    WatchArgs,
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
