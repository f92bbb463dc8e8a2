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
    let tls = |name: &str| ca.agent_tls(ca.agent(name, &[]));
    let a1 = start_agent_tls(&dir.path().join("a1"), "a1", &c.url, &[], tls("a1"));
    let b1 = start_agent_tls(&dir.path().join("b1"), "b1", &c.url, &[], tls("b1"));
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
