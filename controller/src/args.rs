//! The command line: every subcommand, flag and help text, and the
//! parsers of the flags' values (usage errors exit 2 through clap).

use std::path::PathBuf;

use baton_controller::ops;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "baton-controller",
    version,
    about = "baton controller: serve agents, push instruction packs, watch feedback"
)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
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
    Serve(ServeArgs),
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
        cmd: crate::ca_cmd::CaCmd,
    },
    /// Signing keys and trust lists (who may sign the packs a box runs).
    Keys {
        #[command(subcommand)]
        cmd: crate::keys_cmd::KeysCmd,
    },
    /// Push pack files to their targets: validated here first, stored by the
    /// controller, then delivered; waits for each agent's answer.
    Push(PushArgs),
    /// Withdraw a pack: every agent holding it enters its safe state.
    Cancel {
        #[command(flatten)]
        conn: ConnArgs,
        /// Pack id.
        pack: String,
        /// Tenant (default: the operator certificate's, or `default`).
        #[arg(long, default_value = "")]
        tenant: String,
        /// Only on this agent (repeat for several): the pack's other
        /// agents keep it, and no version up to the latest goes to this
        /// one again (a newer push does).
        #[arg(long = "agent", value_name = "ID")]
        agents: Vec<String>,
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
    /// Agent releases (admins): `upload FILE` (with its signed manifest,
    /// or signed here with `--sign KEY`), `list`.
    Release {
        #[command(subcommand)]
        cmd: ReleaseCmd,
    },
    /// Agent updates: a stored release rolled out over agents in stages,
    /// as a pack's rollout: `start VERSION --plan FILE`, `status [ID]`,
    /// `list`, `pause|resume|abort [ID]` (admins to act; audited).
    AgentUpdate {
        #[command(subcommand)]
        cmd: UpdateCmd,
    },
    /// Live feedback, deliveries and agent events until interrupted.
    Watch(WatchArgs),
    /// Stored feedback of a pack.
    Feedback(FeedbackArgs),
    /// An agent's clock history: source, state, offset (reference time
    /// minus the agent's system clock), jitter, uncertainty, frequency.
    Clock(ClockArgs),
    /// The audit log (admins): every push, cancel, label change and forget,
    /// refused ones included, and revocations the controller picked up.
    Audit(AuditArgs),
}

/// Release commands.
#[derive(Subcommand, Debug)]
pub(crate) enum ReleaseCmd {
    /// Store an agent build on the controller, which relays it to the
    /// boxes an update admits (they check its signature themselves).
    Upload {
        #[command(flatten)]
        conn: ConnArgs,
        /// The agent binary.
        file: PathBuf,
        /// Its signed manifest (`keys sign-release … --out M.json`).
        #[arg(long, conflicts_with_all = ["sign", "version", "arch"])]
        manifest: Option<PathBuf>,
        /// Sign it here with this release key (NAME.key) instead; with
        /// --version and --arch. The key never leaves this machine.
        #[arg(long, requires_all = ["version", "arch"])]
        sign: Option<PathBuf>,
        /// The version the build reports (with --sign).
        #[arg(long)]
        version: Option<String>,
        /// The architecture it was built for (with --sign).
        #[arg(long)]
        arch: Option<String>,
    },
    /// Every stored release, newest upload first.
    List {
        #[command(flatten)]
        conn: ConnArgs,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

/// One agent update, by id (default: the newest).
#[derive(clap::Args, Debug)]
pub(crate) struct UpdateRef {
    #[command(flatten)]
    pub(crate) conn: ConnArgs,
    /// The update's id (`agent-update list`); default the newest.
    pub(crate) id: Option<u64>,
    /// Why (pause, abort): kept in its reason and the audit log.
    #[arg(long, default_value = "")]
    pub(crate) reason: String,
    /// One JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Agent update commands.
#[derive(Subcommand, Debug)]
pub(crate) enum UpdateCmd {
    /// Start updating agents to a stored release (every open update is
    /// superseded).
    Start {
        #[command(flatten)]
        conn: ConnArgs,
        /// The release's version (`release list`).
        version: String,
        /// The plan: YAML with a pack's `rollout:` section (stages, soak,
        /// stage_deadline, windows, abort_if, max_uncertainty) and
        /// optional `targets:` (agents or labels; default every agent
        /// you see).
        #[arg(long)]
        plan: PathBuf,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// State, stage, verdicts, and each target's version and word on the
    /// update.
    Status(UpdateRef),
    /// The newest updates.
    List {
        #[command(flatten)]
        conn: ConnArgs,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Hold an update where it is.
    Pause(UpdateRef),
    /// Let a paused update go on.
    Resume(UpdateRef),
    /// End an update for good: no box is offered its release any more
    /// (name it: `agent-update list`).
    Abort(UpdateRef),
}

/// One pack's rollout, named by pack id.
#[derive(clap::Args, Debug)]
pub(crate) struct RolloutPack {
    #[command(flatten)]
    pub(crate) conn: ConnArgs,
    /// The pack.
    pub(crate) pack: String,
    /// Tenant (default: the operator certificate's, or `default`).
    #[arg(long, default_value = "")]
    pub(crate) tenant: String,
    /// One JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Rollout commands.
#[derive(Subcommand, Debug)]
pub(crate) enum RolloutCmd {
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
pub(crate) enum AgentsCmd {
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
pub(crate) struct ConnArgs {
    /// Controller URL (default: the profile's, else
    /// http://127.0.0.1:7411).
    #[arg(long, env = "BATON_CONTROLLER")]
    pub(crate) controller: Option<String>,
    /// Talk plaintext to an http:// controller (loopback only, unless
    /// --insecure-any).
    #[arg(long)]
    pub(crate) insecure: bool,
    /// Allow --insecure toward a non-loopback controller.
    #[arg(long)]
    pub(crate) insecure_any: bool,
    /// This operator's certificate (made by `ca issue-operator`).
    #[arg(long, env = "BATON_CERT")]
    pub(crate) cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, env = "BATON_KEY")]
    pub(crate) key: Option<PathBuf>,
    /// The fleet's CA certificate (DIR/ca.pem).
    #[arg(long, env = "BATON_CA")]
    pub(crate) ca: Option<PathBuf>,
}

impl ConnArgs {
    /// Flags and `BATON_*` variables, then the profile
    /// (`BATON_PROFILE` or `~/.config/baton/profile.yaml`), then defaults.
    pub(crate) fn conn(&self) -> Result<ops::Conn, ops::OpError> {
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

// `serve`: its help text is the variant's doc comment (a doc comment
// here would replace it).
#[derive(clap::Args, Debug)]
pub(crate) struct ServeArgs {
    /// Address to listen on (port 0: any free port; the bound address is
    /// written to DATA/listen.addr).
    #[arg(long, default_value = "127.0.0.1:7411")]
    pub(crate) listen: std::net::SocketAddr,
    /// Directory of the store (and of listen.addr, metrics.addr).
    #[arg(long, default_value = "baton-controller-data")]
    pub(crate) data: PathBuf,
    /// Keep the store in PostgreSQL instead of DIR/controller.db: a
    /// URL (`postgres://USER@HOST:PORT/DB`) or key=value settings
    /// (`host=… dbname=…`). The database must use the C collation.
    /// Several replicas may share it (see --replica-id, the README).
    #[arg(long, value_name = "URL", env = "BATON_STORE", hide_env_values = true)]
    pub(crate) store: Option<String>,
    /// TLS to the PostgreSQL store, its certificate checked against
    /// this CA (PEM); TLS is then required. Without it the connection
    /// is plaintext, and a URL asking for TLS is refused.
    #[arg(long, value_name = "FILE", requires = "store")]
    pub(crate) store_ca: Option<PathBuf>,
    /// This replica's id on the PostgreSQL store (default: host name,
    /// process id and a random suffix). A restart under the same id
    /// fences its earlier self; two live replicas must not share one.
    #[arg(long, value_name = "NAME", requires = "store")]
    pub(crate) replica_id: Option<String>,
    /// How long this replica's lease holds without a renewal (renewed
    /// every tenth of it): paused or cut off longer, it stops.
    #[arg(
        long,
        default_value = "10s",
        value_name = "DURATION",
        requires = "store"
    )]
    pub(crate) lease: String,
    /// Reads this replica runs at once on the PostgreSQL store; more
    /// wait their turn.
    #[arg(
        long,
        default_value_t = baton_sql::postgres::DEFAULT_READERS,
        value_name = "N",
        requires = "store"
    )]
    pub(crate) store_readers: usize,
    /// Connections (server processes) the reads share on the PostgreSQL
    /// store, their statements pipelined; at most one per read at once.
    /// More when slow pages hold up quick reads queued behind them.
    #[arg(
        long,
        default_value_t = baton_sql::postgres::DEFAULT_READ_CONNECTIONS,
        value_name = "N",
        requires = "store"
    )]
    pub(crate) store_read_connections: usize,
    /// New agent streams admitted per second (0: no bound); past it a
    /// stream is refused UNAVAILABLE and the agent retries after its
    /// jittered backoff (a replica taking over a dead one's agents).
    #[arg(long, default_value_t = 500.0)]
    pub(crate) admit_rate: f64,
    /// New agent streams admitted at once (token bucket burst).
    #[arg(long, default_value_t = 100.0)]
    pub(crate) admit_burst: f64,
    /// mTLS with the certificates of this CA directory (server.pem,
    /// server-key.pem, ca.pem for clients, revoked.txt), made by
    /// `ca init`; re-read when they change.
    #[arg(long)]
    pub(crate) tls_dir: Option<PathBuf>,
    /// Serve plaintext instead (loopback only, unless --insecure-any).
    #[arg(long)]
    pub(crate) insecure: bool,
    /// Allow --insecure on a non-loopback address.
    #[arg(long)]
    pub(crate) insecure_any: bool,
    /// A TLS handshake not done by then is dropped.
    #[arg(long, default_value = "10s")]
    pub(crate) tls_handshake_timeout: String,
    /// The same while the handshake budget is crowded (three quarters
    /// of --max-handshakes in progress), for every handshake in
    /// progress.
    #[arg(long, default_value = "3s")]
    pub(crate) tls_handshake_timeout_crowded: String,
    /// Live connections at most (TLS handshakes in progress included);
    /// a connection over it is answered RESOURCE_EXHAUSTED on every
    /// call. Needs about as many file descriptors (LimitNOFILE).
    #[arg(long, default_value_t = baton_server::accept::DEFAULT_MAX_CONNECTIONS as u32, value_parser = count_arg, allow_hyphen_values = true)]
    pub(crate) max_connections: u32,
    /// TLS handshakes in progress at once; more are refused with a TLS
    /// alert the CLI reads as "at its limit".
    #[arg(long, default_value_t = 256, value_parser = count_arg, allow_hyphen_values = true)]
    pub(crate) max_handshakes: u32,
    /// TLS handshakes in progress at once from one IPv4 address or one
    /// IPv6 /64.
    #[arg(long, default_value_t = 16, value_parser = count_arg, allow_hyphen_values = true)]
    pub(crate) max_handshakes_per_source: u32,
    /// Pushes per second to agents (token bucket rate).
    #[arg(long, default_value_t = 3000.0)]
    pub(crate) push_rate: f64,
    /// Pushes that may go out at once (token bucket burst).
    #[arg(long, default_value_t = 6000.0)]
    pub(crate) push_burst: f64,
    /// How often agent streams are pinged (three silent intervals end one).
    #[arg(long, default_value = "10s")]
    pub(crate) ping_interval: String,
    /// Log output on stderr: auto (journald's format when stderr is
    /// the journal, else text), text, json or journald.
    #[arg(long, default_value = "auto", value_name = "auto|text|json|journald")]
    pub(crate) log_format: baton_service::log::LogFormat,
    /// Serve Prometheus metrics at http://ADDR/metrics (IP:PORT;
    /// plaintext and unauthenticated, read-only; port 0: any free
    /// port, written to DATA/metrics.addr).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<std::net::SocketAddr>,
    /// Serve the web dashboard at ADDR (IP:PORT; port 0: any free
    /// port, written to DATA/http.addr): HTTPS with the controller's
    /// certificate under --tls-dir (operators log in with a token of
    /// `ca issue-operator --token`), plaintext only with --insecure and
    /// on loopback unless --insecure-any.
    #[arg(long, value_name = "ADDR", env = "BATON_HTTP")]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// Keep feedback this long (a duration, or `forever`); older rows
    /// are deleted in small batches.
    #[arg(long, default_value = "30d", value_parser = retention_arg, allow_hyphen_values = true)]
    pub(crate) retain_feedback: Keep,
    /// Keep clock history this long (a duration, or `forever`).
    #[arg(long, default_value = "7d", value_parser = retention_arg, allow_hyphen_values = true)]
    pub(crate) retain_clock: Keep,
    /// Keep the audit log this long (a duration, or `forever`).
    #[arg(long, default_value = "forever", value_parser = retention_arg, allow_hyphen_values = true)]
    pub(crate) retain_audit: Keep,
    /// Most packs an agent's hello or held update may list (its own
    /// max-packs is the tighter bound when smaller); more is refused.
    #[arg(long, default_value_t = 1024, value_parser = count_arg, allow_hyphen_values = true)]
    pub(crate) max_held_packs: u32,
    /// The fleet's trust lists (a chain made by `keys sign-list`), relayed
    /// to every agent after its Welcome: agents take the lists newer than
    /// theirs that their root verifies (revocations reach boxes without a
    /// visit). Read at start and whenever the file changes, then relayed
    /// to every agent connected.
    #[arg(long, value_name = "FILE")]
    pub(crate) trust_chain: Option<PathBuf>,
}

// `push` (help: the variant's doc comment).
#[derive(clap::Args, Debug)]
pub(crate) struct PushArgs {
    #[command(flatten)]
    pub(crate) conn: ConnArgs,
    /// Pack files (YAML).
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
    /// Return once stored, without waiting for agents.
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// How long to wait for agents' answers.
    #[arg(long, default_value = "30s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub(crate) wait: std::time::Duration,
    /// One JSON object per line.
    #[arg(long)]
    pub(crate) json: bool,
    /// Sign each pack with this key (NAME.key, from `keys new`): its
    /// signature of the tenant and the pack's bytes goes as the text's
    /// last line; agents whose trust list names the key for the tenant
    /// take it.
    #[arg(long, value_name = "KEY")]
    pub(crate) sign: Option<PathBuf>,
}

// `watch` (help: the variant's doc comment).
#[derive(clap::Args, Debug)]
pub(crate) struct WatchArgs {
    #[command(flatten)]
    pub(crate) conn: ConnArgs,
    /// Only this tenant.
    #[arg(long, default_value = "")]
    pub(crate) tenant: String,
    /// Only this pack.
    #[arg(long, default_value = "")]
    pub(crate) pack: String,
    /// One JSON object per line.
    #[arg(long)]
    pub(crate) json: bool,
}

// `feedback` (help: the variant's doc comment).
#[derive(clap::Args, Debug)]
pub(crate) struct FeedbackArgs {
    #[command(flatten)]
    pub(crate) conn: ConnArgs,
    /// Pack id.
    #[arg(long)]
    pub(crate) pack: String,
    /// Tenant (default: the operator certificate's, or `default`).
    #[arg(long, default_value = "")]
    pub(crate) tenant: String,
    /// Only this agent.
    #[arg(long)]
    pub(crate) agent: Option<String>,
    /// Only feedback received at or after this RFC 3339 instant.
    #[arg(long)]
    pub(crate) since: Option<String>,
    /// At most this many entries (0: all).
    #[arg(long, default_value_t = 0, value_parser = count_arg, allow_hyphen_values = true)]
    pub(crate) limit: u32,
    /// One JSON object per line.
    #[arg(long)]
    pub(crate) json: bool,
}

// `clock` (help: the variant's doc comment).
#[derive(clap::Args, Debug)]
pub(crate) struct ClockArgs {
    #[command(flatten)]
    pub(crate) conn: ConnArgs,
    /// The agent.
    pub(crate) agent: String,
    /// Only reports at or after this RFC 3339 instant.
    #[arg(long)]
    pub(crate) since: Option<String>,
    /// The newest N reports only (0: the server's cap).
    #[arg(long, default_value_t = 0, value_parser = count_arg, allow_hyphen_values = true)]
    pub(crate) limit: u32,
    /// One JSON object per line.
    #[arg(long)]
    pub(crate) json: bool,
}

// `audit` (help: the variant's doc comment).
#[derive(clap::Args, Debug)]
pub(crate) struct AuditArgs {
    #[command(flatten)]
    pub(crate) conn: ConnArgs,
    /// Only records at or after this RFC 3339 instant.
    #[arg(long)]
    pub(crate) since: Option<String>,
    /// The newest N records only (0: the server's cap).
    #[arg(long, default_value_t = 0, value_parser = count_arg, allow_hyphen_values = true)]
    pub(crate) limit: u32,
    /// One JSON object per line.
    #[arg(long)]
    pub(crate) json: bool,
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
pub(crate) struct Keep(pub(crate) Option<std::time::Duration>);

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
