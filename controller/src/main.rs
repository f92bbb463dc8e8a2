//! `baton-controller`: the server (`serve`) and the operator commands.
//! Exit codes: 0 success, 1 invalid input or refused (errors on stderr as
//! `FILE:LINE:COL: message` where they have a position), 2 usage errors,
//! 3 `push` still pending after its wait, 4 `push` stored a pack that
//! targets no agent.

#![forbid(unsafe_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use baton_controller::{cli, ops};
use clap::{Parser, Subcommand};

mod ca_cmd;
mod serve;

#[derive(Parser, Debug)]
#[command(
    name = "baton-controller",
    version,
    about = "baton controller: serve agents, push instruction packs, watch feedback"
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
    /// Run the controller: the agents' link, the operators' API, the store.
    Serve {
        /// Address to listen on (port 0: any free port; the bound address is
        /// written to DATA/listen.addr).
        #[arg(long, default_value = "127.0.0.1:7411")]
        listen: std::net::SocketAddr,
        /// Directory of the store (and of listen.addr, metrics.addr).
        #[arg(long, default_value = "baton-controller-data")]
        data: PathBuf,
        /// Keep the store in PostgreSQL instead of DIR/controller.db: a
        /// URL (`postgres://USER@HOST:PORT/DB`) or key=value settings
        /// (`host=… dbname=…`). The database must use the C collation.
        /// Several replicas may share it (see --replica-id, the README).
        #[arg(long, value_name = "URL", env = "BATON_STORE", hide_env_values = true)]
        store: Option<String>,
        /// TLS to the PostgreSQL store, its certificate checked against
        /// this CA (PEM); TLS is then required. Without it the connection
        /// is plaintext, and a URL asking for TLS is refused.
        #[arg(long, value_name = "FILE", requires = "store")]
        store_ca: Option<PathBuf>,
        /// This replica's id on the PostgreSQL store (default: host name,
        /// process id and a random suffix). A restart under the same id
        /// fences its earlier self; two live replicas must not share one.
        #[arg(long, value_name = "NAME", requires = "store")]
        replica_id: Option<String>,
        /// How long this replica's lease holds without a renewal (renewed
        /// every tenth of it): paused or cut off longer, it stops.
        #[arg(
            long,
            default_value = "10s",
            value_name = "DURATION",
            requires = "store"
        )]
        lease: String,
        /// New agent streams admitted per second (0: no bound); past it a
        /// stream is refused UNAVAILABLE and the agent retries after its
        /// jittered backoff (a replica taking over a dead one's agents).
        #[arg(long, default_value_t = 500.0)]
        admit_rate: f64,
        /// New agent streams admitted at once (token bucket burst).
        #[arg(long, default_value_t = 100.0)]
        admit_burst: f64,
        /// mTLS with the certificates of this CA directory (server.pem,
        /// server-key.pem, ca.pem for clients, revoked.txt), made by
        /// `ca init`; re-read when they change.
        #[arg(long)]
        tls_dir: Option<PathBuf>,
        /// Serve plaintext instead (loopback only, unless --insecure-any).
        #[arg(long)]
        insecure: bool,
        /// Allow --insecure on a non-loopback address.
        #[arg(long)]
        insecure_any: bool,
        /// A TLS handshake not done by then is dropped.
        #[arg(long, default_value = "10s")]
        tls_handshake_timeout: String,
        /// The same while the handshake budget is crowded (three quarters
        /// of --max-handshakes in progress), for every handshake in
        /// progress.
        #[arg(long, default_value = "3s")]
        tls_handshake_timeout_crowded: String,
        /// Live connections at most (TLS handshakes in progress included);
        /// a connection over it is answered RESOURCE_EXHAUSTED on every
        /// call. Needs about as many file descriptors (LimitNOFILE).
        #[arg(long, default_value_t = baton_controller::server::accept::DEFAULT_MAX_CONNECTIONS as u32, value_parser = count_arg, allow_hyphen_values = true)]
        max_connections: u32,
        /// TLS handshakes in progress at once; more are refused with a TLS
        /// alert the CLI reads as "at its limit".
        #[arg(long, default_value_t = 256, value_parser = count_arg, allow_hyphen_values = true)]
        max_handshakes: u32,
        /// TLS handshakes in progress at once from one IPv4 address or one
        /// IPv6 /64.
        #[arg(long, default_value_t = 16, value_parser = count_arg, allow_hyphen_values = true)]
        max_handshakes_per_source: u32,
        /// Pushes per second to agents (token bucket rate).
        #[arg(long, default_value_t = 3000.0)]
        push_rate: f64,
        /// Pushes that may go out at once (token bucket burst).
        #[arg(long, default_value_t = 6000.0)]
        push_burst: f64,
        /// How often agent streams are pinged (three silent intervals end one).
        #[arg(long, default_value = "10s")]
        ping_interval: String,
        /// Log output on stderr: auto (journald's format when stderr is
        /// the journal, else text), text, json or journald.
        #[arg(long, default_value = "auto", value_name = "auto|text|json|journald")]
        log_format: baton_service::log::LogFormat,
        /// Serve Prometheus metrics at http://ADDR/metrics (IP:PORT;
        /// plaintext and unauthenticated, read-only; port 0: any free
        /// port, written to DATA/metrics.addr).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<std::net::SocketAddr>,
        /// Serve the web dashboard at ADDR (IP:PORT; port 0: any free
        /// port, written to DATA/http.addr): HTTPS with the controller's
        /// certificate under --tls-dir (operators log in with a token of
        /// `ca issue-operator --token`), plaintext only with --insecure and
        /// on loopback unless --insecure-any.
        #[arg(long, value_name = "ADDR", env = "BATON_HTTP")]
        http: Option<std::net::SocketAddr>,
        /// Keep feedback this long (a duration, or `forever`); older rows
        /// are deleted in small batches.
        #[arg(long, default_value = "30d", value_parser = retention_arg, allow_hyphen_values = true)]
        retain_feedback: Keep,
        /// Keep clock history this long (a duration, or `forever`).
        #[arg(long, default_value = "7d", value_parser = retention_arg, allow_hyphen_values = true)]
        retain_clock: Keep,
        /// Keep the audit log this long (a duration, or `forever`).
        #[arg(long, default_value = "forever", value_parser = retention_arg, allow_hyphen_values = true)]
        retain_audit: Keep,
        /// Most packs an agent's hello or held update may list (its own
        /// max-packs is the tighter bound when smaller); more is refused.
        #[arg(long, default_value_t = 1024, value_parser = count_arg, allow_hyphen_values = true)]
        max_held_packs: u32,
    },
    /// Copy a single-node site's embedded store (`serve --data DIR`) into
    /// PostgreSQL, history included, for `serve --store URL`. Stop the
    /// controller first. Running it again copies nothing twice.
    Migrate {
        /// The embedded store's directory (its `--data`).
        #[arg(long, value_name = "DIR")]
        from: PathBuf,
        /// The PostgreSQL database (as `serve --store`).
        #[arg(long, value_name = "URL", env = "BATON_STORE", hide_env_values = true)]
        to: String,
        /// As `serve --store-ca`.
        #[arg(long, value_name = "FILE")]
        store_ca: Option<PathBuf>,
    },
    /// The fleet's certificate authority: PEM files in one directory.
    Ca {
        #[command(subcommand)]
        cmd: ca_cmd::CaCmd,
    },
    /// Push pack files to their targets: validated here first, stored by the
    /// controller, then delivered; waits for each agent's answer.
    Push {
        #[command(flatten)]
        conn: ConnArgs,
        /// Pack files (YAML).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Return once stored, without waiting for agents.
        #[arg(long)]
        no_wait: bool,
        /// How long to wait for agents' answers.
        #[arg(long, default_value = "30s", value_parser = duration_arg, allow_hyphen_values = true)]
        wait: std::time::Duration,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Withdraw a pack: every agent holding it enters its safe state.
    Cancel {
        #[command(flatten)]
        conn: ConnArgs,
        /// Pack id.
        pack: String,
        /// Tenant (default: the operator certificate's, or `default`).
        #[arg(long, default_value = "")]
        tenant: String,
    },
    /// List packs (latest version) with their delivery counts.
    Packs {
        #[command(flatten)]
        conn: ConnArgs,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// List agents: connection, clock, packs, lateness; `label` and
    /// `forget` manage them (admins).
    #[command(args_conflicts_with_subcommands = true)]
    Agents {
        #[command(flatten)]
        conn: ConnArgs,
        /// One JSON object per line (`id` is the agent's id).
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        cmd: Option<AgentsCmd>,
    },
    /// Staged rollouts (packs with a `rollout:` section): `status PACK`,
    /// `list`, and `pause|resume|abort PACK` (operators; audited).
    Rollout {
        #[command(subcommand)]
        cmd: RolloutCmd,
    },
    /// Live feedback, deliveries and agent events until interrupted.
    Watch {
        #[command(flatten)]
        conn: ConnArgs,
        /// Only this tenant.
        #[arg(long, default_value = "")]
        tenant: String,
        /// Only this pack.
        #[arg(long, default_value = "")]
        pack: String,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Stored feedback of a pack.
    Feedback {
        #[command(flatten)]
        conn: ConnArgs,
        /// Pack id.
        #[arg(long)]
        pack: String,
        /// Tenant (default: the operator certificate's, or `default`).
        #[arg(long, default_value = "")]
        tenant: String,
        /// Only this agent.
        #[arg(long)]
        agent: Option<String>,
        /// Only feedback received at or after this RFC 3339 instant.
        #[arg(long)]
        since: Option<String>,
        /// At most this many entries (0: all).
        #[arg(long, default_value_t = 0, value_parser = count_arg, allow_hyphen_values = true)]
        limit: u32,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// An agent's clock history: source, state, offset (reference time
    /// minus the agent's system clock), jitter, uncertainty, frequency.
    Clock {
        #[command(flatten)]
        conn: ConnArgs,
        /// The agent.
        agent: String,
        /// Only reports at or after this RFC 3339 instant.
        #[arg(long)]
        since: Option<String>,
        /// The newest N reports only (0: the server's cap).
        #[arg(long, default_value_t = 0, value_parser = count_arg, allow_hyphen_values = true)]
        limit: u32,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// The audit log (admins): every push, cancel, label change and forget,
    /// refused ones included, and revocations the controller picked up.
    Audit {
        #[command(flatten)]
        conn: ConnArgs,
        /// Only records at or after this RFC 3339 instant.
        #[arg(long)]
        since: Option<String>,
        /// The newest N records only (0: the server's cap).
        #[arg(long, default_value_t = 0, value_parser = count_arg, allow_hyphen_values = true)]
        limit: u32,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

/// One pack's rollout, named by pack id.
#[derive(clap::Args, Debug)]
struct RolloutPack {
    #[command(flatten)]
    conn: ConnArgs,
    /// The pack.
    pack: String,
    /// Tenant (default: the operator certificate's, or `default`).
    #[arg(long, default_value = "")]
    tenant: String,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

/// Rollout commands.
#[derive(Subcommand, Debug)]
enum RolloutCmd {
    /// State (waiting_window, running, paused, aborted, superseded,
    /// completed), the stage, every verdict with its inputs, and each
    /// target agent's cohort and held version.
    Status(RolloutPack),
    /// Every rollout you may see, newest version of each pack first.
    List {
        #[command(flatten)]
        conn: ConnArgs,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Hold a waiting or running rollout where it is.
    Pause(RolloutPack),
    /// Let a paused rollout go on (its stage's deadline starts over).
    Resume(RolloutPack),
    /// End a rollout for good, with the pack's `on_abort`.
    Abort(RolloutPack),
}

/// Agent management (role admin).
#[derive(Subcommand, Debug)]
enum AgentsCmd {
    /// Operator labels on an agent, for your tenant's packs only: set
    /// KEY=VALUE over the agent's own labels, hide a key (--remove), or go
    /// back to the agent's own value (--reset). Kept across reconnects;
    /// the agent's packs are retargeted at once.
    Label {
        #[command(flatten)]
        conn: ConnArgs,
        /// Agent id.
        agent: String,
        /// Labels to set.
        #[arg(value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Hide this key (even the agent's own).
        #[arg(long, value_name = "KEY")]
        remove: Vec<String>,
        /// Back to the agent's own value of this key.
        #[arg(long, value_name = "KEY")]
        reset: Vec<String>,
        /// Tenant (default: the operator certificate's, or `default`).
        #[arg(long, default_value = "")]
        tenant: String,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Grant an agent to a tenant (or take the grant back with --revoke):
    /// that tenant's packs may then target it and its operators see it.
    /// Admins of a tenant the agent serves.
    Grant {
        #[command(flatten)]
        conn: ConnArgs,
        /// Agent id.
        agent: String,
        /// The tenant to grant it to.
        tenant: String,
        /// Take the grant back instead.
        #[arg(long)]
        revoke: bool,
    },
    /// Forget an agent: your tenant's deliveries to it and labels on it;
    /// its whole record when no other tenant uses it (a connected agent is
    /// disconnected and comes back as new). Packs are not withdrawn.
    Forget {
        #[command(flatten)]
        conn: ConnArgs,
        /// Agent id.
        agent: String,
        /// Tenant (default: the operator certificate's; without identities,
        /// the whole fleet's).
        #[arg(long, default_value = "")]
        tenant: String,
    },
}

/// Where the controller is.
#[derive(clap::Args, Debug)]
struct ConnArgs {
    /// Controller URL (default: the profile's, else
    /// http://127.0.0.1:7411).
    #[arg(long, env = "BATON_CONTROLLER")]
    controller: Option<String>,
    /// Talk plaintext to an http:// controller (loopback only, unless
    /// --insecure-any).
    #[arg(long)]
    insecure: bool,
    /// Allow --insecure toward a non-loopback controller.
    #[arg(long)]
    insecure_any: bool,
    /// This operator's certificate (made by `ca issue-operator`).
    #[arg(long, env = "BATON_CERT")]
    cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, env = "BATON_KEY")]
    key: Option<PathBuf>,
    /// The fleet's CA certificate (DIR/ca.pem).
    #[arg(long, env = "BATON_CA")]
    ca: Option<PathBuf>,
}

impl ConnArgs {
    /// Flags and `BATON_*` variables, then the profile
    /// (`BATON_PROFILE` or `~/.config/baton/profile.yaml`), then defaults.
    fn conn(&self) -> Result<ops::Conn, ops::OpError> {
        let p = ops::profile::load().map_err(ops::OpError::usage)?;
        Ok(ops::Conn {
            url: self
                .controller
                .clone()
                .or(p.controller)
                .unwrap_or_else(|| baton_controller::ops::DEFAULT_URL.to_string()),
            insecure: self.insecure,
            insecure_any: self.insecure_any,
            tls: ops::ClientTls {
                cert: self.cert.clone().or(p.cert),
                key: self.key.clone().or(p.key),
                ca: self.ca.clone().or(p.ca),
            },
        })
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut out = std::io::stdout();
    // Not locked for the whole run: `serve` logs to stderr from its worker
    // threads, which would wait forever on a lock held by this thread.
    let mut err = std::io::stderr();
    let code = match args.command {
        Command::Serve {
            listen,
            data,
            store,
            store_ca,
            replica_id,
            lease,
            admit_rate,
            admit_burst,
            tls_dir,
            insecure,
            insecure_any,
            tls_handshake_timeout,
            tls_handshake_timeout_crowded,
            max_connections,
            max_handshakes,
            max_handshakes_per_source,
            push_rate,
            push_burst,
            ping_interval,
            log_format,
            metrics,
            http,
            retain_feedback,
            retain_clock,
            retain_audit,
            max_held_packs,
        } => serve::run(serve::Opts {
            listen,
            data,
            store,
            store_ca,
            replica_id,
            lease,
            admit_rate,
            admit_burst,
            insecure,
            insecure_any,
            tls_dir,
            tls_handshake_timeout,
            tls_handshake_timeout_crowded,
            max_connections: max_connections as usize,
            max_handshakes: max_handshakes as usize,
            max_handshakes_per_source: max_handshakes_per_source as usize,
            push_rate,
            push_burst,
            ping_interval,
            log_format,
            metrics,
            http,
            retention: baton_controller::app::retention::Retention {
                feedback: retain_feedback.0,
                clock: retain_clock.0,
                audit: retain_audit.0,
                ..Default::default()
            },
            max_held: max_held_packs as usize,
        }),
        Command::Push {
            conn,
            files,
            no_wait,
            wait,
            json,
        } => operator(&mut err, async move {
            ops::push(
                &conn.conn()?,
                &files,
                &ops::PushOpts {
                    no_wait,
                    wait,
                    json,
                },
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            )
            .await
        }),
        Command::Cancel { conn, pack, tenant } => operator(&mut err, async move {
            ops::cancel(&conn.conn()?, &tenant, &pack, &mut std::io::stdout()).await
        }),
        Command::Packs { conn, json } => operator(&mut err, async move {
            ops::packs(&conn.conn()?, json, &mut std::io::stdout()).await
        }),
        Command::Agents {
            conn,
            json,
            cmd: None,
        } => operator(&mut err, async move {
            ops::agents(&conn.conn()?, json, &mut std::io::stdout()).await
        }),
        Command::Agents {
            cmd:
                Some(AgentsCmd::Label {
                    conn,
                    agent,
                    labels,
                    remove,
                    reset,
                    tenant,
                    json,
                }),
            ..
        } => operator(&mut err, async move {
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
        Command::Agents {
            cmd:
                Some(AgentsCmd::Grant {
                    conn,
                    agent,
                    tenant,
                    revoke,
                }),
            ..
        } => operator(&mut err, async move {
            ops::grant_agent(
                &conn.conn()?,
                &agent,
                &tenant,
                revoke,
                &mut std::io::stdout(),
            )
            .await
        }),
        Command::Agents {
            cmd:
                Some(AgentsCmd::Forget {
                    conn,
                    agent,
                    tenant,
                }),
            ..
        } => operator(&mut err, async move {
            ops::forget_agent(&conn.conn()?, &agent, &tenant, &mut std::io::stdout()).await
        }),
        Command::Rollout { cmd } => {
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
            operator(&mut err, async move {
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
        Command::Watch {
            conn,
            tenant,
            pack,
            json,
        } => operator(&mut err, async move {
            ops::watch(&conn.conn()?, &tenant, &pack, json, &mut std::io::stdout()).await
        }),
        Command::Feedback {
            conn,
            pack,
            tenant,
            agent,
            since,
            limit,
            json,
        } => match since_ns(since.as_deref()) {
            Ok(since_ns) => operator(&mut err, async move {
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
            }),
            Err(e) => {
                let _ = writeln!(err, "error: {e}");
                2
            }
        },
        Command::Clock {
            conn,
            agent,
            since,
            limit,
            json,
        } => match since_ns(since.as_deref()) {
            Ok(since_ns) => operator(&mut err, async move {
                ops::clock(
                    &conn.conn()?,
                    &agent,
                    since_ns,
                    limit,
                    json,
                    &mut std::io::stdout(),
                )
                .await
            }),
            Err(e) => {
                let _ = writeln!(err, "error: {e}");
                2
            }
        },
        Command::Audit {
            conn,
            since,
            limit,
            json,
        } => match since_ns(since.as_deref()) {
            Ok(since_ns) => operator(&mut err, async move {
                ops::audit(&conn.conn()?, since_ns, limit, json, &mut std::io::stdout()).await
            }),
            Err(e) => {
                let _ = writeln!(err, "error: {e}");
                2
            }
        },
        Command::Migrate { from, to, store_ca } => {
            use baton_controller::store::postgres::{Target, import};
            let copied = Target::new(&to, store_ca.as_deref())
                .and_then(|t| import::copy_from_sqlite(&from, &t));
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
        Command::Ca { cmd } => ca_cmd::run(cmd, &mut out, &mut err),
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

/// A duration flag, with the words the pack language uses for durations.
fn duration_arg(s: &str) -> Result<std::time::Duration, String> {
    if s.trim_start().starts_with('-') {
        return Err(format!(
            "{s}: a duration cannot be negative (write it like 30s, 5m, 24h, 7d)"
        ));
    }
    baton_proto::time::parse_duration(s).map_err(|e| format!("{s}: {e}"))
}

/// How long rows are kept (`None`: for ever).
#[derive(Clone, Copy, Debug)]
struct Keep(Option<std::time::Duration>);

/// A retention flag: a duration, or `forever` (never deleted).
fn retention_arg(s: &str) -> Result<Keep, String> {
    if matches!(s, "forever" | "off" | "never") {
        return Ok(Keep(None));
    }
    let d = duration_arg(s)?;
    if d.is_zero() {
        return Err(format!(
            "{s}: a retention of zero would delete everything; write `forever` to keep everything"
        ));
    }
    Ok(Keep(Some(d)))
}

/// A count flag: a whole number, not negative.
fn count_arg(s: &str) -> Result<u32, String> {
    if s.trim_start().starts_with('-') {
        return Err(format!(
            "{s}: a count cannot be negative (0 means no limit)"
        ));
    }
    s.parse::<u32>()
        .map_err(|_| format!("{s}: expected a whole number from 0 to {}", u32::MAX))
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
fn operator(
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
