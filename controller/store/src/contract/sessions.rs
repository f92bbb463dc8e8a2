//! Dashboard sessions and failed log-ins in the store, so that replicas
//! behind one address share them: a session opened, read, expired and
//! closed; a certificate's cap (its oldest go) and the store's bound; a
//! revocation ending a certificate's sessions; failed log-ins counted per
//! source and window, and (with two handles on one database) added up.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use baton_model::RefTime;
use baton_model::identity::{Identity, Role};

use crate::*;

use super::fixtures::*;

fn at(ns: i64) -> RefTime {
    RefTime::from_nanos(ns)
}

/// Session `n` of certificate `serial`, made at `created`, ending at
/// `expires`.
pub fn session(n: u32, serial: &str, created: i64, expires: i64) -> SessionRow {
    SessionRow {
        id_hash: format!("{n:064x}"),
        who: Identity::Operator {
            name: format!("op-{serial}"),
            tenant: "t".into(),
            role: Role::Operator,
        },
        serial: serial.into(),
        csrf: format!("csrf-{n}"),
        created: at(created),
        expires: at(expires),
    }
}

async fn open(s: &dyn Store, row: &SessionRow) -> SessionOpened {
    s.open_session(row.clone(), 16, 1_000).await.unwrap()
}

/// Opened, read back whole, gone once expired or closed; an unknown hash
/// is no session.
pub async fn sessions_open_read_expire_close(s: &dyn Store, _binding: Binding) {
    let a = session(1, "s1", 100, 200);
    let b = session(2, "s1", 110, 300);
    assert_eq!(open(s, &a).await, SessionOpened::Opened);
    assert_eq!(open(s, &b).await, SessionOpened::Opened);
    assert_eq!(
        s.session(&a.id_hash, at(150)).await.unwrap(),
        Some(a.clone())
    );
    assert_eq!(
        s.session(&a.id_hash, at(199)).await.unwrap(),
        Some(a.clone())
    );
    assert_eq!(
        s.session(&a.id_hash, at(200)).await.unwrap(),
        None,
        "expired"
    );
    assert_eq!(s.session(&"0".repeat(64), at(150)).await.unwrap(), None);
    s.close_session(&b.id_hash).await.unwrap();
    assert_eq!(
        s.session(&b.id_hash, at(150)).await.unwrap(),
        None,
        "closed"
    );
    // Closing again, or what never was: nothing to do, no error.
    s.close_session(&b.id_hash).await.unwrap();
    // The expired one is deleted by a later opening (no dead rows kept).
    let c = session(3, "s2", 250, 400);
    assert_eq!(open(s, &c).await, SessionOpened::Opened);
    assert_eq!(s.session(&a.id_hash, at(0)).await.unwrap(), None, "deleted");
    assert_eq!(s.session(&c.id_hash, at(260)).await.unwrap(), Some(c));
}

/// A certificate holds at most its cap: opening one more ends its oldest;
/// another certificate's are untouched. The store's bound refuses a
/// session only while every stored one stands.
pub async fn sessions_capped_per_certificate_and_in_all(s: &dyn Store, _binding: Binding) {
    let rows: Vec<SessionRow> = (0..4)
        .map(|i| session(i, "s1", 100 + i64::from(i), 1_000))
        .collect();
    let other = session(9, "s2", 50, 1_000);
    assert_eq!(
        s.open_session(other.clone(), 3, 100).await.unwrap(),
        SessionOpened::Opened
    );
    for r in &rows {
        assert_eq!(
            s.open_session(r.clone(), 3, 100).await.unwrap(),
            SessionOpened::Opened
        );
    }
    let standing = |r: &SessionRow| {
        let id = r.id_hash.clone();
        async move { s.session(&id, at(500)).await.unwrap().is_some() }
    };
    assert!(!standing(&rows[0]).await, "the oldest went");
    for r in &rows[1..] {
        assert!(standing(r).await);
    }
    assert!(standing(&other).await, "another certificate's stays");

    // The bound: 4 stored (3 of s1, 1 of s2), at most 4.
    let more = session(20, "s3", 600, 2_000);
    assert_eq!(
        s.open_session(more.clone(), 3, 4).await.unwrap(),
        SessionOpened::Full
    );
    assert!(!standing(&more).await);
    // Once they have expired, the bound makes room.
    let later = session(21, "s3", 1_500, 2_000);
    assert_eq!(
        s.open_session(later.clone(), 3, 4).await.unwrap(),
        SessionOpened::Opened
    );
    assert!(
        s.session(&later.id_hash, at(1_600))
            .await
            .unwrap()
            .is_some()
    );
}

/// A revocation recorded (by any replica) ends its certificate's
/// sessions at once, and no new one is opened for it; other
/// certificates' sessions stand.
pub async fn sessions_end_with_their_certificate(s: &dyn Store, _binding: Binding) {
    let mine = session(1, "dead", 100, 1_000);
    let theirs = session(2, "alive", 100, 1_000);
    assert_eq!(open(s, &mine).await, SessionOpened::Opened);
    assert_eq!(open(s, &theirs).await, SessionOpened::Opened);
    let revocation = RevocationRow {
        serial: "dead".into(),
        kind: "operator".into(),
        name: "op-dead".into(),
        at: at(150),
    };
    let recorded = s
        .revoke(vec![(revocation, vec![audit_row(150, "t", "op-dead")])])
        .await
        .unwrap();
    assert_eq!(recorded, ["dead"]);
    assert_eq!(s.session(&mine.id_hash, at(200)).await.unwrap(), None);
    assert!(s.session(&theirs.id_hash, at(200)).await.unwrap().is_some());
    let again = session(3, "dead", 300, 1_000);
    assert_eq!(open(s, &again).await, SessionOpened::Revoked);
    assert_eq!(s.session(&again.id_hash, at(400)).await.unwrap(), None);
}

/// Failed log-ins counted per source and window, read back from a
/// window on, old windows forgotten when asked.
pub async fn login_failures_counted_per_source_and_window(s: &dyn Store, _binding: Binding) {
    for _ in 0..3 {
        s.login_failed("10.0.0.1", at(1_000), at(0)).await.unwrap();
    }
    assert_eq!(
        s.login_failed("10.0.0.1", at(2_000), at(0)).await.unwrap(),
        1
    );
    assert_eq!(
        s.login_failed("10.0.0.2", at(2_000), at(0)).await.unwrap(),
        1
    );
    assert_eq!(
        s.login_failures("10.0.0.1", at(1_000)).await.unwrap(),
        [(at(1_000), 3), (at(2_000), 1)]
    );
    assert_eq!(
        s.login_failures("10.0.0.1", at(1_001)).await.unwrap(),
        [(at(2_000), 1)]
    );
    assert_eq!(s.login_failures("10.0.0.3", at(0)).await.unwrap(), []);
    // Forgetting the windows before 2 000 (while counting a new failure).
    assert_eq!(
        s.login_failed("10.0.0.2", at(3_000), at(2_000))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.login_failures("10.0.0.1", at(0)).await.unwrap(),
        [(at(2_000), 1)]
    );
}

/// Two handles on one database (replicas): a session opened through one
/// is valid through the other and closed through the other ends it on
/// both; failed log-ins through either add up in one count.
pub async fn sessions_and_failures_shared_by_two_handles(a: &dyn Store, b: &dyn Store) {
    let row = session(1, "s1", 100, 1_000);
    assert_eq!(open(a, &row).await, SessionOpened::Opened);
    assert_eq!(
        b.session(&row.id_hash, at(200)).await.unwrap(),
        Some(row.clone())
    );
    b.close_session(&row.id_hash).await.unwrap();
    assert_eq!(a.session(&row.id_hash, at(200)).await.unwrap(), None);
    // Failed log-ins from one source, alternately through a and b, at
    // once: each counted once, in one count.
    let mut counts = Vec::new();
    for i in 0..10u32 {
        let via = if i % 2 == 0 { a } else { b };
        counts.push(via.login_failed("10.0.0.9", at(1_000), at(0)));
    }
    let mut counts: Vec<u64> = join_all(counts)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    counts.sort_unstable();
    assert_eq!(counts, (1..=10).collect::<Vec<u64>>());
    for via in [a, b] {
        assert_eq!(
            via.login_failures("10.0.0.9", at(0)).await.unwrap(),
            [(at(1_000), 10)]
        );
    }
}
