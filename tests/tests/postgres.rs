//! The controller with its store in PostgreSQL (`serve --store URL`), on
//! a throwaway cluster this binary starts (`baton_testpg`): the same
//! push → ack → feedback path as on the embedded store, and nothing
//! acknowledged is lost when the controller is killed and started again,
//! or when the database drops every connection; `migrate` moves a
//! single-node site's history into it.

use std::process::Command;
use std::time::Duration;

use baton_e2e::fleet::{
    Agent, Controller, json_lines, start_agent, start_controller, start_controller_args,
};
use baton_e2e::{bin, run, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// The execution ids of a pack's stored feedback.
fn ids(c: &Controller, pack: &str) -> Vec<String> {
    c.feedback(pack)
        .iter()
        .filter_map(|f| f["execution_id"].as_str().map(str::to_owned))
        .collect()
}

/// Agent `a1` (label line=press) in `dir`, connected to `c`, and pack `p`
/// (a toggle every 100 ms, aimed at that label) pushed to it.
fn agent_with_pack(dir: &std::path::Path, c: &Controller) -> Agent {
    let a = start_agent(dir, "a1", &c.url, &["line=press"]);
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());
    let pack = dir.join("p.yaml");
    std::fs::write(
        &pack,
        "pack: p\nversion: 1\ntargets: {labels: {line: press}}\n\
         safe_state:\n  - {action: gpio.write, params: {line: 5, value: 0}}\n\
         instructions:\n  - id: tick\n    action: gpio.toggle\n    params: {line: 5}\n    every: 100ms\n",
    )
    .expect("write pack");
    let o = c.ctl(&["push", pack.to_str().expect("utf-8")]);
    assert!(
        o.status.success(),
        "push: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    a
}

/// After `what`, the agent's feedback reaches the store again (five new
/// entries past `before`), every entry of `before` is still there, and no
/// execution is stored twice.
fn resumes_once(c: &Controller, before: &[String], what: &str) {
    assert!(
        wait_until(WAIT, || ids(c, "p").len() >= before.len() + 5),
        "feedback did not resume after {what}; controller log:\n{}",
        c.log()
    );
    let after = ids(c, "p");
    let unique: std::collections::BTreeSet<&String> = after.iter().collect();
    assert_eq!(
        unique.len(),
        after.len(),
        "an execution stored twice after {what}"
    );
    assert!(
        before.iter().all(|id| unique.contains(id)),
        "feedback lost after {what}"
    );
}

#[test]
fn a_controller_on_postgres_keeps_pushes_and_feedback_across_a_kill_and_a_lost_connection() {
    let Some(url) = baton_testpg::fresh_database() else {
        return; // not installed and not required: `baton_testpg` said so
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("ctl");
    let mut c = start_controller_args(&data, "127.0.0.1:0", &["--store", &url]);
    assert!(
        !data.join("controller.db").exists(),
        "the embedded store was opened as well"
    );
    let _agent = agent_with_pack(dir.path(), &c); // runs until the end
    assert!(
        wait_until(WAIT, || ids(&c, "p").len() >= 5),
        "no feedback stored; controller log:\n{}",
        c.log()
    );
    let before = ids(&c, "p");

    c.restart();
    // Everything stored before the kill is still there, once each, and
    // the agent's stream carries on into the same database.
    resumes_once(&c, &before, "the controller's kill");

    // The database drops every connection (a restart, a cut): the
    // controller connects again, and what was stored stays stored once.
    let url_again = url.clone();
    std::thread::spawn(move || baton_testpg::terminate_connections(&url_again))
        .join()
        .expect("terminate");
    let before = ids(&c, "p");
    resumes_once(&c, &before, "the database dropped its connections");
    assert!(c.log().contains("reconnected to PostgreSQL"), "{}", c.log());

    let packs = c.ctl(&["packs", "--json"]);
    let packs = json_lines(&packs.stdout);
    assert_eq!(packs.len(), 1, "{packs:?}");
    assert_eq!(packs[0]["acked"], 1, "{packs:?}");
}

#[test]
fn a_store_url_that_cannot_be_reached_is_refused_at_start_without_its_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Port 1 on loopback: nothing listens there.
    let o = std::process::Command::new(baton_e2e::bin("baton-controller"))
        .args([
            "serve",
            "--insecure",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "postgres://baton:s3cret-pw@127.0.0.1:1/baton",
            "--data",
        ])
        .arg(dir.path())
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("store in PostgreSQL (--store)"), "{err}");
    // Where, and why: the address and the system's word for the failure.
    assert!(err.contains("at 127.0.0.1:1"), "{err}");
    assert!(err.to_lowercase().contains("connection refused"), "{err}");
    assert!(
        !err.contains("s3cret-pw"),
        "the password was printed: {err}"
    );
}

/// `migrate --from DIR --to URL`: stdout lines `table: N rows, M new`.
fn migrate(from: &std::path::Path, url: &str) -> Vec<(String, u64, u64)> {
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["migrate", "--from"])
            .arg(from)
            .args(["--to", url]),
        WAIT,
    );
    assert!(
        o.status.success(),
        "migrate: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let (table, rest) = l.split_once(": ").expect("table: counts");
            let n: Vec<u64> = rest
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|w| w.parse().ok())
                .collect();
            (table.to_owned(), n[0], n[1])
        })
        .collect()
}

#[test]
fn migrate_moves_a_single_node_site_into_postgres_once() {
    let Some(url) = baton_testpg::fresh_database() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("ctl");
    let mut c = start_controller(&data, "127.0.0.1:0");
    let _agent = agent_with_pack(dir.path(), &c); // runs until the end
    assert!(wait_until(WAIT, || ids(&c, "p").len() >= 5), "{}", c.log());
    let audit = json_lines(&c.ctl(&["audit", "--json"]).stdout);
    assert!(!audit.is_empty(), "nothing audited to carry over");
    c.kill9();
    // What the embedded store held when it stopped (read through it).
    let mut probe = start_controller(&data, "127.0.0.1:0");
    let before = ids(&probe, "p");
    probe.kill9();

    let first = migrate(&data, &url);
    let count = |t: &str, table: &[(String, u64, u64)]| {
        table.iter().find(|(n, ..)| n == t).map(|&(_, r, n)| (r, n))
    };
    assert_eq!(
        count("feedback", &first).map(|(r, n)| (r, r == n)),
        Some((before.len() as u64, true)),
        "{first:?}"
    );
    assert_eq!(count("pack_versions", &first), Some((1, 1)), "{first:?}");
    // Again: nothing new.
    let again = migrate(&data, &url);
    assert!(again.iter().all(|&(_, _, new)| new == 0), "{again:?}");

    // The controller on PostgreSQL, same address: the history is there,
    // once, and the agent's stream carries on after it.
    let c = start_controller_args(&data, &c.addr, &["--store", &url]);
    let moved = ids(&c, "p");
    for id in &before {
        assert_eq!(moved.iter().filter(|x| *x == id).count(), 1, "{id}");
    }
    let audit_after = json_lines(&c.ctl(&["audit", "--json"]).stdout);
    for row in &audit {
        assert!(
            audit_after.contains(row),
            "audit row not carried over: {row}"
        );
    }
    resumes_once(&c, &before, "the move to PostgreSQL");
}

/// `migrate` into a database another store already uses is refused, and
/// copies nothing: a controller ran on it (an agent, its journal, its
/// feedback, an audit row), then a different embedded site is migrated
/// into it. Its rows would take ids the database has given to others
/// (another agent's journal among them): the run exits 1 naming what
/// differs, and the database holds what it held.
#[test]
fn migrate_into_a_database_in_use_is_refused_and_copies_nothing() {
    let Some(url) = baton_testpg::fresh_database() else {
        return;
    };
    let used = tempfile::tempdir().expect("tempdir");
    let mut c = start_controller_args(&used.path().join("ctl"), "127.0.0.1:0", &["--store", &url]);
    let _agent = agent_with_pack(used.path(), &c);
    assert!(wait_until(WAIT, || ids(&c, "p").len() >= 5), "{}", c.log());
    c.kill9();

    let site = tempfile::tempdir().expect("tempdir");
    let data = site.path().join("ctl");
    let mut other = start_controller(&data, "127.0.0.1:0");
    let _other_agent = agent_with_pack(site.path(), &other);
    assert!(
        wait_until(WAIT, || ids(&other, "p").len() >= 5),
        "{}",
        other.log()
    );
    other.kill9();

    let probe = start_controller_args(
        &used.path().join("probe"),
        "127.0.0.1:0",
        &["--store", &url],
    );
    let held = ids(&probe, "p");
    drop(probe);
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["migrate", "--from"])
            .arg(&data)
            .args(["--to", &url]),
        WAIT,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(1),
        "migrate into a used database: {err}"
    );
    assert!(
        err.contains("already holds another store's data") && err.contains("journals"),
        "{err}"
    );
    let probe = start_controller_args(
        &used.path().join("probe"),
        "127.0.0.1:0",
        &["--store", &url],
    );
    let after = ids(&probe, "p");
    let set = |v: &[String]| v.iter().cloned().collect::<std::collections::BTreeSet<_>>();
    assert_eq!(
        set(&after),
        set(&held),
        "the refused migrate changed the database"
    );
}

/// `ca init` in `dir`: ca.pem, server.pem, server-key.pem for 127.0.0.1.
fn ca(dir: &std::path::Path) -> std::path::PathBuf {
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["ca", "init", "--host", "127.0.0.1", "--dir"])
            .arg(dir),
        WAIT,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    dir.to_path_buf()
}

/// `serve` that must fail at start: its stderr.
fn refused_start(dir: &std::path::Path, args: &[&str]) -> String {
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["serve", "--insecure", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.join("refused"))
            .args(args),
        WAIT,
    );
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    err
}

#[test]
fn tls_to_the_database_is_checked_against_the_named_ca_and_never_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_dir = ca(&dir.path().join("ca"));
    let Some(url) = baton_testpg::fresh_tls_database(
        &ca_dir.join("server.pem"),
        &ca_dir.join("server-key.pem"),
    ) else {
        return;
    };
    let ca_pem = ca_dir.join("ca.pem");
    let ca_arg = ca_pem.to_str().expect("utf-8");

    // The cluster refuses plaintext: a controller that is not told the CA
    // does not get in (and does not fall back to anything).
    let err = refused_start(dir.path(), &["--store", &url]);
    assert!(err.contains("store in PostgreSQL"), "{err}");
    // A URL asking for TLS without a CA to check it against is refused
    // before any connection.
    let err = refused_start(dir.path(), &["--store", &format!("{url} sslmode=require")]);
    assert!(err.contains("--store-ca"), "{err}");
    // A certificate from another CA is not trusted.
    let other = ca(&dir.path().join("other-ca"));
    let other_pem = other.join("ca.pem");
    let err = refused_start(
        dir.path(),
        &[
            "--store",
            &url,
            "--store-ca",
            other_pem.to_str().expect("utf-8"),
        ],
    );
    assert!(err.contains("connect to PostgreSQL"), "{err}");

    // With the CA: served, pushes and feedback stored over TLS.
    let data = dir.path().join("ctl");
    let c = start_controller_args(
        &data,
        "127.0.0.1:0",
        &["--store", &url, "--store-ca", ca_arg],
    );
    let _agent = agent_with_pack(dir.path(), &c); // runs until the end
    assert!(wait_until(WAIT, || ids(&c, "p").len() >= 3), "{}", c.log());
}

#[test]
fn bad_store_settings_and_a_missing_site_are_refused_with_what_is_wrong() {
    // No database is reached for any of these: each is refused first.
    let dir = tempfile::tempdir().expect("tempdir");
    let err = refused_start(dir.path(), &["--store", "postgres://[not a host"]);
    assert!(
        err.contains("the store URL is not a PostgreSQL URL"),
        "{err}"
    );
    let missing = dir.path().join("no-such-ca.pem");
    let err = refused_start(
        dir.path(),
        &[
            "--store",
            "host=127.0.0.1 port=1 dbname=x",
            "--store-ca",
            missing.to_str().expect("utf-8"),
        ],
    );
    assert!(
        err.contains("--store-ca") && err.contains("no-such-ca.pem"),
        "{err}"
    );
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["migrate", "--from"])
            .arg(dir.path().join("no-site"))
            .args(["--to", "host=127.0.0.1 port=1 dbname=x"]),
        WAIT,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("no embedded store at"), "{err}");
}
