//! Signed packs' versions only go up on a box, across cancels and
//! restarts (issue 39): whoever holds the controller can cancel a pack,
//! but cannot then bring back an older version the operator once signed.

mod rig;

use std::sync::Arc;

use baton_agent::config::{ConfigFile, Overrides};
use baton_agent::runtime::ports::ManualClock;
use baton_sched::PackKey;
use baton_trust::{SignedList, SigningKey, TenantTrust, TrustList};
use rig::*;

const BODY: &str = "safe_state:\n  - {action: gpio.write, params: {line: 4, value: 0}}\n\
    instructions:\n  - {id: on, action: gpio.write, params: {line: 4, value: 1}, every: 100ms}\n";

/// A trust directory whose list requires tenant `default`'s packs signed
/// by `op`.
fn trust_dir(dir: &std::path::Path, op: &SigningKey) -> std::path::PathBuf {
    let root = SigningKey::generate().expect("root");
    let trust = dir.join("trust");
    std::fs::create_dir_all(&trust).expect("trust dir");
    std::fs::write(trust.join("root.pub"), root.public().to_base64()).expect("root.pub");
    let list = TrustList {
        version: 1,
        expires_ns: i64::MAX,
        next_root: None,
        tenants: [(
            "default".to_string(),
            TenantTrust {
                require_signed: true,
                pack_keys: vec![op.public()],
            },
        )]
        .into_iter()
        .collect(),
        release_keys: Vec::new(),
    };
    let chain = vec![SignedList::sign(&list, &root)];
    std::fs::write(
        trust.join("trust.json"),
        serde_json::to_string(&chain).expect("json"),
    )
    .expect("trust.json");
    trust
}

fn signed(op: &SigningKey, version: u64) -> String {
    baton_trust::pack::sign_text(op, "default", &pack("p", version, BODY)).expect("sign")
}

fn accept(a: &mut baton_agent::runtime::Agent, yaml: &str) -> anyhow::Result<()> {
    let pack =
        baton_proto::parse_pack(yaml).map_err(|e| anyhow::anyhow!("{}", e.render("pack")))?;
    a.accept(yaml.to_string(), pack)?;
    Ok(())
}

#[test]
fn an_older_signed_version_is_refused_after_a_cancel_and_after_a_restart() {
    let op = SigningKey::generate().expect("op");
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t(0)));
    let file = ConfigFile {
        trust_dir: Some(trust_dir(dir.path(), &op)),
        ..ConfigFile::default()
    };
    let key = PackKey {
        tenant: "default".into(),
        pack: "p".into(),
    };
    {
        let cfg = config(dir.path(), file.clone(), Overrides::default());
        let mut a = build_with(dir.path(), clock.clone(), cfg);
        accept(&mut a, &signed(&op, 2)).expect("v2 signed runs");
        a.cancel_local(&key).expect("cancel");
        let e = accept(&mut a, &signed(&op, 1)).expect_err("v1 after the cancel");
        assert!(
            e.to_string()
                .contains("older than signed version 2 this agent took before"),
            "{e}"
        );
        // The same version again is taken (a re-push after a cancel).
        accept(&mut a, &signed(&op, 2)).expect("v2 again");
        a.cancel_local(&key).expect("cancel");
    }
    // A restart on the same data directory: nothing is held to compare
    // with, the record is.
    let cfg = config(dir.path(), file, Overrides::default());
    let mut a = build_with(dir.path(), clock.clone(), cfg);
    let e = accept(&mut a, &signed(&op, 1)).expect_err("v1 after a restart");
    assert!(e.to_string().contains("signed version 2"), "{e}");
    accept(&mut a, &signed(&op, 3)).expect("v3 runs");
    let kept = std::fs::read_to_string(dir.path().join("data/signed-versions.json")).expect("kept");
    assert!(kept.contains("\"default/p\": 3"), "{kept}");
}
