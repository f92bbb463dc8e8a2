//! Retention end to end: a controller keeping feedback 10 s, fed steadily
//! by an agent for a minute, holds only about the last 10 s (plus one
//! sweep interval) of rows, and its database stops growing once the
//! window is full (weighed after a checkpoint: deleted pages are reused).

use std::time::{Duration, Instant};

use baton_e2e::fleet::{json_lines, start_agent, start_controller_args};
use baton_e2e::wait_until;

const WINDOW: Duration = Duration::from_secs(10);
/// The sweeper's interval for a 10 s window (a tenth, at least 1 s).
const SWEEP: Duration = Duration::from_secs(1);
/// Feedback reaches the controller in pages a few hundred ms apart, and
/// reading the oldest row takes a moment: allowed on top.
const SLACK: Duration = Duration::from_millis(2500);

/// The database file's size after a full checkpoint (the WAL written back
/// and truncated), in bytes.
fn weigh(db: &std::path::Path) -> u64 {
    let c = rusqlite::Connection::open(db).expect("open the controller's database");
    c.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    // A checkpoint gives way to the controller's own writes and reads
    // (busy = 1): asked again until it completes.
    let done = wait_until(Duration::from_secs(20), || {
        let busy: i64 = c
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .expect("checkpoint");
        busy == 0
    });
    assert!(done, "no complete checkpoint in 20 s");
    std::fs::metadata(db).expect("size").len()
}

#[test]
fn feedback_older_than_its_window_goes_and_the_file_stops_growing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("ctl");
    let c = start_controller_args(&data, "127.0.0.1:0", &["--retain-feedback", "10s"]);
    let a = start_agent(&dir.path().join("a1"), "a1", &c.url, &[]);
    assert!(
        wait_until(Duration::from_secs(30), || c.connected("a1")),
        "{}",
        a.log()
    );
    let pack = dir.path().join("steady.yaml");
    std::fs::write(
        &pack,
        "pack: steady\nversion: 1\ntargets: {agents: [a1]}\ninstructions:\n  \
         - {id: tick, action: noop, every: 10ms}\n",
    )
    .expect("write pack");
    let o = c.ctl(&["push", pack.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let start = Instant::now();
    let db = data.join("controller.db");
    let mut sizes = Vec::new();
    let mut checks = 0;
    while start.elapsed() < Duration::from_secs(60) {
        // Paced by the commands' own duration (each a process start and a
        // query); a check every few seconds.
        let oldest = c.ctl(&["feedback", "--pack", "steady", "--json", "--limit", "1"]);
        assert!(
            oldest.status.success(),
            "{}",
            String::from_utf8_lossy(&oldest.stderr)
        );
        let rows = json_lines(&oldest.stdout);
        if start.elapsed() > WINDOW + SWEEP + SLACK
            && let Some(r) = rows.first()
        {
            let received: jiff::Timestamp = r["received"]
                .as_str()
                .expect("received")
                .parse()
                .expect("instant");
            let age = jiff::Timestamp::now().duration_since(received);
            let limit = WINDOW + SWEEP + SLACK;
            assert!(
                age.unsigned_abs() <= limit,
                "the oldest stored row is {age:?} old, past {limit:?} ({} s in)",
                start.elapsed().as_secs()
            );
            checks += 1;
        }
        let t = start.elapsed().as_secs();
        if (25..=30).contains(&t) && sizes.is_empty() || t >= 55 && sizes.len() == 1 {
            sizes.push((t, weigh(&db)));
        }
        // Sampling pace over a fixed minute, not a wait for an event.
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(checks >= 10, "only {checks} checks of the oldest row");
    let all = c.feedback("steady");
    // About 100 rows a second for at most window + sweep + slack.
    let most = 100 * (WINDOW + SWEEP + SLACK).as_secs() + 200;
    assert!(
        all.len() as u64 <= most && all.len() > 300,
        "{} rows kept (at most {most})",
        all.len()
    );
    let [(t0, s0), (t1, s1)] = sizes[..] else {
        panic!("weighed {sizes:?}");
    };
    eprintln!(
        "retention: {} rows kept; database {s0} B at {t0} s, {s1} B at {t1} s",
        all.len()
    );
    assert!(
        s1 <= s0 + s0 / 10,
        "the database grew from {s0} B at {t0} s to {s1} B at {t1} s with the window full"
    );
    // The journal of what was acknowledged is kept: the agent is never
    // asked to send again what retention deleted.
    assert!(!a.log().contains("out of order"), "{}", a.log());
}
