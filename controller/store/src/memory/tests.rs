#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use super::*;
use crate::contract::{
    ack, audit_row, clock, fb, hello_in, key, pack, push, refusal, refuse, to_ids,
};
use crate::{LabelOverrides, SeenRow, StoreOps};

fn open(binding: Binding) -> (MemoryStore, ()) {
    (MemoryStore::new(binding), ())
}

crate::contract_suite!(open);

/// A failing disk: every write refused, nothing changed, reads go on;
/// back to normal when it heals.
#[tokio::test]
async fn failing_writes_change_nothing() {
    let s = MemoryStore::new(Binding::Tenants);
    let k = key("t", "p");
    s.agent_hello(hello_in("a1", &["t"], &[("line", "3")], 1))
        .await
        .unwrap();
    push(&s, pack("t", "p", 1, to_ids(&["a1"])), 2).await;
    s.put_feedback(1, vec![fb("a1", "j1", 1, 3)]).await.unwrap();
    let rows = s.deliveries_of_agent("a1").await.unwrap();
    let agent = s.agent("a1").await.unwrap();

    s.fail_writes(true);
    let failed =
        |r: StoreResult<()>| assert!(matches!(r, Err(StoreError::Unavailable { .. })), "{r:?}");
    failed(
        s.agent_hello(hello_in("a2", &["t"], &[], 4))
            .await
            .map(drop),
    );
    failed(
        s.agent_seen("a1", 1, SeenRow::ended(RefTime::from_nanos(4)))
            .await,
    );
    failed(s.all_disconnected().await);
    failed(s.record_clock("a1", 1, clock(4)).await);
    failed(
        s.label_agent(
            "a1",
            "t",
            LabelOverrides::new(),
            vec!["line".into()],
            RefTime::from_nanos(4),
        )
        .await
        .map(drop),
    );
    failed(
        s.grant("a1", "u", true, RefTime::from_nanos(4))
            .await
            .map(drop),
    );
    failed(s.forget_agent("a1", None).await.map(drop));
    failed(
        s.put_pack(pack("t", "p", 2, to_ids(&["a1"])))
            .await
            .map(drop),
    );
    failed(s.cancel_pack(&k, RefTime::from_nanos(4)).await.map(drop));
    failed(s.reconcile_pack(&k, RefTime::from_nanos(4)).await.map(drop));
    failed(
        s.agent_held("a1", 1, Vec::new(), RefTime::from_nanos(4))
            .await
            .map(drop),
    );
    failed(s.answer(ack("a1", &k, 1, 4)).await.map(drop));
    failed(
        s.answer(refuse("a1", &k, refusal(1, true, "no"), 4))
            .await
            .map(drop),
    );
    failed(
        s.put_feedback(1, vec![fb("a1", "j1", 2, 4)])
            .await
            .map(drop),
    );
    failed(
        s.delete_feedback_before(RefTime::from_nanos(i64::MAX), 10)
            .await
            .map(drop),
    );
    failed(
        s.delete_clock_before(RefTime::from_nanos(i64::MAX), 10)
            .await
            .map(drop),
    );
    failed(
        s.delete_audit_before(RefTime::from_nanos(i64::MAX), 10)
            .await
            .map(drop),
    );
    failed(s.put_audit(audit_row(4, "t", "p")).await);

    assert_eq!(s.deliveries_of_agent("a1").await.unwrap(), rows);
    assert_eq!(s.agent("a1").await.unwrap(), agent);
    assert_eq!(s.agent("a2").await.unwrap(), None);
    assert_eq!(s.packs(None).await.unwrap()[0].latest, 1);
    assert_eq!(s.feedback_acked("a1", "j1").await.unwrap(), 1);
    assert_eq!(s.audit(None, RefTime::from_nanos(0), 0).await.unwrap(), []);

    s.fail_writes(false);
    s.put_feedback(1, vec![fb("a1", "j1", 2, 5)]).await.unwrap();
    assert_eq!(s.feedback_acked("a1", "j1").await.unwrap(), 2);
}
