//! The configuration's tests: files and flags resolved, and every refusal
//! with its message.

use super::dispatch::parse_share;
use super::*;

#[test]
fn the_spin_budget_is_a_share_of_a_core() {
    assert_eq!(parse_share("1%"), Some(10_000));
    assert_eq!(parse_share("0.5 %"), Some(5_000));
    assert_eq!(parse_share("0%"), Some(0));
    assert_eq!(parse_share("60%"), None);
    assert_eq!(parse_share("1"), None);
    let f = parse_file("a.yaml", "realtime: {spin-budget: 2%}\n").expect("syntax ok");
    let c = resolve(f, Overrides::default()).expect("valid");
    assert_eq!(c.rt.spin_budget_ppm, 20_000);
    let f = parse_file("a.yaml", "realtime: {spin-budget: lots}\n").expect("syntax ok");
    assert!(resolve(f, Overrides::default()).is_err());
}

#[test]
fn the_idle_latency_is_held_at_zero_unless_a_bound_or_off_is_given() {
    let idle = |text: &str, no_rt: bool| {
        let f = parse_file("a.yaml", text).expect("syntax ok");
        let o = Overrides {
            no_rt,
            ..Overrides::default()
        };
        resolve(f, o).map(|c| c.rt.idle_latency_us)
    };
    assert_eq!(idle("{}\n", false).expect("default"), Some(0));
    assert_eq!(
        idle("realtime: {idle-latency: 50us}\n", false).expect("bound"),
        Some(50)
    );
    assert_eq!(
        idle("realtime: {idle-latency: off}\n", false).expect("off"),
        None
    );
    // --no-rt asks for nothing only root may have.
    assert_eq!(idle("{}\n", true).expect("no rt"), None);
    let e = idle("realtime: {idle-latency: soon}\n", false).expect_err("not a duration");
    assert!(e.to_string().contains("realtime.idle-latency"), "{e}");
}

#[test]
fn metrics_address_from_the_file_or_the_flag() {
    let f = parse_file("agent.yaml", "metrics: 127.0.0.1:9187\n").expect("valid");
    let c = resolve(f.clone(), Overrides::default()).expect("resolves");
    assert_eq!(c.metrics, Some("127.0.0.1:9187".parse().expect("addr")));
    let o = Overrides {
        metrics: Some("[::1]:9000".into()),
        ..Overrides::default()
    };
    assert_eq!(
        resolve(f, o).expect("ok").metrics,
        Some("[::1]:9000".parse().expect("addr"))
    );
    let d = resolve(ConfigFile::default(), Overrides::default()).expect("ok");
    assert_eq!(d.metrics, None);
    let bad = parse_file("agent.yaml", "metrics: localhost\n").expect("a string");
    let e = resolve(bad, Overrides::default()).expect_err("refused");
    assert!(e.to_string().contains("metrics"), "{e}");
}

#[test]
fn log_format_from_the_file_or_the_flag() {
    use baton_service::log::LogFormat;
    let f = parse_file("agent.yaml", "log-format: json\n").expect("valid");
    let c = resolve(f.clone(), Overrides::default()).expect("resolves");
    assert_eq!(c.log_format, LogFormat::Json);
    let o = Overrides {
        log_format: Some("journald".into()),
        ..Overrides::default()
    };
    assert_eq!(resolve(f, o).expect("ok").log_format, LogFormat::Journald);
    let d = resolve(ConfigFile::default(), Overrides::default()).expect("ok");
    assert_eq!(d.log_format, LogFormat::Auto);
    let bad = parse_file("agent.yaml", "log-format: syslog\n").expect("a string");
    let e = resolve(bad, Overrides::default()).expect_err("refused");
    assert!(e.to_string().contains("syslog"), "{e}");
}

#[test]
fn a_full_file_parses_and_flags_override_it() {
    let f = parse_file(
        "agent.yaml",
        "id: press-01\ndata-dir: /var/lib/baton\ngpio: sim:/tmp/x.jsonl\nallowed-lines: [\"gpiochip0:17\", RELAY_MAIN]\nexec-allowlist: [/usr/sbin/logrotate]\nrealtime: {priority: 70, cpu: 1}\narm-horizon: 2ms\n",
    )
    .expect("valid");
    let c = resolve(
        f,
        Overrides {
            id: Some("other".into()),
            ..Overrides::default()
        },
    )
    .expect("resolves");
    assert_eq!(c.id, "other");
    assert_eq!(c.data_dir, PathBuf::from("/var/lib/baton"));
    assert_eq!(c.rt.priority, Some(70));
    assert_eq!(c.rt.cpu, Some(1));
    assert_eq!(c.arm_horizon, Duration::from_millis(2));
    assert!(!c.allowed_lines.is_unrestricted());
}

#[test]
fn unknown_keys_are_refused_with_their_position() {
    let e = parse_file("agent.yaml", "id: a\nrealtime:\n  prio: 3\n").expect_err("unknown");
    let text = e.to_string();
    assert!(
        text.starts_with("agent.yaml:3:3: unknown field `prio`"),
        "{text}"
    );
}

#[test]
fn bad_values_are_refused() {
    let f = parse_file("a.yaml", "gpio: gpu\n").expect("syntax ok");
    let e = resolve(f, Overrides::default()).expect_err("bad backend");
    assert!(e.to_string().starts_with("gpio `gpu`"), "{e}");
    let f = parse_file("a.yaml", "exec-allowlist: [bin/true]\n").expect("syntax ok");
    let e = resolve(f, Overrides::default()).expect_err("relative");
    assert_eq!(
        e.to_string(),
        "exec-allowlist: `bin/true`: not an absolute path"
    );
    let f = parse_file("a.yaml", "arm-horizon: 5 s\n").expect("syntax ok");
    assert!(resolve(f, Overrides::default()).is_err());
}

#[test]
fn the_arming_lead_defaults_to_20ms_within_the_horizon_and_never_exceeds_it() {
    let lead = |yaml: &str| {
        let f = parse_file("a.yaml", yaml).expect("syntax ok");
        resolve(f, Overrides::default()).map(|c| (c.arm_horizon, c.arm_lead))
    };
    let ms = Duration::from_millis;
    assert_eq!(lead("{}\n").expect("defaults"), (ms(150), ms(20)));
    assert_eq!(lead("arm-horizon: 2ms\n").expect("short"), (ms(2), ms(1)));
    assert_eq!(
        lead("arm-horizon: 30ms\n").expect("half the horizon"),
        (ms(30), ms(15))
    );
    assert_eq!(
        lead("arm-horizon: 100ms\narm-lead: 40ms\n").expect("slow disk"),
        (ms(100), ms(40))
    );
    let e = lead("arm-horizon: 10ms\narm-lead: 20ms\n").expect_err("lead past the horizon");
    assert!(e.to_string().contains("arm-lead"), "{e}");
}

#[test]
fn the_controller_link_is_plaintext_only_with_insecure() {
    let f = parse_file(
        "a.yaml",
        "controller: http://ctl.plant:7700\ninsecure: true\ninsecure-any: true\nlabels: {line: 3, site: plant-a, edge: true}\nmax-packs: 10\n",
    )
    .expect("valid");
    let c = resolve(f, Overrides::default()).expect("resolves");
    assert_eq!(c.controllers, ["http://ctl.plant:7700"]);
    assert!(c.insecure);
    assert_eq!(c.max_packs, 10);
    let labels: Vec<(&str, &str)> = c
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        labels,
        [("edge", "true"), ("line", "3"), ("site", "plant-a")]
    );

    // Without a controller: no link, default limits.
    let c = resolve(ConfigFile::default(), Overrides::default()).expect("resolves");
    assert!(c.controllers.is_empty());
    assert_eq!(c.max_packs, DEFAULT_MAX_PACKS);

    let plain = |url: &str, insecure: bool| {
        resolve(
            ConfigFile::default(),
            Overrides {
                controllers: vec![url.into()],
                insecure,
                ..Overrides::default()
            },
        )
        .map(|c| c.controllers.first().cloned())
        .map_err(|e| e.to_string())
    };
    let far = resolve(
        ConfigFile::default(),
        Overrides {
            controllers: vec!["http://10.0.0.5:7700".into()],
            insecure: true,
            ..Overrides::default()
        },
    )
    .expect_err("plaintext off loopback needs --insecure-any");
    assert!(far.to_string().contains("--insecure-any"), "{far}");
    let far = resolve(
        ConfigFile::default(),
        Overrides {
            controllers: vec!["http://10.0.0.5:7700".into()],
            insecure: true,
            insecure_any: true,
            ..Overrides::default()
        },
    )
    .expect("allowed with --insecure-any");
    assert_eq!(far.controllers, ["http://10.0.0.5:7700"]);
    let e = plain("http://127.0.0.1:7700", false).expect_err("needs --insecure");
    assert_eq!(
        e,
        "controller `http://127.0.0.1:7700`: plaintext link needs --insecure (or use https:// with --cert, --key and --ca)"
    );
    assert_eq!(
        plain("http://127.0.0.1:7700/", true).expect("ok"),
        Some("http://127.0.0.1:7700".into())
    );
    let e = plain("https://ctl:7700", true).expect_err("no certificate");
    assert!(e.contains("mTLS needs cert, key and ca"), "{e}");
    for bad in [
        "ctl:7700",
        "ftp://ctl",
        "http://ctl/x",
        "http://",
        "not a url",
    ] {
        assert!(plain(bad, true).is_err(), "{bad}");
    }
    // The flag alone turns insecure on; a file setting it is enough too.
    let f = parse_file("a.yaml", "controller: http://c:1\n").expect("valid");
    let e = resolve(f, Overrides::default()).expect_err("needs insecure");
    assert!(e.to_string().contains("needs --insecure"), "{e}");
}

/// Several controllers: a list in the file (or the single string, as
/// before), the repeated flag replacing it; each URL checked, none
/// twice, never a mix of schemes, never an empty list.
#[test]
fn several_controllers_from_a_list_or_the_repeated_flag() {
    let file = |text: &str| parse_file("a.yaml", text).expect("valid");
    let urls = |f: ConfigFile, o: Overrides| {
        resolve(f, o)
            .map(|c| c.controllers)
            .map_err(|e| e.to_string())
    };
    let insecure = || Overrides {
        insecure: true,
        ..Overrides::default()
    };
    assert_eq!(
        urls(
            file(
                "controller: [http://127.0.0.1:1/, http://localhost:2]
"
            ),
            insecure()
        )
        .expect("list"),
        ["http://127.0.0.1:1", "http://localhost:2"]
    );
    assert_eq!(
        urls(
            file(
                "controller: http://127.0.0.1:1
"
            ),
            insecure()
        )
        .expect("one"),
        ["http://127.0.0.1:1"]
    );
    // The flags replace the file's list, in their order.
    assert_eq!(
        urls(
            file(
                "controller: [http://127.0.0.1:1]
"
            ),
            Overrides {
                controllers: vec!["http://127.0.0.1:3".into(), "http://127.0.0.1:2".into()],
                ..insecure()
            }
        )
        .expect("flags"),
        ["http://127.0.0.1:3", "http://127.0.0.1:2"]
    );
    let e = urls(
        file(
            "controller: [http://127.0.0.1:1, http://10.0.0.9:1]
",
        ),
        insecure(),
    )
    .expect_err("each is checked");
    assert!(
        e.contains("`http://10.0.0.9:1`") && e.contains("--insecure-any"),
        "{e}"
    );
    let e = urls(
        file(
            "controller: [http://127.0.0.1:1, http://127.0.0.1:1/]
",
        ),
        insecure(),
    )
    .expect_err("twice");
    assert!(e.contains("listed twice"), "{e}");
    let e = urls(
        file(
            "controller: [https://ctl:1, http://127.0.0.1:1]
",
        ),
        insecure(),
    )
    .expect_err("mixed");
    assert!(e.contains("never a plaintext fallback"), "{e}");
    let e = urls(
        file(
            "controller: []
",
        ),
        insecure(),
    )
    .expect_err("empty");
    assert!(e.contains("empty list"), "{e}");
    assert!(
        parse_file(
            "a.yaml",
            "controller: {url: x}
"
        )
        .is_err()
    );
}

#[test]
fn an_https_link_needs_all_three_certificate_files_and_http_none() {
    let tmp = tempfile::tempdir().expect("tmp");
    let [cert, key, ca] = ["a.pem", "a-key.pem", "ca.pem"].map(|n| {
        let p = tmp.path().join(n);
        std::fs::write(&p, "x").expect("write");
        p
    });
    let file = format!(
        "controller: https://ctl:7700\ncert: {}\nkey: {}\nca: {}\n",
        cert.display(),
        key.display(),
        ca.display()
    );
    let c = resolve(
        parse_file("a.yaml", &file).expect("valid"),
        Overrides::default(),
    )
    .expect("resolves");
    assert_eq!(c.controllers, ["https://ctl:7700"]);
    let tls = c.tls.expect("tls");
    assert_eq!((tls.cert, tls.key, tls.ca), (cert.clone(), key.clone(), ca));
    // A missing file is named.
    let with = |url: &str, key: PathBuf| {
        resolve(
            ConfigFile::default(),
            Overrides {
                controllers: vec![url.into()],
                insecure: true,
                cert: Some(cert.clone()),
                key: Some(key),
                ca: Some(cert.clone()),
                ..Overrides::default()
            },
        )
        .map_err(|e| {
            // The whole chain, as the binary's report prints it: the OS
            // error once, not once per link.
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text += &format!(": {c}");
                cause = c.source();
            }
            text
        })
    };
    let e = with("https://ctl:1", tmp.path().join("nope.pem")).expect_err("missing");
    assert!(e.contains("nope.pem: cannot read"), "{e}");
    assert_eq!(e.matches("No such file").count(), 1, "{e}");
    // Certificates with a plaintext URL: refused, never a silent downgrade.
    let e = with("http://127.0.0.1:1", key.clone()).expect_err("http");
    assert!(e.contains("for an https:// controller"), "{e}");
}

#[test]
fn labels_are_checked_and_flags_override_the_file() {
    let f = parse_file("a.yaml", "labels: {line: \"3\", site: a}\n").expect("valid");
    let c = resolve(
        f,
        Overrides {
            labels: vec![("line".into(), "4".into())],
            ..Overrides::default()
        },
    )
    .expect("resolves");
    assert_eq!(c.labels.get("line").map(String::as_str), Some("4"));
    assert_eq!(c.labels.get("site").map(String::as_str), Some("a"));
    assert_eq!(parse_label_arg("a=b=c"), Ok(("a".into(), "b=c".into())));
    assert!(parse_label_arg("novalue").is_err());
    assert!(
        parse_label_arg("=v")
            .expect_err("empty key")
            .contains("its key is empty")
    );
    assert!(
        parse_label_arg("k=")
            .expect_err("empty value")
            .contains("its value is empty")
    );
    assert!(
        parse_label_arg("k=a\u{7}b")
            .expect_err("bell")
            .contains("control character")
    );
    for text in [
        "labels: {\"\": x}\n",
        "labels: {k: \"a\\nb\"}\n",
        "labels: {k: [1]}\n",
        "labels: {k: }\n",
        "max-packs: 0\n",
    ] {
        let f = parse_file("a.yaml", text).expect(text);
        assert!(resolve(f, Overrides::default()).is_err(), "{text}");
    }
}

#[test]
fn exec_allowlist_entries_are_paths_or_programs_with_env_keys() {
    let f = parse_file(
        "agent.yaml",
        "exec-allowlist:\n  - /usr/sbin/logrotate\n  - {program: /opt/plant/flush.sh, env: [MODE, LANG]}\n  - program: /usr/bin/true\n",
    )
    .expect("valid");
    assert_eq!(
        f.exec_allowlist,
        [
            ExecAllowEntry {
                program: "/usr/sbin/logrotate".into(),
                env: vec![]
            },
            ExecAllowEntry {
                program: "/opt/plant/flush.sh".into(),
                env: vec!["MODE".into(), "LANG".into()]
            },
            ExecAllowEntry {
                program: "/usr/bin/true".into(),
                env: vec![]
            },
        ]
    );
    let c = resolve(f, Overrides::default()).expect("resolves");
    let p = &c.exec_allowlist;
    assert!(p.is_allowed("/usr/sbin/logrotate"));
    assert_eq!(
        p.allowed_env("/opt/plant/flush.sh")
            .map(|k| k.iter().map(String::as_str).collect::<Vec<_>>()),
        Some(vec!["LANG", "MODE"])
    );
    assert_eq!(
        p.allowed_env("/usr/sbin/logrotate").map(|k| k.len()),
        Some(0)
    );
    assert_eq!(p.allowed_env("/bin/sh"), None);
}

#[test]
fn bad_exec_allowlist_entries_are_refused() {
    let e = parse_file(
        "agent.yaml",
        "exec-allowlist:\n  - {program: /bin/sh, envs: [A]}\n",
    )
    .expect_err("unknown key");
    assert!(
        e.to_string()
            .starts_with("agent.yaml:2:24: unknown field `envs`, expected `program` or `env`"),
        "{e}"
    );
    let e = parse_file("agent.yaml", "exec-allowlist: [{env: [A]}]\n").expect_err("no program");
    assert!(e.to_string().contains("missing field `program`"), "{e}");
    let e = parse_file("agent.yaml", "exec-allowlist: [[/bin/sh]]\n").expect_err("a list");
    assert!(
        e.to_string()
            .contains("expected a program path, or {program: PATH, env: [KEY, ...]}"),
        "{e}"
    );
    for (text, msg) in [
        (
            "exec-allowlist: [{program: /bin/sh, env: [LD_PRELOAD]}]\n",
            "exec-allowlist: `/bin/sh`: environment key \"LD_PRELOAD\" is a dynamic-loader variable",
        ),
        (
            "exec-allowlist: [{program: /bin/sh, env: [BATON_ATTEMPT]}]\n",
            "exec-allowlist: `/bin/sh`: environment key \"BATON_ATTEMPT\" is reserved for the agent",
        ),
        (
            "exec-allowlist: [/bin/sh, {program: /bin/sh, env: [A]}]\n",
            "exec-allowlist: `/bin/sh` is listed twice",
        ),
    ] {
        let f = parse_file("a.yaml", text).expect("syntax ok");
        let e = resolve(f, Overrides::default()).expect_err(text);
        assert!(e.to_string().starts_with(msg), "{e}");
    }
}

/// Issue 37: `clock.ptp.discipline-system-clock` was documented and always
/// refused at start; it is no option now, and a file that still sets it
/// is refused when read, naming the key, not at the PTP source's start.
#[test]
fn the_ptp_section_has_no_option_to_steer_the_system_clock() {
    let ok = parse_file(
        "agent.yaml",
        "clock:\n  ptp: {interface: eth0, domain: 3}\n",
    )
    .expect("valid");
    let c = resolve(ok, Overrides::default()).expect("resolves");
    let ptp = c.clock.ptp.expect("ptp");
    assert_eq!((ptp.interface.as_str(), ptp.domain), ("eth0", 3));
    let e = parse_file(
        "agent.yaml",
        "clock:\n  ptp: {interface: eth0, discipline-system-clock: true}\n",
    )
    .expect_err("no such option");
    assert!(e.to_string().contains("discipline-system-clock"), "{e}");
}

#[test]
fn update_settings_default_and_are_checked() {
    let update = |text: &str| {
        let f = parse_file("a.yaml", text).expect("syntax ok");
        resolve(f, Overrides::default()).map(|c| c.update)
    };
    assert_eq!(update("{}\n").expect("default"), UpdateConfig::default());
    let u = update("update: {download-rate: 65536, quiet-margin: 500ms, confirm-within: 1m}\n")
        .expect("valid");
    assert_eq!(
        u,
        UpdateConfig {
            download_rate: 65536,
            quiet_margin: Duration::from_millis(500),
            confirm_within: Duration::from_secs(60),
        }
    );
    for (bad, says) in [
        ("update: {download-rate: 10}\n", "update.download-rate"),
        ("update: {quiet-margin: 2h}\n", "update.quiet-margin"),
        ("update: {confirm-within: 1s}\n", "update.confirm-within"),
        ("update: {confirm-within: soon}\n", "update.confirm-within"),
    ] {
        let e = update(bad).expect_err(bad);
        assert!(e.to_string().contains(says), "{bad}: {e}");
    }
    assert!(
        parse_file("a.yaml", "update: {rate: 1}\n").is_err(),
        "unknown key"
    );
}
