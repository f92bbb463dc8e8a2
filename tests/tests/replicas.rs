//! Three controller replicas on one PostgreSQL database (`serve --store
//! URL --replica-id NAME`) and a real agent that knows all three: when the
//! replica holding the agent is killed, or paused past its lease, the agent
//! carries on with another, its firings run on, and the store holds every
//! execution exactly once; a replica that wakes after its lease ran out
//! writes nothing and exits; one that wakes within its lease is fenced by
//! the agent's session generation and serves on; replicas started
//! together on an empty database migrate it once; PostgreSQL itself
//! restarted mid-run leaves every replica serving and loses nothing.
//!
//! The agents' ownership (`owner`, `session_gen`) and the replicas' leases
//! are read straight from the database; feedback through a live replica's
//! `feedback --json`.
//!
//! The tests of this file run one at a time ([`serial`]): each starts
//! three controllers, an agent and a database, and a short lease must not
//! run out because a neighbouring test took the machine's two cores.
//! `BATON_TEST_SHOW=1` prints the processes' logs at the end of the pause
//! tests (with `--nocapture`).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use baton_e2e::fleet::{Agent, Controller, json_lines, start_agent_clock, start_controller_args};
use baton_e2e::{signal, wait_exit, wait_until};

/// Generous: the machine may be loaded.
const WAIT: Duration = Duration::from_secs(60);

/// One test of this file at a time (see the module doc).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Replica `name` on the database `url`, its data in `dir/name`.
fn replica(dir: &Path, url: &str, name: &str, lease: &str) -> Controller {
    start_controller_args(
        &dir.join(name),
        "127.0.0.1:0",
        &["--store", url, "--replica-id", name, "--lease", lease],
    )
}

/// A direct connection to the replicas' database.
struct Db(postgres::Client);

/// An agent's row: who holds its stream, under which generation.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Ownership {
    owner: String,
    owner_epoch: i64,
    session_gen: i64,
    connected: bool,
    last_seen_ns: i64,
}

impl Db {
    fn connect(url: &str) -> Db {
        Db(postgres::Client::connect(url, postgres::NoTls).expect("connect to the test database"))
    }

    fn agent(&mut self, id: &str) -> Option<Ownership> {
        self.0
            .query_opt(
                "SELECT owner, owner_epoch, session_gen, connected, last_seen_ns \
                 FROM agents WHERE id = $1",
                &[&id],
            )
            .expect("read the agent's row")
            .map(|r| Ownership {
                owner: r.get(0),
                owner_epoch: r.get(1),
                session_gen: r.get(2),
                connected: r.get::<_, i32>(3) != 0,
                last_seen_ns: r.get(4),
            })
    }

    /// The database's clock, in µs since the epoch (what leases run on).
    fn now_us(&mut self) -> i64 {
        self.0
            .query_one(
                "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT",
                &[],
            )
            .expect("read the database's clock")
            .get(0)
    }

    /// `(epoch, expires_us)` of a replica's lease row.
    fn lease(&mut self, replica: &str) -> Option<(i64, i64)> {
        self.0
            .query_opt(
                "SELECT epoch, expires_us FROM replicas WHERE id = $1",
                &[&replica],
            )
            .expect("read the lease")
            .map(|r| (r.get(0), r.get(1)))
    }

    /// Whether `replica`'s lease has run out by the database's clock.
    fn lease_expired(&mut self, replica: &str) -> bool {
        let now = self.now_us();
        self.lease(replica).is_some_and(|(_, exp)| exp <= now)
    }

    /// The packs stored, as `tenant/pack`.
    fn packs(&mut self) -> Vec<String> {
        self.0
            .query("SELECT tenant, pack FROM packs ORDER BY 1, 2", &[])
            .expect("read the packs")
            .iter()
            .map(|r| format!("{}/{}", r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect()
    }

    fn migrations(&mut self) -> Vec<i64> {
        self.0
            .query("SELECT version FROM schema_migrations ORDER BY 1", &[])
            .expect("read schema_migrations")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    fn replicas(&mut self) -> Vec<(String, i64)> {
        self.0
            .query("SELECT id, epoch FROM replicas ORDER BY 1", &[])
            .expect("read the replicas")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }
}

/// Three replicas `r0`, `r1`, `r2` (leases as given), agent `a1` dialling
/// them in that order, and the database.
struct Site {
    dir: tempfile::TempDir,
    db: Db,
    replicas: Vec<Controller>,
    agent: Agent,
}

impl Site {
    fn start(leases: [&str; 3]) -> Option<Site> {
        let url = baton_testpg::fresh_database()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let replicas: Vec<Controller> = leases
            .iter()
            .enumerate()
            .map(|(i, lease)| replica(dir.path(), &url, &format!("r{i}"), lease))
            .collect();
        let agent = start_agent_clock(
            &dir.path().join("a1"),
            "a1",
            &replicas[0].url,
            &[
                "--controller",
                &replicas[1].url,
                "--controller",
                &replicas[2].url,
            ],
        );
        let db = Db::connect(&url);
        Some(Site {
            dir,
            db,
            replicas,
            agent,
        })
    }

    /// The replica named `name`.
    fn replica(&self, name: &str) -> &Controller {
        let i: usize = name
            .strip_prefix('r')
            .and_then(|n| n.parse().ok())
            .expect("a replica name");
        &self.replicas[i]
    }

    fn replica_mut(&mut self, name: &str) -> &mut Controller {
        let i: usize = name
            .strip_prefix('r')
            .and_then(|n| n.parse().ok())
            .expect("a replica name");
        &mut self.replicas[i]
    }

    /// Every replica's log and the agent's, for a failed assertion.
    fn logs(&self) -> String {
        let mut s = String::new();
        for (i, r) in self.replicas.iter().enumerate() {
            s += &format!("--- r{i} ---\n{}", r.log());
        }
        s + &format!("--- agent ---\n{}", self.agent.log())
    }

    /// Waits until the agent's row says a replica other than the ones in
    /// `not` holds its stream, connected, under a generation above
    /// `above`.
    fn owned(&mut self, not: &[&str], above: i64) -> Ownership {
        let mut last = None;
        let ok = wait_until(WAIT, || {
            last = self.db.agent("a1");
            last.as_ref().is_some_and(|o| {
                o.connected
                    && !o.owner.is_empty()
                    && !not.contains(&o.owner.as_str())
                    && o.session_gen > above
            })
        });
        assert!(
            ok,
            "the agent was not taken over (not by {not:?}, generation above {above}): {last:?}\n{}",
            self.logs()
        );
        last.expect("checked above")
    }

    /// Pushes `yaml` through `via`.
    fn push(&self, via: &str, name: &str, yaml: &str) -> std::process::Output {
        let path = self.dir.path().join(name);
        std::fs::write(&path, yaml).expect("write pack");
        self.replica(via)
            .ctl(&["push", path.to_str().expect("utf-8")])
    }

    /// Pushes `yaml` through `via` without waiting for the agents: the
    /// exit status says whether it was stored.
    fn push_no_wait(&self, via: &str, name: &str, yaml: &str) -> std::process::Output {
        let path = self.dir.path().join(name);
        std::fs::write(&path, yaml).expect("write pack");
        self.replica(via)
            .ctl(&["push", "--no-wait", path.to_str().expect("utf-8")])
    }

    /// Stored feedback of pack `p`, read through replica `via`.
    fn feedback(&self, via: &str) -> Vec<serde_json::Value> {
        self.replica(via).feedback("p")
    }

    /// How many executions of pack `p` (version `version`, any if `None`)
    /// the store holds, read through `via`.
    fn executed(&self, via: &str, version: Option<u64>) -> usize {
        self.feedback(via)
            .iter()
            .filter(|f| f["event"] == "executed")
            .filter(|f| version.is_none_or(|v| f["version"] == v))
            .count()
    }

    /// Waits until the store holds more than `n` executions of `p`.
    fn executed_beyond(&self, via: &str, n: usize, what: &str) {
        assert!(
            wait_until(WAIT, || self.executed(via, None) > n),
            "feedback did not reach {n} executions {what}\n{}",
            self.logs()
        );
    }
}

/// Pack `p`, version `v`, for agent `a1`: a toggle every 100 ms.
fn ticking(v: u64) -> String {
    format!(
        "pack: p\nversion: {v}\ntargets: {{agents: [a1]}}\ninstructions:\n  \
         - {{id: tick, action: gpio.toggle, params: {{line: 5}}, every: 100ms}}\n"
    )
}

/// Every execution exactly once: no execution written twice to the
/// device; every one written is stored (read through `via`), and stored
/// once; nothing stored that did not happen; the agent's feedback seqs
/// have no hole the next entry does not report as dropped.
fn exactly_once(site: &Site, via: &str) {
    let fired = || -> Vec<String> {
        site.agent
            .writes()
            .iter()
            .filter_map(|w| w["execution_id"].as_str().map(str::to_owned))
            .collect()
    };
    let before = fired();
    let mut twice: HashMap<&str, usize> = HashMap::new();
    for id in &before {
        *twice.entry(id).or_default() += 1;
    }
    twice.retain(|_, n| *n > 1);
    assert!(twice.is_empty(), "written to the device twice: {twice:?}");

    // Everything written by now reaches the store (the agent keeps what
    // is not acknowledged and sends it to whichever replica it reaches).
    let stored_ids = |rows: &[serde_json::Value]| -> BTreeSet<String> {
        rows.iter()
            .filter(|f| f["event"] == "executed" && f["outcome"] == "ok")
            .filter_map(|f| f["execution_id"].as_str().map(str::to_owned))
            .collect()
    };
    let mut rows = Vec::new();
    let all_stored = wait_until(WAIT, || {
        rows = site.feedback(via);
        let stored = stored_ids(&rows);
        before.iter().all(|id| stored.contains(id))
    });
    let stored = stored_ids(&rows);
    let missing: Vec<&String> = before.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(
        all_stored,
        "{} executions written to the device were never stored, e.g. {:?}\n{}",
        missing.len(),
        missing.iter().take(5).collect::<Vec<_>>(),
        site.logs()
    );

    // Stored once: one entry per (execution, event), one per seq.
    let mut per: HashMap<(String, String), usize> = HashMap::new();
    for f in &rows {
        if let Some(id) = f["execution_id"].as_str().filter(|id| !id.is_empty()) {
            let event = f["event"].as_str().unwrap_or_default().to_owned();
            *per.entry((id.to_owned(), event)).or_default() += 1;
        }
    }
    per.retain(|_, n| *n > 1);
    assert!(per.is_empty(), "stored twice: {per:?}");

    // Nothing stored that the device did not see.
    let after: BTreeSet<String> = fired().into_iter().collect();
    let invented: Vec<&String> = stored.iter().filter(|id| !after.contains(*id)).collect();
    assert!(
        invented.is_empty(),
        "stored as executed but never written to the device: {invented:?}"
    );

    // The seqs: each stored entry follows the one before it, or says how
    // many were dropped between them.
    let mut seqs: Vec<(u64, u64)> = rows
        .iter()
        .map(|f| {
            (
                f["seq"].as_u64().expect("seq"),
                f["dropped_before"].as_u64().expect("dropped_before"),
            )
        })
        .collect();
    seqs.sort_unstable();
    let n = seqs.len();
    seqs.dedup_by_key(|s| s.0);
    assert_eq!(seqs.len(), n, "a feedback seq stored twice");
    let holes: Vec<(u64, u64, u64)> = seqs
        .windows(2)
        .filter(|w| w[1].0 != w[0].0 + 1 + w[1].1)
        .map(|w| (w[0].0, w[1].0, w[1].1))
        .collect();
    assert!(
        holes.is_empty(),
        "holes in the agent's seqs not reported as dropped (seq, next, dropped_before): {holes:?}"
    );
    assert!(
        seqs.first().is_some_and(|&(s, d)| s == 1 + d),
        "the first stored seq is not the agent's first: {:?}",
        seqs.first()
    );
    eprintln!(
        "{} executions written to the device, {} stored entries (seqs {:?} to {:?})",
        before.len(),
        rows.len(),
        seqs.first(),
        seqs.last()
    );
}

/// A site (replicas with these leases) whose agent runs pack `p` v1,
/// ticking, pushed through the replica it connected to first, with ten
/// firings stored (`what`: the moment, for the failure message): where
/// each fault test starts. `None`: no PostgreSQL here, and not required.
fn start_ticking(leases: [&str; 3], what: &str) -> Option<(Site, Ownership)> {
    let mut site = Site::start(leases)?;
    let first = site.owned(&[], 0);
    let o = site.push(&first.owner, "p1.yaml", &ticking(1));
    assert!(
        o.status.success(),
        "push: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    site.executed_beyond(&first.owner, 10, what);
    Some((site, first))
}

#[test]
fn a_killed_replica_hands_its_agent_over_and_no_execution_is_lost_or_doubled() {
    let _serial = serial();
    let Some((mut site, first)) = start_ticking(["10s", "10s", "10s"], "before the kill") else {
        return; // not installed and not required: `baton_testpg` said so
    };
    let before_kill = site.executed(&first.owner, None);
    let fired_before = site.agent.writes().len();

    site.replica_mut(&first.owner).kill9();

    // The agent says hello to another replica, which raises its
    // generation and takes the row.
    let second = site.owned(&[&first.owner], first.session_gen);
    // The pack ran on through the switch (the device saw it) and its
    // feedback now reaches the store through the new owner.
    assert!(
        wait_until(WAIT, || site.agent.writes().len() > fired_before + 20),
        "the pack stopped firing\n{}",
        site.logs()
    );
    site.executed_beyond(&second.owner, before_kill + 20, "after the kill");

    // The new owner's pushes carry the new generation: the agent takes
    // them (a replacement version runs).
    let o = site.push(&second.owner, "p2.yaml", &ticking(2));
    assert!(
        o.status.success(),
        "push v2: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        wait_until(WAIT, || site.executed(&second.owner, Some(2)) >= 5),
        "version 2 pushed through the new owner did not run\n{}",
        site.logs()
    );
    let now = site.db.agent("a1").expect("the agent's row");
    assert_eq!(
        (now.owner.as_str(), now.session_gen),
        (second.owner.as_str(), second.session_gen),
        "the agent moved again without a kill\n{}",
        site.logs()
    );
    exactly_once(&site, &second.owner);
}

#[test]
fn a_replica_paused_past_its_lease_loses_its_agent_and_writes_nothing_when_it_wakes() {
    let _serial = serial();
    // Only the paused replica has a short lease: the others must keep
    // theirs on a loaded machine.
    let Some((mut site, first)) = start_ticking(["3s", "10s", "10s"], "before the pause") else {
        return;
    };
    assert_eq!(
        first.owner,
        "r0",
        "the agent dials its first controller first\n{}",
        site.logs()
    );

    signal(&site.replica("r0").proc, libc::SIGSTOP);
    let paused_at = Instant::now();
    // The agent hears nothing for three ping intervals and moves on.
    let second = site.owned(&["r0"], first.session_gen);
    let moved_after = paused_at.elapsed();
    // The paused replica's lease runs out (by the database's clock).
    assert!(
        wait_until(WAIT, || site.db.lease_expired("r0")),
        "r0's lease did not run out while it was paused: {:?} (now {})",
        site.db.lease("r0"),
        site.db.now_us()
    );
    let stored = site.executed(&second.owner, None);
    site.executed_beyond(&second.owner, stored + 10, "through the new owner");
    let (epoch, expired_at) = site.db.lease("r0").expect("r0's lease row");

    let woken_at_us = site.db.now_us();
    signal(&site.replica("r0").proc, libc::SIGCONT);
    // A push through the woken replica: whether it is still serving or
    // already stopping, it must not be stored.
    let late = site.push_no_wait(
        "r0",
        "late.yaml",
        "pack: late\nversion: 1\ntargets: {agents: [a1]}\ninstructions:\n  \
         - {id: once, action: gpio.write, params: {line: 6, value: 1}, at: 2099-01-01T00:00:00Z}\n",
    );
    let status = wait_exit(&mut site.replica_mut("r0").proc, Duration::from_secs(30));
    let log = site.replica("r0").log();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the woken replica did not exit with an error: {status:?}\n{log}"
    );
    assert!(log.contains("lease is lost"), "{log}");
    assert!(
        log.contains("this replica's lease on the store ran out"),
        "{log}"
    );
    assert!(
        !late.status.success(),
        "a push through the woken replica succeeded: {}{}",
        String::from_utf8_lossy(&late.stdout),
        String::from_utf8_lossy(&late.stderr)
    );
    assert_eq!(
        site.db.packs(),
        ["default/p"],
        "the woken replica stored a push"
    );
    // Its lease was not renewed after it woke.
    assert_eq!(
        site.db.lease("r0"),
        Some((epoch, expired_at)),
        "the woken replica wrote its lease row"
    );
    assert!(expired_at <= woken_at_us);
    // The agent's row is the new owner's, untouched by the woken replica
    // (its stream's end would have marked the agent disconnected).
    let row = site.db.agent("a1").expect("the agent's row");
    assert_eq!(
        (
            row.owner.as_str(),
            row.owner_epoch,
            row.session_gen,
            row.connected
        ),
        (
            second.owner.as_str(),
            second.owner_epoch,
            second.session_gen,
            true
        ),
        "{}",
        site.logs()
    );
    // And the new owner keeps it current.
    let seen = row.last_seen_ns;
    assert!(
        wait_until(WAIT, || site
            .db
            .agent("a1")
            .is_some_and(|r| r.last_seen_ns > seen
                && r.owner == second.owner
                && r.connected)),
        "the agent's last_seen did not advance: {:?}\n{}",
        site.db.agent("a1"),
        site.logs()
    );
    let stored = site.executed(&second.owner, None);
    site.executed_beyond(&second.owner, stored + 5, "after the woken replica exited");
    exactly_once(&site, &second.owner);
    eprintln!(
        "agent moved {moved_after:?} after the pause; the woken replica exited with {status:?}"
    );
    if std::env::var_os("BATON_TEST_SHOW").is_some() {
        eprintln!("{}\nlate push: {late:?}", site.logs());
    }
}

#[test]
fn replicas_started_together_on_an_empty_database_migrate_it_once_and_all_serve() {
    let _serial = serial();
    let Some(url) = baton_testpg::fresh_database() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let replicas: Vec<Controller> = std::thread::scope(|s| {
        let started: Vec<_> = (0..3)
            .map(|i| {
                let (dir, url) = (dir.path(), url.as_str());
                s.spawn(move || replica(dir, url, &format!("r{i}"), "10s"))
            })
            .collect();
        started
            .into_iter()
            .map(|h| h.join().expect("a replica started"))
            .collect()
    });
    let mut db = Db::connect(&url);
    let versions = db.migrations();
    assert!(!versions.is_empty());
    // One replica applied every migration; the others found them done.
    let applied: Vec<usize> = replicas
        .iter()
        .map(|r| r.log().matches("store: schema migrated").count())
        .collect();
    assert_eq!(
        applied.iter().sum::<usize>(),
        versions.len(),
        "migrations applied per replica: {applied:?}"
    );
    assert_eq!(
        applied.iter().filter(|n| **n > 0).count(),
        1,
        "migrations applied per replica: {applied:?}"
    );
    assert_eq!(
        db.replicas(),
        [("r0".into(), 1), ("r1".into(), 1), ("r2".into(), 1)]
    );
    // Each serves writes and reads: a pack pushed through each is seen
    // through every one.
    for (i, r) in replicas.iter().enumerate() {
        let path = dir.path().join(format!("q{i}.yaml"));
        std::fs::write(
            &path,
            format!(
                "pack: q{i}\nversion: 1\ntargets: {{agents: [nobody]}}\ninstructions:\n  \
                 - {{id: t, action: gpio.toggle, params: {{line: 1}}, every: 1s}}\n"
            ),
        )
        .expect("write pack");
        // Exit 4: stored, but no agent is targeted (none runs here).
        let o = r.ctl(&["push", "--no-wait", path.to_str().expect("utf-8")]);
        assert_eq!(
            o.status.code(),
            Some(4),
            "push through r{i}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    for (i, r) in replicas.iter().enumerate() {
        let o = r.ctl(&["packs", "--json"]);
        assert!(o.status.success(), "packs through r{i}");
        let mut packs: Vec<String> = json_lines(&o.stdout)
            .iter()
            .filter_map(|p| p["pack"].as_str().map(str::to_owned))
            .collect();
        packs.sort();
        assert_eq!(packs, ["q0", "q1", "q2"], "packs through r{i}");
    }
    for r in &replicas {
        assert!(
            !r.log().contains("ERROR"),
            "a replica logged an error:\n{}",
            r.log()
        );
    }
}

#[test]
fn a_replica_paused_within_its_lease_is_fenced_by_the_agents_generation_and_serves_on() {
    let _serial = serial();
    // A lease far longer than the pause: what stops the woken replica's
    // stale stream is the agent's generation, not the lease.
    let Some((mut site, first)) = start_ticking(["30s", "10s", "10s"], "before the pause") else {
        return;
    };
    assert_eq!(
        first.owner,
        "r0",
        "the agent dials its first controller first\n{}",
        site.logs()
    );
    let ended = |site: &Site| {
        site.replica("r0")
            .log()
            .matches("link stream ended")
            .count()
    };
    let ended_before = ended(&site);

    signal(&site.replica("r0").proc, libc::SIGSTOP);
    let second = site.owned(&["r0"], first.session_gen);
    let woken_at_us = site.db.now_us();
    let (epoch, expires) = site.db.lease("r0").expect("r0's lease row");
    assert!(
        expires > woken_at_us,
        "r0's lease ran out during a short pause: the machine is too slow for this test"
    );
    signal(&site.replica("r0").proc, libc::SIGCONT);

    // The woken replica finds its stream gone (whatever it tried to write
    // for the agent was refused), keeps its lease and serves on.
    assert!(
        wait_until(WAIT, || ended(&site) > ended_before),
        "the woken replica never ended its stale stream\n{}",
        site.logs()
    );
    assert!(
        wait_until(WAIT, || site
            .db
            .lease("r0")
            .is_some_and(|(e, exp)| e == epoch && exp > expires)),
        "the woken replica did not renew its lease: {:?}\n{}",
        site.db.lease("r0"),
        site.logs()
    );
    assert!(
        matches!(site.replica_mut("r0").proc.try_wait(), Ok(None)),
        "the woken replica exited\n{}",
        site.logs()
    );
    let row = site.db.agent("a1").expect("the agent's row");
    assert_eq!(
        (
            row.owner.as_str(),
            row.owner_epoch,
            row.session_gen,
            row.connected
        ),
        (
            second.owner.as_str(),
            second.owner_epoch,
            second.session_gen,
            true
        ),
        "the woken replica's stale stream wrote the agent's row\n{}",
        site.logs()
    );

    // A push through the woken replica is stored (its lease holds) and
    // reaches the agent through its owner: told through the store's
    // events as they commit (a notification; 200 ms polls at worst), not at the owner's resync of its
    // agents' rows (every 30 s from the stream's start).
    let pushed = Instant::now();
    let o = site.push_no_wait("r0", "p2.yaml", &ticking(2));
    assert!(
        o.status.success(),
        "push through the woken replica: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        wait_until(WAIT, || site.executed(&second.owner, Some(2)) >= 5),
        "version 2 pushed through the woken replica did not run\n{}",
        site.logs()
    );
    let took = pushed.elapsed();
    assert!(
        took < Duration::from_secs(12),
        "a push through another replica took {took:?} to run five firings: \
         the owner heard of it at a resync, not through the events\n{}",
        site.logs()
    );
    let row = site.db.agent("a1").expect("the agent's row");
    assert_eq!(
        (row.owner.as_str(), row.session_gen),
        (second.owner.as_str(), second.session_gen),
        "{}",
        site.logs()
    );
    exactly_once(&site, "r0");
    if std::env::var_os("BATON_TEST_SHOW").is_some() {
        eprintln!("{}", site.logs());
    }
}

#[test]
fn postgres_restarted_mid_run_leaves_every_replica_serving_and_loses_nothing_acknowledged() {
    let _serial = serial();
    let Some((mut site, first)) = start_ticking(["10s", "10s", "10s"], "before the restart") else {
        return; // not installed and not required: `baton_testpg` said so
    };
    let before = site.executed(&first.owner, None);

    // A fast shutdown ends every replica's connections (the lease
    // renewers' too) and keeps what was committed; the server comes back
    // on the same port well within the 10 s lease.
    baton_testpg::restart();

    // Every replica reconnects and serves on: none lost its lease, none
    // exited, and the agent's feedback reaches the store again.
    site.executed_beyond(&first.owner, before + 20, "after PostgreSQL restarted");
    for (i, r) in site.replicas.iter_mut().enumerate() {
        assert!(
            matches!(r.proc.try_wait(), Ok(None)),
            "replica r{i} stopped when PostgreSQL restarted:\n{}",
            r.log()
        );
    }
    // A push through a replica that does not hold the agent still
    // reaches it (the events flow again between replicas).
    let other = ["r0", "r1", "r2"]
        .into_iter()
        .find(|r| *r != first.owner)
        .expect("three replicas");
    let o = site.push(other, "p2.yaml", &ticking(2));
    assert!(
        o.status.success(),
        "push v2 through {other} after the restart: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        site.logs()
    );
    assert!(
        wait_until(WAIT, || site.executed(other, Some(2)) >= 5),
        "version 2 pushed after PostgreSQL restarted did not run\n{}",
        site.logs()
    );
    assert!(
        site.logs().contains("reconnected to PostgreSQL"),
        "no replica said it reconnected\n{}",
        site.logs()
    );
    // Every execution the device saw before, during and after the outage
    // is stored once: nothing the store acknowledged was lost.
    exactly_once(&site, other);
}

#[test]
fn a_rollout_moves_on_once_across_replicas_and_survives_a_replica_kill() {
    let _serial = serial();
    let Some((mut site, first)) = start_ticking(["10s", "10s", "10s"], "before the rollout") else {
        return; // not installed and not required: `baton_testpg` said so
    };
    let rollout = "rollout:\n  stages: [{percent: 100}]\n  soak: 3s\n  min_firings: 5\n  abort_if: {failed_percent: 10}\n";
    let o = site.push(&first.owner, "p2.yaml", &format!("{}{rollout}", ticking(2)));
    assert!(
        o.status.success(),
        "push v2: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let status = |site: &Site, via: &str| -> serde_json::Value {
        let o = site.replica(via).ctl(&["rollout", "status", "p", "--json"]);
        json_lines(&o.stdout).pop().unwrap_or_default()
    };
    assert!(
        wait_until(WAIT, || status(&site, &first.owner)["members"] == 1),
        "the stage never started: {}\n{}",
        status(&site, &first.owner),
        site.logs()
    );
    // The replica holding the agent dies mid-stage; another takes the
    // agent, and the rollout (stepped by every live replica) completes.
    site.replica_mut(&first.owner).kill9();
    let second = site.owned(&[&first.owner], first.session_gen);
    assert!(
        wait_until(WAIT, || status(&site, &second.owner)["state"]
            == "completed"),
        "{}\n{}",
        status(&site, &second.owner),
        site.logs()
    );
    assert!(wait_until(WAIT, || site.executed(&second.owner, Some(2)) >= 5));
    // Each step was taken once, whichever replica took it.
    let audit =
        String::from_utf8_lossy(&site.replica(&second.owner).ctl(&["audit", "--json"]).stdout)
            .into_owned();
    for step in [
        "stage 1 of 1 started",
        "stage 1 verdict pass",
        "completed: every stage passed",
    ] {
        assert_eq!(audit.matches(step).count(), 1, "{step}: {audit}");
    }
    exactly_once(&site, &second.owner);
}

/// An agent update started through one replica reaches the agent whatever
/// replica holds its stream (every replica's driver may take the step;
/// the offer goes to the stream through the store's events), and the
/// box's word on it is read through any replica: here the box has no
/// trust directory, so it refuses the release (it takes none it cannot
/// check), and says why. The release is stored once and listed by each.
#[test]
fn an_update_started_through_any_replica_reaches_the_agent_and_its_word_every_replica() {
    let _serial = serial();
    let Some(mut site) = Site::start(["10s", "10s", "10s"]) else {
        return; // not installed and not required: `baton_testpg` said so
    };
    let owner = site.owned(&[], 0).owner;
    let via = ["r0", "r1", "r2"]
        .into_iter()
        .find(|r| *r != owner)
        .expect("another replica");
    let d = site.dir.path().to_path_buf();
    let keys = d.join("keys");
    baton_e2e::new_key(&keys, "release");
    let stamped = baton_trust::release::stamp(
        &std::fs::read(baton_e2e::bin("baton-agent")).expect("agent"),
        "9.9.9",
    )
    .expect("one version slot");
    let file = d.join("baton-agent-9.9.9");
    std::fs::write(&file, &stamped).expect("release");
    let s = |p: &Path| p.to_str().expect("utf-8").to_string();
    let o = site.replica(via).ctl(&[
        "release",
        "upload",
        &s(&file),
        "--sign",
        &s(&keys.join("release.key")),
        "--version",
        "9.9.9",
        "--arch",
        std::env::consts::ARCH,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for r in ["r0", "r1", "r2"] {
        let o = site.replica(r).ctl(&["release", "list", "--json"]);
        assert_eq!(json_lines(&o.stdout).len(), 1, "{r}");
    }
    let plan = d.join("plan.yaml");
    std::fs::write(&plan, "rollout:\n  stages: [{percent: 100}]\n").expect("plan");
    let o = site
        .replica(via)
        .ctl(&["agent-update", "start", "9.9.9", "--plan", &s(&plan)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let word = |site: &Site, r: &str| -> serde_json::Value {
        site.replica(r)
            .agents()
            .into_iter()
            .find(|a| a["id"] == "a1")
            .map(|a| a["update"].clone())
            .unwrap_or_default()
    };
    assert!(
        wait_until(WAIT, || word(&site, via)["phase"] == "refused"),
        "{}\n{}",
        word(&site, via),
        site.logs()
    );
    for r in ["r0", "r1", "r2"] {
        let w = word(&site, r);
        assert_eq!(w["version"], "9.9.9", "{r}: {w}");
        assert!(
            w["reason"]
                .as_str()
                .unwrap_or("")
                .contains("no trust directory"),
            "{r}: {w}"
        );
    }
    // A refusal is no rollback: the update waits for the box (missing),
    // it does not abort.
    let o = site
        .replica(&owner)
        .ctl(&["agent-update", "status", "--json"]);
    let st = json_lines(&o.stdout).pop().unwrap_or_default();
    assert_eq!(st["state"], "running", "{st}");
    site.agent.kill9();
}
