//! `baton-agent check-config`: every check `run` makes before it fires
//! anything, without running: the GPIO backend opens, every configured
//! pack parses, passes the exec allowlist (programs and environment keys),
//! gets every line it touches from the backend under the line allowlist,
//! and shares no driven line with another pack; with a trust directory,
//! its root and trust lists read and check, and every pack passes them.
//! Lines are requested and released again (requesting never moves a
//! line).

use std::sync::Arc;

use baton_proto::RefTime;
use baton_proto::pack::read_pack_file;
use baton_sched::PackKey;

use crate::config::AgentConfig;
use crate::exec::ExecPool;
use baton_control::admission::{self, Admission};

use crate::runtime::admit::{exec_check, open_and_resolve};
use crate::runtime::ports::{DirectDevice, ManualClock};

/// Every problem found, each naming its file and pack; empty when `run`
/// would start.
pub fn check(cfg: &AgentConfig) -> Vec<String> {
    let mut bad = Vec::new();
    if let Err(e) = check_journal(&cfg.data_dir) {
        bad.push(e);
    }
    let gpio = match baton_gpio::open_backend(&cfg.gpio, cfg.allowed_lines.clone()) {
        Ok(g) => g,
        Err(e) => {
            bad.push(format!("gpio `{}`: {e}", cfg.gpio));
            return bad;
        }
    };
    let mut device = DirectDevice::new(gpio, Arc::new(ManualClock::new(RefTime::from_nanos(0))));
    let (tx, _rx) = std::sync::mpsc::channel();
    let exec = ExecPool::new(1, cfg.exec_allowlist.clone(), tx, Arc::new(|| {}));
    let mut adm = Admission::default();
    let now_ns = baton_clock::clock_ns(nix::time::ClockId::CLOCK_REALTIME);
    let trust = match &cfg.trust_dir {
        Some(dir) => match super::trust::read(dir, &cfg.data_dir, now_ns) {
            Ok(t) => Some(t),
            Err(e) => {
                bad.push(e);
                None
            }
        },
        None => None,
    };
    for path in &cfg.packs {
        let name = path.display().to_string();
        let (yaml, pack) = match read_pack_file(path) {
            Ok(v) => v,
            Err(e) => {
                bad.push(e);
                continue;
            }
        };
        let key = PackKey::of(&pack);
        let now = RefTime::from_nanos(baton_clock::clock_ns(nix::time::ClockId::CLOCK_REALTIME));
        if let Err(e) = pack.check_live(now) {
            bad.push(e.render(&name).trim_end().to_string());
            continue;
        }
        let r = adm
            .check_version(&key, pack.version, admission::digest(&yaml))
            .and_then(|_| match &trust {
                Some(t) => t
                    .check_pack(&pack.tenant, &yaml, now_ns)
                    .map(|_| ())
                    .map_err(Into::into),
                None => Ok(()),
            })
            .and_then(|()| {
                Admission::check_exec(&pack, &|p, args, env| exec_check(&exec, p, args, env))
            })
            .and_then(|()| open_and_resolve(&mut adm, &pack, &mut device))
            .and_then(|res| adm.check_owners(&key, &res).map(|()| res));
        match r {
            Ok(res) => adm.commit(key, pack.version, admission::digest(&yaml), res),
            Err(e) => bad.push(format!("{name}: pack {key} refused: {e}")),
        }
    }
    exec.shutdown();
    bad
}

/// The journal `run` would open: an existing log must replay (read only,
/// without the lock: a running agent is not disturbed); a log that went
/// missing beside the lock of an earlier journal is refused, as `run`
/// refuses it.
fn check_journal(dir: &std::path::Path) -> Result<(), String> {
    use baton_journal::{LOCK_FILE, LOG_FILE, check_log_bytes};
    let log = dir.join(LOG_FILE);
    match std::fs::read(&log) {
        Ok(bytes) => check_log_bytes(&bytes)
            .map(|_| ())
            .map_err(|e| format!("journal {}: {e}", log.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let lock = dir.join(LOCK_FILE);
            let used = std::fs::metadata(&lock).is_ok_and(|m| m.len() > 0);
            if used {
                Err(format!(
                    "journal {}: missing beside {} (a journal existed here); `run --reset-journal` starts fresh deliberately",
                    log.display(),
                    lock.display()
                ))
            } else {
                Ok(())
            }
        }
        Err(e) => Err(format!("journal {}: {e}", log.display())),
    }
}
