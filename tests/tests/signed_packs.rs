//! Signed packs end to end (issue 39): keys and trust lists made with
//! `baton-controller keys`, packs signed by `push --sign`, a real agent
//! with `--trust-dir` checking each on the device and the refusal's
//! reason reaching the operator's `push`; a key revoked by a newer list,
//! an older list put back (a rollback), and the root handed over.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use baton_e2e::fleet::{Controller, start_agent_clock, start_controller};
use baton_e2e::{bin, controller_tool as tool, new_key, output_text as text, run, wait_until};

const WAIT: Duration = Duration::from_secs(60);
const DAY_NS: i64 = 86_400_000_000_000;

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8")
}

/// Sign a list of `version` (default tenant's keys `keys`, required;
/// `next_root` if handing over) by `root` into `chain`.
fn sign_list(
    dir: &Path,
    root: &Path,
    chain: &Path,
    version: u64,
    keys: &[&str],
    next_root: Option<&str>,
) -> Output {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as i64;
    let body = serde_json::json!({
        "version": version,
        "expires_ns": now + DAY_NS,
        "next_root": next_root,
        "tenants": {"default": {"require_signed": true, "pack_keys": keys}},
    });
    let list = dir.join(format!("list-{version}.json"));
    std::fs::write(&list, body.to_string()).expect("list");
    tool(&[
        "keys",
        "sign-list",
        "--root",
        s(root),
        "--list",
        s(&list),
        "--chain",
        s(chain),
    ])
}

fn pack(dir: &Path, version: u64) -> PathBuf {
    let p = dir.join(format!("p-v{version}.yaml"));
    std::fs::write(
        &p,
        format!(
            "pack: p\nversion: {version}\ntargets: {{agents: [a1]}}\n\
             safe_state:\n  - {{action: gpio.write, params: {{line: 4, value: 0}}}}\n\
             instructions:\n  - {{id: on, action: gpio.write, params: {{line: 4, value: 1}}, every: 200ms}}\n"
        ),
    )
    .expect("pack");
    p
}

/// `keys sign-pack` of `file` by `key`, written over it.
fn sign_pack_in_place(key: &Path, file: &Path) -> Output {
    tool(&[
        "keys",
        "sign-pack",
        "--key",
        s(key),
        s(file),
        "--out",
        s(file),
    ])
}

fn push(c: &Controller, file: &Path, key: Option<&Path>) -> Output {
    let mut args = vec!["push", s(file), "--wait", "20s"];
    if let Some(k) = key {
        args.extend(["--sign", s(k)]);
    }
    c.ctl(&args)
}

fn held(c: &Controller) -> Option<u64> {
    c.agents()
        .iter()
        .filter(|a| a["id"] == "a1")
        .flat_map(|a| a["packs"].as_array().cloned().unwrap_or_default())
        .find(|p| p["pack"] == "p" && p["stopped"] != true)
        .and_then(|p| p["version"].as_u64())
}

/// What agent `a1` last said of its trust, as `agents --json` shows it.
fn trust_of(c: &Controller) -> serde_json::Value {
    c.agents()
        .into_iter()
        .find(|a| a["id"] == "a1")
        .map(|a| a["trust"].clone())
        .unwrap_or_default()
}

/// `keys/` with a new root key, and `trust/` with its public half
/// installed, as on a box.
fn site(d: &Path) -> (PathBuf, PathBuf) {
    let (keys, trust) = (d.join("keys"), d.join("trust"));
    std::fs::create_dir_all(&trust).expect("trust dir");
    let root_pub = new_key(&keys, "root");
    std::fs::write(trust.join("root.pub"), format!("{root_pub}\n")).expect("root.pub");
    (keys, trust)
}

#[test]
fn only_packs_the_trust_list_names_run_and_old_lists_do_not_come_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (keys, trust) = site(d);
    let a_pub = new_key(&keys, "op-a");
    let b_pub = new_key(&keys, "op-b");
    let root2_pub = new_key(&keys, "root2");
    let (root, root2) = (keys.join("root.key"), keys.join("root2.key"));
    let (op_a, op_b) = (keys.join("op-a.key"), keys.join("op-b.key"));
    let chain = trust.join("trust.json");
    let o = sign_list(d, &root, &chain, 1, &[&a_pub], None);
    assert!(o.status.success(), "{}", text(&o));
    let v1_chain = std::fs::read_to_string(&chain).expect("chain");

    let c = start_controller(&d.join("ctl"), "127.0.0.1:0");
    let mut a = start_agent_clock(&d.join("a1"), "a1", &c.url, &["--trust-dir", s(&trust)]);
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());

    // Signed by the tenant's key: runs.
    let o = push(&c, &pack(d, 1), Some(&op_a));
    assert!(o.status.success(), "{}\n{}", text(&o), a.log());
    assert!(wait_until(WAIT, || held(&c) == Some(1)));
    // Its trust as the operator sees it: the list, whose packs must be
    // signed.
    let t = trust_of(&c);
    assert_eq!(t["root"], true, "{t}");
    assert_eq!(t["list_version"], 1, "{t}");
    assert_eq!(t["signed_tenants"], serde_json::json!(["default"]), "{t}");
    assert_eq!(t["nothing_runs"], serde_json::Value::Null, "{t}");

    // Unsigned, another tenant's key (not the tenant's), other bytes:
    // refused on the device, the reason at the operator's push.
    let o = push(&c, &pack(d, 2), None);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("unsigned: tenant default requires packs signed"),
        "{}",
        text(&o)
    );
    let o = push(&c, &pack(d, 3), Some(&op_b));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("does not name for tenant default"),
        "{}",
        text(&o)
    );
    let key_a =
        baton_trust::SigningKey::from_pkcs8(&std::fs::read(&op_a).expect("key")).expect("pkcs8");
    let body = std::fs::read_to_string(pack(d, 4)).expect("v4");
    let sig = baton_trust::PackSignature::sign(&key_a, "default", &body);
    let tampered = baton_trust::pack::append(&body.replace("every: 200ms", "every: 10ms"), &sig);
    let v4t = d.join("p-v4-tampered.yaml");
    std::fs::write(&v4t, tampered).expect("tampered");
    let o = push(&c, &v4t, None);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("does not match this pack's bytes"),
        "{}",
        text(&o)
    );
    assert_eq!(held(&c), Some(1), "v1 runs on");

    // A's key revoked by list 2 (B's now): after a restart the held v1,
    // signed by A, is refused and stopped in its safe state; a new
    // version signed by A is refused, one by B runs.
    let o = sign_list(d, &root, &chain, 2, &[&b_pub], None);
    assert!(o.status.success(), "{}", text(&o));
    a.restart();
    assert!(
        wait_until(WAIT, || a
            .log()
            .contains("refused by this agent's checks now")),
        "{}",
        a.log()
    );
    assert!(
        wait_until(WAIT, || {
            a.writes()
                .iter()
                .rev()
                .find(|w| w["line"] == 4)
                .and_then(|w| w["value"].as_i64())
                == Some(0)
        }),
        "the refused pack's safe state: {:?}",
        a.writes().last()
    );
    assert!(wait_until(WAIT, || c.connected("a1")));
    let o = push(&c, &pack(d, 5), Some(&op_a));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("trust list version 2 does not name"),
        "{}",
        text(&o)
    );
    let o = push(&c, &pack(d, 6), Some(&op_b));
    assert!(o.status.success(), "{}\n{}", text(&o), a.log());
    assert!(wait_until(WAIT, || held(&c) == Some(6)));

    // An older list put back (A's key again): refused, list 2 stays.
    std::fs::write(&chain, &v1_chain).expect("rollback");
    a.restart();
    assert!(
        wait_until(WAIT, || a.log().contains("a rollback, refused")),
        "{}",
        a.log()
    );
    assert!(wait_until(WAIT, || c.connected("a1")));
    let o = push(&c, &pack(d, 7), Some(&op_a));
    assert!(!o.status.success(), "{}", text(&o));

    // The root handed over (list 3 by the old root names root2), then list
    // 4 by root2 gives A back; a list by the old root after that is not
    // taken.
    std::fs::remove_file(&chain).expect("rm");
    for (v, by, keys_, next) in [
        (1, &root, vec![a_pub.as_str()], None),
        (2, &root, vec![b_pub.as_str()], None),
        (3, &root, vec![b_pub.as_str()], Some(root2_pub.as_str())),
        (4, &root2, vec![a_pub.as_str()], None),
    ] {
        let o = sign_list(d, by, &chain, v, &keys_, next);
        assert!(o.status.success(), "{}", text(&o));
    }
    a.restart();
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());
    let o = push(&c, &pack(d, 8), Some(&op_a));
    assert!(o.status.success(), "{}\n{}", text(&o), a.log());
    let o = sign_list(d, &root, &chain, 5, &[&b_pub], None);
    assert!(
        o.status.success(),
        "the tool does not check signers: {}",
        text(&o)
    );
    a.restart();
    assert!(
        wait_until(WAIT, || a.log().contains("trust list signed by key")),
        "{}",
        a.log()
    );
    assert!(wait_until(WAIT, || c.connected("a1")));
    let o = push(&c, &pack(d, 9), Some(&op_a));
    assert!(
        o.status.success(),
        "list 4 stays in force: {}\n{}",
        text(&o),
        a.log()
    );
}

/// A box's own pack files under a trust directory: `check-config` says an
/// unsigned one is refused and why, `keys sign-pack` signs it, and then
/// both `check-config` and `run` take it.
#[test]
fn a_boxs_own_packs_are_checked_and_signed_with_keys_sign_pack() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (keys, trust) = site(d);
    let a_pub = new_key(&keys, "op-a");
    let o = sign_list(
        d,
        &keys.join("root.key"),
        &trust.join("trust.json"),
        1,
        &[&a_pub],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    let p = pack(d, 1);
    let config = d.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "id: a1\ndata-dir: {}\ngpio: sim:{}\ntrust-dir: {}\npacks: [{}]\n",
            s(&d.join("data")),
            s(&d.join("gpio.jsonl")),
            s(&trust),
            s(&p)
        ),
    )
    .expect("config");
    let check = || {
        run(
            std::process::Command::new(bin("baton-agent")).args(["check-config", s(&config)]),
            Duration::from_secs(60),
        )
    };
    let o = check();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("unsigned: tenant default requires packs signed"),
        "{}",
        text(&o)
    );
    let o = sign_pack_in_place(&keys.join("op-a.key"), &p);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        std::fs::read_to_string(&p)
            .expect("pack")
            .contains(baton_trust::pack::SIGNATURE_LINE),
        "signed in place"
    );
    let o = check();
    assert!(o.status.success(), "{}", text(&o));
    // Signed but for another agent (its `targets`, inside what was
    // signed): refused on this box, the reason said at start.
    let elsewhere = d.join("elsewhere.yaml");
    std::fs::write(
        &elsewhere,
        std::fs::read_to_string(pack(d, 2))
            .expect("v2")
            .replace("targets: {agents: [a1]}", "targets: {agents: [a2]}"),
    )
    .expect("elsewhere");
    let o = sign_pack_in_place(&keys.join("op-a.key"), &elsewhere);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(
        std::process::Command::new(bin("baton-agent")).args([
            "run",
            "--config",
            s(&config),
            "--system-clock",
            "reference",
            "--no-rt",
            "--data",
            s(&d.join("data-elsewhere")),
            "--pack",
            s(&elsewhere),
        ]),
        Duration::from_secs(60),
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("not this agent (a1)"), "{}", text(&o));
    // And the agent runs its own.
    let _agent = baton_e2e::Running(
        std::process::Command::new(bin("baton-agent"))
            .args([
                "run",
                "--config",
                s(&config),
                "--system-clock",
                "reference",
                "--no-rt",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("agent"),
    );
    assert!(
        wait_until(WAIT, || std::fs::read_to_string(d.join("gpio.jsonl"))
            .is_ok_and(|l| l.contains("\"value\":1"))),
        "the signed pack fired"
    );
}

/// The controller relays the fleet's trust lists (`serve --trust-chain`):
/// an agent takes the newer ones its root verifies without a visit (a key
/// revoked that way is refused from then on) and refuses a list its root
/// did not sign, whoever relays it.
#[test]
fn the_controller_relays_trust_lists_and_cannot_forge_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (keys, trust) = site(d);
    let a_pub = new_key(&keys, "op-a");
    let b_pub = new_key(&keys, "op-b");
    let _ = new_key(&keys, "mallory");
    // The box has list 1 (A); the controller relays 1 and 2 (B only).
    let boxed = trust.join("trust.json");
    let relayed = d.join("relayed.json");
    let root = keys.join("root.key");
    assert!(
        sign_list(d, &root, &boxed, 1, &[&a_pub], None)
            .status
            .success()
    );
    std::fs::copy(&boxed, &relayed).expect("copy");
    assert!(
        sign_list(d, &root, &relayed, 2, &[&b_pub], None)
            .status
            .success()
    );

    let c = baton_e2e::fleet::start_controller_args(
        &d.join("ctl"),
        "127.0.0.1:0",
        &["--trust-chain", s(&relayed)],
    );
    let a = start_agent_clock(&d.join("a1"), "a1", &c.url, &["--trust-dir", s(&trust)]);
    assert!(
        wait_until(WAIT, || a
            .log()
            .contains("trust list taken from the controller")),
        "{}",
        a.log()
    );
    // The operator sees the list it took (its hello said list 1).
    assert!(
        wait_until(WAIT, || trust_of(&c)["list_version"] == 2),
        "{}",
        trust_of(&c)
    );
    let o = push(&c, &pack(d, 1), Some(&keys.join("op-a.key")));
    assert!(
        !o.status.success(),
        "A's key is revoked by list 2: {}",
        text(&o)
    );
    assert!(
        text(&o).contains("trust list version 2 does not name"),
        "{}",
        text(&o)
    );
    let o = push(&c, &pack(d, 2), Some(&keys.join("op-b.key")));
    assert!(o.status.success(), "{}\n{}", text(&o), a.log());
    drop(c);

    // A controller that appends a list of its own making (signed by a key
    // that is not the root): refused on the box, list 2 stays in force.
    assert!(
        sign_list(d, &keys.join("mallory.key"), &relayed, 3, &[&a_pub], None)
            .status
            .success()
    );
    let c = baton_e2e::fleet::start_controller_args(
        &d.join("ctl2"),
        "127.0.0.1:0",
        &["--trust-chain", s(&relayed)],
    );
    let mut a = a;
    a.url = c.url.clone();
    a.restart();
    assert!(
        wait_until(WAIT, || a
            .log()
            .contains("trust list from the controller refused")),
        "{}",
        a.log()
    );
    // The refusal reaches the operator; list 2 stays in force.
    assert!(
        wait_until(WAIT, || trust_of(&c)["refused"]
            .as_str()
            .is_some_and(|r| !r.is_empty())),
        "{}",
        trust_of(&c)
    );
    assert_eq!(trust_of(&c)["list_version"], 2);
    assert_eq!(trust_of(&c)["root"], true);
    let o = push(&c, &pack(d, 3), Some(&keys.join("op-a.key")));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("trust list version 2 does not name"),
        "{}",
        text(&o)
    );
}

/// A key revoked by a list the box takes live (`keys sign-list` adds it
/// to the controller's `--trust-chain` file; nothing restarts: the
/// controller relays it on the open stream): the pack that key signed is
/// withdrawn at once, its safe state driven, not left running until the
/// box restarts; pushed again, it is refused with why.
#[test]
fn a_key_revoked_by_a_list_taken_live_withdraws_what_it_signed_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (keys, trust) = site(d);
    let a_pub = new_key(&keys, "op-a");
    let b_pub = new_key(&keys, "op-b");
    let root = keys.join("root.key");
    let boxed = trust.join("trust.json");
    assert!(
        sign_list(d, &root, &boxed, 1, &[&a_pub], None)
            .status
            .success()
    );
    // The controller relays list 1 only, then 1 and 2.
    let relayed = d.join("relayed.json");
    std::fs::copy(&boxed, &relayed).expect("copy");
    let c = baton_e2e::fleet::start_controller_args(
        &d.join("ctl"),
        "127.0.0.1:0",
        &["--trust-chain", s(&relayed)],
    );
    let a = start_agent_clock(&d.join("a1"), "a1", &c.url, &["--trust-dir", s(&trust)]);
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());
    let o = push(&c, &pack(d, 1), Some(&keys.join("op-a.key")));
    assert!(o.status.success(), "{}\n{}", text(&o), a.log());
    assert!(
        wait_until(WAIT, || std::fs::read_to_string(&a.gpio)
            .is_ok_and(|l| l.contains("\"value\":1"))),
        "v1 fires"
    );

    assert!(
        sign_list(d, &root, &relayed, 2, &[&b_pub], None)
            .status
            .success()
    );
    assert!(
        wait_until(WAIT, || a.log().contains("no longer allows this pack")),
        "{}",
        a.log()
    );
    assert!(
        a.log().contains("withdrawn, its safe state driven"),
        "{}",
        a.log()
    );
    assert!(
        c.log().contains("new trust lists relayed"),
        "relayed on the open stream: {}",
        c.log()
    );
    assert!(wait_until(WAIT, || held(&c).is_none()), "{:?}", c.agents());
    // The safe state was written after the last firing: line 4 low.
    let writes = std::fs::read_to_string(&a.gpio).expect("gpio log");
    let last = writes
        .lines()
        .rfind(|l| l.contains("\"value\":"))
        .expect("a write");
    assert!(last.contains("\"value\":0"), "{last}");
    let o = push(&c, &pack(d, 2), Some(&keys.join("op-a.key")));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("trust list version 2 does not name"),
        "{}",
        text(&o)
    );
    // A torn chain file is said; the chain before stays relayed.
    std::fs::write(&relayed, "[{ torn").expect("torn");
    assert!(
        wait_until(WAIT, || c
            .log()
            .contains("not a chain of signed trust lists")),
        "{}",
        c.log()
    );
    assert!(c.connected("a1"));
}
