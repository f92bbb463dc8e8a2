//! Tenants and roles on the operators' API, with certificates made by
//! `baton-controller ca`: an operator sees and touches only its tenant's
//! packs, deliveries, feedback and agents; a viewer reads but cannot push
//! or cancel; refusals never name what the caller did not name itself;
//! every push and cancel, refused ones included, is in the audit log,
//! which only admins read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_e2e::fleet::{Ca, ControllerTls, json_lines, start_agent_tls, start_controller_tls};
use baton_e2e::wait_until;

const WAIT: Duration = Duration::from_secs(30);

fn pack(dir: &Path, tenant: &str, name: &str, agent: &str) -> PathBuf {
    let p = dir.join(format!("{tenant}-{name}.yaml"));
    std::fs::write(
        &p,
        format!(
            "pack: {name}\nversion: 1\ntenant: {tenant}\ntargets: {{agents: [{agent}]}}\n\
             safe_state:\n  - {{action: gpio.write, params: {{line: 1, value: 0}}}}\n\
             instructions:\n  - {{id: tick, action: gpio.toggle, params: {{line: 1}}, every: 200ms}}\n"
        ),
    )
    .expect("write pack");
    p
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn tenants_see_only_their_own_and_roles_gate_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::init(&dir.path().join("ca"));
    let ann = ca.operator("ann", "plant-a", "operator");
    let vic = ca.operator("vic", "plant-a", "viewer");
    let ada = ca.operator("ada", "plant-a", "admin");
    let bob = ca.operator("bob", "plant-b", "operator");
    let c = start_controller_tls(
        &dir.path().join("ctl"),
        "127.0.0.1:0",
        ControllerTls {
            dir: ca.dir.clone(),
            operator: ada.clone(),
            serve_args: Vec::new(),
        },
    );
    // Each agent serves one tenant (its certificate says which).
    let tls = |name: &str, t: &str| ca.agent_tls(ca.agent(name, &["--tenant", t]));
    let a1 = start_agent_tls(
        &dir.path().join("a1"),
        "a1",
        &c.url,
        &[],
        tls("a1", "plant-a"),
    );
    let b1 = start_agent_tls(
        &dir.path().join("b1"),
        "b1",
        &c.url,
        &[],
        tls("b1", "plant-b"),
    );
    // Agents are visible to an operator only through its tenant's packs:
    // wait on the controller's own log.
    let up = |id: &str| {
        c.log()
            .lines()
            .any(|l| l.contains("agent connected") && l.contains(&format!("agent={id}")))
    };
    assert!(
        wait_until(WAIT, || up("a1") && up("b1")),
        "{}\n{}",
        a1.log(),
        b1.log()
    );

    let pa = pack(dir.path(), "plant-a", "line", "a1");
    let pb = pack(dir.path(), "plant-b", "secret-line", "b1");
    let path = |p: &PathBuf| p.to_str().expect("utf-8").to_string();

    // A viewer cannot push.
    let o = c.ctl_as(&vic, &["push", &path(&pa)]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("PermissionDenied") || text(&o).contains("viewer"),
        "{}",
        text(&o)
    );
    // An operator cannot push into another tenant.
    let o = c.ctl_as(&ann, &["push", &path(&pb)]);
    assert!(!o.status.success(), "{}", text(&o));
    // Each pushes its own.
    let o = c.ctl_as(&ann, &["push", &path(&pa)]);
    assert!(o.status.success(), "{}", text(&o));
    let o = c.ctl_as(&bob, &["push", &path(&pb)]);
    assert!(o.status.success(), "{}", text(&o));

    // Lists show only the caller's tenant, and nothing of the other's names.
    for who in [&ann, &vic] {
        let o = c.ctl_as(who, &["packs", "--json"]);
        assert!(o.status.success(), "{}", text(&o));
        let packs = json_lines(&o.stdout);
        assert_eq!(packs.len(), 1, "{}", text(&o));
        assert_eq!(packs[0]["pack"], "line");
        let o = c.ctl_as(who, &["agents", "--json"]);
        let agents = json_lines(&o.stdout);
        let ids: Vec<&str> = agents.iter().filter_map(|a| a["id"].as_str()).collect();
        assert_eq!(ids, ["a1"], "{}", text(&o));
        for o in [
            c.ctl_as(who, &["packs"]),
            c.ctl_as(who, &["agents"]),
            c.ctl_as(who, &["feedback", "--pack", "line"]),
        ] {
            let t = text(&o);
            assert!(
                !t.contains("plant-b") && !t.contains("secret-line") && !t.contains("b1"),
                "{t}"
            );
        }
    }

    // Another tenant's pack: invisible, and cancelling it is "not found"
    // like a pack that does not exist; it keeps running on its agent.
    let o = c.ctl_as(
        &ann,
        &[
            "feedback",
            "--pack",
            "secret-line",
            "--tenant",
            "plant-b",
            "--json",
        ],
    );
    assert!(json_lines(&o.stdout).is_empty(), "{}", text(&o));
    let o = c.ctl_as(&ann, &["cancel", "secret-line", "--tenant", "plant-b"]);
    assert!(!o.status.success());
    let refused = text(&o);
    let o = c.ctl_as(&ann, &["cancel", "no-such-pack", "--tenant", "plant-b"]);
    assert!(!o.status.success());
    assert_eq!(
        refused.replace("secret-line", "X"),
        text(&o).replace("no-such-pack", "X"),
        "a refusal must not tell an existing pack of another tenant from a missing one"
    );
    // A viewer cannot cancel its own tenant's pack either.
    let o = c.ctl_as(&vic, &["cancel", "line"]);
    assert!(!o.status.success(), "{}", text(&o));
    let o = c.ctl_as(&bob, &["packs", "--json"]);
    let packs = json_lines(&o.stdout);
    assert_eq!(packs.len(), 1);
    assert_eq!(packs[0]["cancelled"], false, "plant-b's pack survived");

    // The audit log: admins only, and it has every action with its result.
    let o = c.ctl_as(&vic, &["audit"]);
    assert!(!o.status.success(), "{}", text(&o));
    let o = c.ctl_as(&ada, &["audit", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let log = json_lines(&o.stdout);
    let has = |who: &str, action: &str, ok: bool| {
        log.iter().any(|r| {
            r["who"] == who
                && r["action"] == action
                && (r["result"] == "ok") == ok
                && r["role"].as_str().is_some_and(|s| !s.is_empty())
        })
    };
    assert!(has("vic", "push", false), "{log:?}");
    assert!(has("ann", "push", false), "{log:?}");
    assert!(has("ann", "push", true), "{log:?}");
    assert!(has("ann", "cancel", false), "{log:?}");
    assert!(has("vic", "cancel", false), "{log:?}");
    // plant-a's admin does not see plant-b's records.
    assert!(log.iter().all(|r| r["tenant"] == "plant-a"), "{log:?}");
}

fn pack_to(dir: &Path, tenant: &str, name: &str, targets: &str, line: u32) -> PathBuf {
    let p = dir.join(format!("{tenant}-{name}.yaml"));
    std::fs::write(
        &p,
        format!(
            "pack: {name}\nversion: 1\ntenant: {tenant}\ntargets: {targets}\n\
             safe_state:\n  - {{action: gpio.write, params: {{line: {line}, value: 0}}}}\n\
             instructions:\n  - {{id: tick, action: gpio.toggle, params: {{line: {line}}}, every: 200ms}}\n"
        ),
    )
    .expect("write pack");
    p
}

/// Packs (tenant, pack) agent `id` holds, as `who` sees them.
fn held(
    c: &baton_e2e::fleet::Controller,
    who: &(PathBuf, PathBuf),
    id: &str,
) -> Vec<(String, String)> {
    let o = c.ctl_as(who, &["agents", "--json"]);
    json_lines(&o.stdout)
        .iter()
        .filter(|a| a["id"] == id)
        .flat_map(|a| a["packs"].as_array().cloned().unwrap_or_default())
        .filter(|p| p["stopped"] == false)
        .map(|p| {
            (
                p["tenant"].as_str().unwrap_or("").to_string(),
                p["pack"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[test]
fn admins_label_and_forget_agents_of_their_tenant_and_revocations_are_audited() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::init(&dir.path().join("ca"));
    let ada = ca.operator("ada", "plant-a", "admin");
    let ann = ca.operator("ann", "plant-a", "operator");
    let bea = ca.operator("bea", "plant-b", "admin");
    let c = start_controller_tls(
        &dir.path().join("ctl"),
        "127.0.0.1:0",
        ControllerTls {
            dir: ca.dir.clone(),
            operator: ada.clone(),
            serve_args: Vec::new(),
        },
    );
    let tls = |name: &str, t: &str| ca.agent_tls(ca.agent(name, &["--tenant", t]));
    let a1 = start_agent_tls(
        &dir.path().join("a1"),
        "a1",
        &c.url,
        &["line=3"],
        tls("a1", "plant-a"),
    );
    let b1 = start_agent_tls(
        &dir.path().join("b1"),
        "b1",
        &c.url,
        &["line=3"],
        tls("b1", "plant-b"),
    );
    let connects = |id: &str| {
        c.log()
            .lines()
            .filter(|l| l.contains("agent connected") && l.contains(&format!("agent={id}")))
            .count()
    };
    assert!(
        wait_until(WAIT, || connects("a1") == 1 && connects("b1") == 1),
        "{}\n{}",
        a1.log(),
        b1.log()
    );
    let path = |p: PathBuf| p.to_str().expect("utf-8").to_string();
    let base = path(pack_to(dir.path(), "plant-a", "base", "{agents: [a1]}", 1));
    let press = path(pack_to(
        dir.path(),
        "plant-a",
        "press",
        "{labels: {line: \"4\"}}",
        2,
    ));
    let other = path(pack_to(dir.path(), "plant-b", "other", "{agents: [b1]}", 1));
    // `press` targets line=4, which no agent has yet: stored, exit 4.
    for (who, p, code) in [(&ada, &base, 0), (&ada, &press, 4), (&bea, &other, 0)] {
        let o = c.ctl_as(who, &["push", "--no-wait", p]);
        assert_eq!(o.status.code(), Some(code), "{}", text(&o));
    }
    let a = |p: &str| ("plant-a".to_string(), p.to_string());
    assert!(wait_until(WAIT, || held(&c, &ada, "a1") == [a("base")]));

    // Only admins label; an agent the tenant does not see is "no agent",
    // word for word like one that does not exist.
    let o = c.ctl_as(&ann, &["agents", "label", "a1", "line=4"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("PermissionDenied"), "{}", text(&o));
    let o = c.ctl_as(&ada, &["agents", "label", "b1", "line=4"]);
    assert!(!o.status.success(), "{}", text(&o));
    let hidden = text(&o);
    let o = c.ctl_as(&ada, &["agents", "label", "zz", "line=4"]);
    assert_eq!(hidden.replace("b1", "X"), text(&o).replace("zz", "X"));
    assert!(!hidden.contains("plant-b"), "{hidden}");
    let o = c.ctl_as(&ada, &["agents", "forget", "b1"]);
    assert!(
        !o.status.success() && text(&o).contains("no agent b1"),
        "{}",
        text(&o)
    );

    // line=4 for plant-a's packs: `press` now targets a1 and is delivered.
    let o = c.ctl_as(&ada, &["agents", "label", "a1", "line=4", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let r = &json_lines(&o.stdout)[0];
    assert_eq!(r["labels"]["line"], "4", "{r}");
    assert_eq!(r["agent_labels"]["line"], "3", "{r}");
    assert!(
        wait_until(WAIT, || held(&c, &ada, "a1") == [a("base"), a("press")]),
        "{:?}\n{}",
        held(&c, &ada, "a1"),
        c.log()
    );
    // `agents` shows the labels plant-a's packs target on.
    let o = c.ctl_as(&ada, &["agents", "--json"]);
    let ours = json_lines(&o.stdout);
    assert_eq!(ours[0]["labels"]["line"], "4");
    // Hiding the key untargets `press`: the agent drops it.
    let o = c.ctl_as(&ada, &["agents", "label", "a1", "--remove", "line"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        wait_until(WAIT, || held(&c, &ada, "a1") == [a("base")]),
        "{:?}",
        held(&c, &ada, "a1")
    );

    // Forget a1 (only plant-a uses it): its record goes, its stream is
    // closed, and it comes back with a new hello.
    let o = c.ctl_as(&ada, &["agents", "forget", "a1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("stream was closed"), "{}", text(&o));
    assert!(wait_until(WAIT, || connects("a1") == 2), "{}", c.log());
    // Its labels went with it: line=3 again, and `base` still targets it.
    assert!(wait_until(WAIT, || held(&c, &ada, "a1") == [a("base")]));
    let o = c.ctl_as(&ada, &["agents", "--json"]);
    assert_eq!(json_lines(&o.stdout)[0]["labels"]["line"], "3");

    // A revocation made with `ca revoke` shows in the audit log once the
    // controller picks it up: in plant-b's (b1 holds its pack), not
    // plant-a's.
    ca.revoke("b1");
    let revoked = |who: &(PathBuf, PathBuf)| {
        let o = c.ctl_as(who, &["audit", "--json"]);
        json_lines(&o.stdout).into_iter().any(|r| {
            r["action"] == "revoke"
                && r["who"] == "ca"
                && r["target"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("agent b1 (serial "))
        })
    };
    assert!(wait_until(WAIT, || revoked(&bea)), "{}", c.log());
    assert!(!revoked(&ada));

    // Every label and forget, refused ones too, is audited for plant-a.
    let o = c.ctl_as(&ada, &["audit", "--json"]);
    let log = json_lines(&o.stdout);
    let has = |who: &str, action: &str, ok: bool| {
        log.iter()
            .any(|r| r["who"] == who && r["action"] == action && (r["result"] == "ok") == ok)
    };
    assert!(has("ann", "label", false), "{log:?}");
    assert!(has("ada", "label", false), "{log:?}");
    assert!(has("ada", "label", true), "{log:?}");
    assert!(has("ada", "forget", false), "{log:?}");
    assert!(has("ada", "forget", true), "{log:?}");
    assert!(log.iter().all(|r| r["tenant"] == "plant-a"), "{log:?}");
    assert!(
        !o.stdout.is_empty() && !text(&o).contains("plant-b"),
        "{log:?}"
    );
}
