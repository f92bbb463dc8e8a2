//! mTLS end to end: certificates made by `baton-controller ca`, a real
//! controller serving `--tls-dir`, real agents and operator commands.
//! push → ack → feedback over mTLS; every refused credential (another CA,
//! expired, revoked, another name, the wrong kind) refused with a clear
//! status, logged, nothing delivered; plaintext, garbage and a half-open
//! handshake against the TLS port without harm to a live stream; plaintext
//! on a non-loopback address refused at start.

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use baton_e2e::fleet::{
    AgentTls, Ca, Controller, json_lines, start_agent_tls, start_agent_tls_with,
    start_certified_agent, start_mtls,
};
use baton_e2e::{bin, run, wait_until};

const WAIT: Duration = Duration::from_secs(30);

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn blink(name: &str, targets: &str, line: u32) -> String {
    format!(
        "pack: {name}\nversion: 1\ntargets: {targets}\n\
         safe_state:\n  - {{action: gpio.write, params: {{line: {line}, value: 0}}}}\n\
         instructions:\n  - id: tick\n    action: gpio.toggle\n    params: {{line: {line}}}\n    every: 100ms\n"
    )
}

fn known(c: &Controller, id: &str) -> bool {
    c.agents().iter().any(|a| a["id"] == id)
}

#[test]
fn push_ack_and_feedback_over_mtls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, c) = start_mtls(dir.path(), "ann", &[]);
    assert!(c.url.starts_with("https://"), "{}", c.url);
    let a = start_certified_agent(dir.path(), &ca, &c.url, "a1");
    assert!(
        wait_until(WAIT, || c.connected("a1")),
        "agent never connected; agent log:\n{}\ncontroller log:\n{}",
        a.log(),
        c.log()
    );
    let pack = dir.path().join("p.yaml");
    std::fs::write(&pack, blink("p", "{agents: [a1]}", 5)).expect("write");
    let o = c.ctl(&["push", pack.to_str().expect("utf-8")]);
    assert!(o.status.success(), "push: {}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("acked"), "{}", stdout(&o));
    assert!(
        wait_until(WAIT, || c
            .feedback("p")
            .iter()
            .filter(|f| f["outcome"] == "ok")
            .count()
            >= 3),
        "no feedback; agent log:\n{}",
        a.log()
    );
    assert!(
        c.log().contains("controller listening (mTLS)"),
        "{}",
        c.log()
    );
    // The same operator command in plaintext is refused by the client.
    let o = run(
        Command::new(bin("baton-controller")).args([
            "agents",
            "--controller",
            &c.url.replace("https", "http"),
        ]),
        WAIT,
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--insecure"), "{}", stderr(&o));
}

/// Defence in depth: whatever the controller sends, the agent checks its
/// own GPIO line and exec allowlists. A pack pushed through the controller
/// over mTLS naming a line or a program outside them is nacked by the agent
/// (refused, with its message), nothing of it fires, and the
/// controller shows the nack; an allowed pack on the same agent runs.
#[test]
fn the_agent_re_checks_its_allowlists_on_pushed_packs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, c) = start_mtls(dir.path(), "ann", &[]);
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(
        &cfg,
        "allowed-lines: [\"gpiochip0:12\"]\nexec-allowlist: [/usr/bin/true]\n",
    )
    .expect("write config");
    let a = start_agent_tls_with(
        &dir.path().join("g1"),
        "g1",
        &c.url,
        &[],
        ca.agent_tls(ca.agent("g1", &[])),
        &["--config", cfg.to_str().expect("utf-8")],
    );
    assert!(
        wait_until(WAIT, || c.connected("g1")),
        "agent never connected; agent log:\n{}\ncontroller log:\n{}",
        a.log(),
        c.log()
    );
    let marker = dir.path().join("ran");
    let write = |name: &str, yaml: String| {
        let p = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&p, yaml).expect("write pack");
        p.to_str().expect("utf-8").to_string()
    };
    let relay = write("relay", blink("relay", "{agents: [g1]}", 17));
    let touch = write(
        "touch",
        format!(
            "pack: touch\nversion: 1\ntargets: {{agents: [g1]}}\ninstructions:\n  - {{id: mark, action: exec, params: {{program: /usr/bin/touch, args: [{}]}}, every: 200ms}}\n",
            marker.display()
        ),
    );
    for (file, instruction, message) in [
        (&relay, "tick", "not on the agent's allowlist"),
        (
            &touch,
            "mark",
            "\"/usr/bin/touch\" refused: not on the agent's exec allowlist",
        ),
    ] {
        // The controller's own checks pass: only the agent can refuse.
        let o = c.ctl(&["push", "--json", file]);
        assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
        let events = json_lines(&o.stdout);
        let d = events
            .iter()
            .find(|e| e["event"] == "delivery" && e["agent"] == "g1")
            .unwrap_or_else(|| panic!("no delivery: {}", stdout(&o)));
        assert_eq!(d["state"], "nacked", "{d}");
        // A refusal at admission (not a parse error): the agent's message,
        // naming the instruction, is the delivery's reason.
        let reason = d["reason"].as_str().unwrap_or("");
        assert!(
            reason.contains(&format!("instruction `{instruction}`")) && reason.contains(message),
            "{d}"
        );
    }
    // `packs` counts both nacks.
    let packs = json_lines(&c.ctl(&["packs", "--json"]).stdout);
    for name in ["relay", "touch"] {
        let p = packs
            .iter()
            .find(|p| p["pack"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {packs:?}"));
        assert_eq!(
            (p["nacked"].as_u64(), p["acked"].as_u64()),
            (Some(1), Some(0)),
            "{p}"
        );
    }
    // An allowed pack runs on the same agent; the refused ones never did.
    let ok = write("ok", blink("ok", "{agents: [g1]}", 12));
    let o = c.ctl(&["push", &ok]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        wait_until(WAIT, || a
            .writes()
            .iter()
            .filter(|w| w["line"] == 12)
            .count()
            >= 3),
        "allowed pack never fired; agent log:\n{}",
        a.log()
    );
    assert!(
        a.writes().iter().all(|w| w["line"] == 12),
        "{:?}",
        a.writes()
    );
    assert!(!marker.exists(), "the refused program ran");
    assert!(
        c.feedback("relay").is_empty() && c.feedback("touch").is_empty(),
        "feedback of refused packs"
    );
}

#[test]
fn refused_agent_credentials_deliver_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, c) = start_mtls(dir.path(), "ann", &[]);
    // Every agent here is targeted: a refused one must receive nothing.
    let pack = dir.path().join("p.yaml");
    std::fs::write(
        &pack,
        blink("p", "{agents: [other-ca, expired, a3, ann, victim]}", 5),
    )
    .expect("write");
    // None of them has connected yet: stored, and said to target no agent
    // now (exit 4), as a typo would be.
    let o = c.ctl(&["push", "--no-wait", pack.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(4), "push: {}", stderr(&o));
    assert!(stderr(&o).contains("targets no agent"), "{}", stderr(&o));

    // A certificate of another CA.
    let other = Ca::init(&dir.path().join("other-ca"));
    let mut other_agent = start_agent_tls(
        &dir.path().join("a-other"),
        "other-ca",
        &c.url,
        &[],
        AgentTls {
            ca: ca.ca_pem(),
            ..other.agent_tls(other.agent("other-ca", &[]))
        },
    );
    // An expired one.
    let expired = ca.agent("expired", &["--not-after", "2024-01-01T00:00:00Z"]);
    let mut expired_agent = start_agent_tls(
        &dir.path().join("a-expired"),
        "expired",
        &c.url,
        &[],
        ca.agent_tls(expired),
    );
    // Agent a2's certificate, saying hello as a3.
    let mut liar = start_agent_tls(
        &dir.path().join("a-liar"),
        "a3",
        &c.url,
        &[],
        ca.agent_tls(ca.agent("a2", &[])),
    );
    // An operator's certificate on the agents' link.
    let mut op_agent = start_agent_tls(
        &dir.path().join("a-op"),
        "ann",
        &c.url,
        &[],
        ca.agent_tls(ca.operator("ann2", "default", "admin")),
    );
    let log_has = |what: &str| wait_until(WAIT, || c.log().contains(what));
    assert!(
        log_has("TLS handshake refused: invalid peer certificate: UnknownIssuer"),
        "{}",
        c.log()
    );
    assert!(
        log_has("TLS handshake refused: invalid peer certificate: certificate expired"),
        "{}",
        c.log()
    );
    assert!(
        log_has(
            "link stream refused before hello: refused: hello as agent `a3` on a certificate of agent `a2`"
        ),
        "{}",
        c.log()
    );
    assert!(
        log_has("refused: operator ann2 (tenant default, role admin) opened a link stream"),
        "{}",
        c.log()
    );
    // The agents are told why (they keep retrying, with backoff).
    let told =
        |a: &baton_e2e::fleet::Agent, what: &str| wait_until(WAIT, || a.log().contains(what));
    assert!(told(&liar, "PermissionDenied"), "{}", liar.log());
    assert!(
        told(&liar, "hello as agent `a3` on a certificate of agent `a2`"),
        "{}",
        liar.log()
    );
    assert!(
        told(
            &op_agent,
            "an operator certificate cannot open a link stream"
        ),
        "{}",
        op_agent.log()
    );
    assert!(
        told(&expired_agent, "the controller refused the stream"),
        "{}",
        expired_agent.log()
    );
    assert!(
        told(&other_agent, "the controller refused the stream"),
        "{}",
        other_agent.log()
    );
    // A TLS 1.3 client learns of a refused certificate only as a broken
    // connection (the alert comes after its side of the handshake); the
    // controller's log above says why.
    for a in [&liar, &op_agent, &expired_agent, &other_agent] {
        assert!(!a.log().contains("welcomed"), "{}", a.log());
    }
    // Nothing delivered: none of them ever became a known agent, and no
    // delivery of the pack left the controller.
    for id in ["other-ca", "expired", "a3", "a2", "ann", "ann2"] {
        assert!(!known(&c, id), "{id} is known: {:?}", c.agents());
    }
    for a in [&liar, &op_agent, &expired_agent, &other_agent] {
        assert!(a.writes().is_empty(), "{} fired: {:?}", a.id, a.writes());
    }
    for a in [
        &mut liar,
        &mut op_agent,
        &mut expired_agent,
        &mut other_agent,
    ] {
        a.kill9();
    }
}

#[test]
fn an_agent_certificate_cannot_call_the_operators_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, c) = start_mtls(dir.path(), "ann", &[]);
    let (cert, key) = ca.agent("a1", &[]);
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["agents", "--controller", &c.url, "--cert"])
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .arg("--ca")
            .arg(ca.ca_pem()),
        WAIT,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "PermissionDenied: agent a1: an agent certificate cannot use the operators' API"
        ),
        "{}",
        stderr(&o)
    );
    assert!(
        c.log()
            .contains("refused: agent a1 called the operators' API"),
        "{}",
        c.log()
    );
    // Operators may use environment variables instead of flags.
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["agents", "--json"])
            .env("BATON_CONTROLLER", &c.url)
            .env("BATON_CERT", ca.dir.join("operators/ann.pem"))
            .env("BATON_KEY", ca.dir.join("operators/ann-key.pem"))
            .env("BATON_CA", ca.ca_pem()),
        WAIT,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // Or a profile file (paths relative to it); flags still win.
    let profile = ca.dir.join("profile.yaml");
    std::fs::write(
        &profile,
        format!(
            "controller: {}\ncert: operators/ann.pem\nkey: operators/ann-key.pem\nca: ca.pem\n",
            c.url
        ),
    )
    .expect("profile");
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["agents", "--json"])
            .env("BATON_PROFILE", &profile),
        WAIT,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["agents", "--cert"])
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .env("BATON_PROFILE", &profile),
        WAIT,
    );
    assert!(
        stderr(&o).contains("an agent certificate cannot use the operators' API"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_revoked_agent_is_cut_off_within_seconds_and_refused_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, c) = start_mtls(dir.path(), "ann", &[]);
    let a = start_certified_agent(dir.path(), &ca, &c.url, "a1");
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());
    let o = ca.revoke("a1");
    assert!(stdout(&o).contains("revoked"), "{}", stdout(&o));
    let t0 = Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || !c.connected("a1")),
        "still connected 10 s after revocation; log:\n{}",
        c.log()
    );
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    assert!(
        wait_until(WAIT, || c.log().contains("link stream ended: certificate")),
        "{}",
        c.log()
    );
    // Its reconnection attempts are refused.
    assert!(
        wait_until(WAIT, || c
            .log()
            .contains("refused: revoked certificate of agent a1")),
        "{}",
        c.log()
    );
    assert!(
        wait_until(WAIT, || a.log().contains("is revoked")),
        "{}",
        a.log()
    );
    assert!(!c.connected("a1"));
    // A new certificate for the name is a new credential.
    let _ = ca.agent("a1", &[]);
    // (the agent backs off up to 30 s between attempts)
    assert!(
        wait_until(Duration::from_secs(90), || c.connected("a1")),
        "re-issued certificate not accepted; agent log:\n{}",
        a.log()
    );
}

#[test]
fn a_revoked_operator_is_refused_and_its_watch_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, c) = start_mtls(dir.path(), "ann", &[]);
    // A pack of the operator's tenant for a1 first: an operator sees only
    // the agents of its tenant's packs (events of others are not shown).
    let pack = dir.path().join("p.yaml");
    std::fs::write(&pack, blink("p", "{agents: [a1]}", 5)).expect("write");
    let o = c.ctl(&["push", "--no-wait", pack.to_str().expect("utf-8")]);
    // a1 connects later: stored, targeting no agent yet (exit 4).
    assert_eq!(o.status.code(), Some(4), "push: {}", stderr(&o));
    let out = dir.path().join("watch.out");
    let err = dir.path().join("watch.err");
    let tls = c.tls.clone().expect("tls");
    let mut watch = baton_e2e::Running(
        Command::new(bin("baton-controller"))
            .args(["watch", "--json", "--controller", &c.url, "--cert"])
            .arg(&tls.operator.0)
            .arg("--key")
            .arg(&tls.operator.1)
            .arg("--ca")
            .arg(ca.ca_pem())
            .stdout(std::fs::File::create(&out).expect("out"))
            .stderr(std::fs::File::create(&err).expect("err"))
            .spawn()
            .expect("spawn watch"),
    );
    // The watch is live once it shows an agent connecting.
    let a = start_certified_agent(dir.path(), &ca, &c.url, "a1");
    assert!(
        wait_until(WAIT, || std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains("a1")),
        "watch saw nothing; agent log:\n{}",
        a.log()
    );
    ca.revoke("ann");
    let status = baton_e2e::wait_exit(&mut watch, Duration::from_secs(10));
    let text = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(
        status.is_some_and(|s| !s.success()),
        "watch still running 10 s after revocation; {text}"
    );
    assert!(text.contains("is revoked"), "{text}");
    let o = c.ctl(&["agents"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("PermissionDenied")
            && stderr(&o).contains("(operator ann (tenant default, role admin)) is revoked"),
        "{}",
        stderr(&o)
    );
    // The agent's stream is not the operator's: it stays up.
    assert!(!a.log().contains("session=2"), "{}", a.log());
}

#[test]
fn plaintext_garbage_and_half_open_handshakes_do_not_disturb_a_live_stream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, c) = start_mtls(dir.path(), "ann", &["--tls-handshake-timeout", "1s"]);
    let a = start_certified_agent(dir.path(), &ca, &c.url, "a1");
    assert!(wait_until(WAIT, || c.connected("a1")), "{}", a.log());

    // A half-open handshake: a TLS record header and nothing more. The
    // controller closes it after the timeout.
    let mut half = std::net::TcpStream::connect(&c.addr).expect("connect");
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
        .expect("write");
    half.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    let closed = match half.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(closed, "half-open handshake not closed");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "closed after {:?}",
        t0.elapsed()
    );
    assert!(
        wait_until(WAIT, || c
            .log()
            .contains("TLS handshake not done within 1s")),
        "{}",
        c.log()
    );

    // Garbage bytes.
    let mut g = std::net::TcpStream::connect(&c.addr).expect("connect");
    let _ = g.write_all(b"\x00\xffGET / HTTP/1.1\r\n\r\nnot tls at all");
    g.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let _ = g.read(&mut buf);
    assert!(
        wait_until(WAIT, || c.log().contains("TLS handshake refused")),
        "{}",
        c.log()
    );
    // A plaintext gRPC client: told, in HTTP/2 it can read, that the port
    // speaks mTLS.
    let o = run(
        Command::new(bin("baton-controller")).args([
            "agents",
            "--insecure",
            "--controller",
            &c.url.replace("https", "http"),
        ]),
        WAIT,
    );
    assert!(!o.status.success(), "plaintext accepted: {}", stdout(&o));
    assert!(
        stderr(&o).contains("Unauthenticated: this controller's port speaks mTLS"),
        "{}",
        stderr(&o)
    );
    assert!(
        wait_until(WAIT, || c
            .log()
            .contains("plaintext HTTP/2 on the mTLS port")),
        "{}",
        c.log()
    );

    // The live stream never noticed: still the first session.
    assert!(c.connected("a1"));
    assert!(a.log().contains("welcomed session=1"), "{}", a.log());
    assert!(!a.log().contains("session=2"), "{}", a.log());
}

/// What `baton-controller <cmd>` says for each way mTLS can fail (issue
/// 26.13): before, an expired certificate read "Cancelled: operation was
/// canceled", another CA's "Unknown: transport error", plaintext to the
/// TLS port "h2 protocol error".
#[test]
fn tls_failures_at_the_cli_say_what_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, c) = start_mtls(dir.path(), "ann", &[]);
    let ann = c.tls.clone().expect("tls").operator;
    let cli =
        |cert: &std::path::Path, key: &std::path::Path, ca_pem: &std::path::Path, url: &str| {
            run(
                Command::new(bin("baton-controller"))
                    .args(["packs", "--controller", url, "--cert"])
                    .arg(cert)
                    .arg("--key")
                    .arg(key)
                    .arg("--ca")
                    .arg(ca_pem),
                WAIT,
            )
        };
    let says = |o: &std::process::Output, what: &[&str]| {
        assert_eq!(o.status.code(), Some(1), "{}", stderr(o));
        for w in what {
            assert!(stderr(o).contains(w), "wanted {w:?} in: {}", stderr(o));
        }
    };

    // An expired operator certificate: which one, and when.
    let o = run(
        Command::new(bin("baton-controller"))
            .args([
                "ca",
                "issue-operator",
                "old",
                "--tenant",
                "default",
                "--role",
                "admin",
                "--not-after",
                "2024-01-01T00:00:00Z",
                "--dir",
            ])
            .arg(&ca.dir),
        WAIT,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let old = (
        ca.dir.join("operators/old.pem"),
        ca.dir.join("operators/old-key.pem"),
    );
    says(
        &cli(&old.0, &old.1, &ca.ca_pem(), &c.url),
        &[
            "the operator certificate --cert",
            "old.pem (operator old (tenant default, role admin)) expired at 2024-01-01T00:00:00Z",
        ],
    );

    // A certificate of another CA: the controller refused it, and why.
    let other = Ca::init(&dir.path().join("other-ca"));
    let eve = other.operator("eve", "default", "admin");
    says(
        &cli(&eve.0, &eve.1, &ca.ca_pem(), &c.url),
        &[
            "the controller refused the operator certificate --cert",
            "(operator eve (tenant default, role admin)): not signed by the CA it trusts (it was issued by `baton fleet CA ",
        ],
    );
    // --ca of another CA: the controller's certificate is not signed by it.
    says(
        &cli(&ann.0, &ann.1, &other.ca_pem(), &c.url),
        &[
            "the controller's certificate is not signed by the CA in --ca",
            "other-ca/ca.pem (`baton fleet CA ",
            "pass the ca.pem of the CA directory the controller serves",
        ],
    );
    // One operator's certificate with another's key: found before dialling.
    let bob = ca.operator("bob", "default", "viewer");
    says(
        &cli(&ann.0, &bob.1, &ca.ca_pem(), &c.url),
        &[
            "bob-key.pem does not belong to --cert",
            "ann.pem (operator ann",
        ],
    );
    assert!(!c.log().contains("bob"), "{}", c.log());
    // https:// toward a plaintext controller.
    let plain = baton_e2e::fleet::start_controller(&dir.path().join("plain"), "127.0.0.1:0");
    says(
        &cli(
            &ann.0,
            &ann.1,
            &ca.ca_pem(),
            &plain.url.replace("http://", "https://"),
        ),
        &["did not answer in TLS: the controller there serves plaintext (`serve --insecure`)"],
    );
    // http:// toward the TLS controller.
    let o = run(
        Command::new(bin("baton-controller")).args([
            "packs",
            "--insecure",
            "--controller",
            &c.url.replace("https://", "http://"),
        ]),
        WAIT,
    );
    says(&o, &["this controller's port speaks mTLS", "dial https://"]);
    // A missing file is named.
    says(
        &cli(&dir.path().join("nope.pem"), &ann.1, &ca.ca_pem(), &c.url),
        &["--cert ", "nope.pem: No such file"],
    );
    // And the right files still work.
    let o = cli(&ann.0, &ann.1, &ca.ca_pem(), &c.url);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn plaintext_on_a_non_loopback_address_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["serve", "--insecure", "--listen", "0.0.0.0:0", "--data"])
            .arg(dir.path().join("d")),
        WAIT,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--insecure on 0.0.0.0:0: plaintext is refused on a non-loopback address, because anyone who reaches it could push to agents"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("--insecure-any"), "{}", stderr(&o));
    // Neither transport: told both ways.
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path().join("d")),
        WAIT,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("pass --tls-dir DIR") && stderr(&o).contains("--insecure"),
        "{}",
        stderr(&o)
    );
    // A CA directory without the files: the path is named.
    let o = run(
        Command::new(bin("baton-controller"))
            .args(["serve", "--listen", "127.0.0.1:0", "--tls-dir"])
            .arg(dir.path().join("no-ca"))
            .arg("--data")
            .arg(dir.path().join("d")),
        WAIT,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no-ca/ca.pem"), "{}", stderr(&o));
}
