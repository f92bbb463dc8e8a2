//! What a test does when the environment it needs is missing (a Debian
//! package, root, network namespaces, a browser).
//!
//! A test that returns early passes in cargo's count, so a suite whose
//! environment is gone could pass without testing anything. Every such
//! test calls [`missing`] instead of printing and returning on its own:
//!
//! - where the environment is required it fails, with the reason:
//!   `BATON_REQUIRE_ALL=1` requires every environment (CI sets it, see
//!   `.ci/run`), and a test may name a variable of its own
//!   (`BATON_REQUIRE_POSTGRES`, `BATON_REQUIRE_BROWSER`,
//!   `BATON_REQUIRE_INTEROP`) that requires just its environment;
//! - otherwise it says `SKIP test: reason` on stderr and appends the same
//!   line to the file `BATON_SKIP_LOG` names, which `scripts/test.sh`
//!   counts and lists in its closing line: a skip is never counted as a
//!   pass.
//!
//! No dependencies: every test crate of the workspace can use it.

use std::io::Write;

/// Requires every environment-gated test to run (fail instead of skip).
pub const REQUIRE_ALL: &str = "BATON_REQUIRE_ALL";
/// The file each skip is appended to, one line each.
pub const SKIP_LOG: &str = "BATON_SKIP_LOG";

/// True when `var` (or [`REQUIRE_ALL`]) is `1`: the environment must be
/// there.
pub fn required(var: Option<&str>) -> bool {
    let set = |v: &str| std::env::var(v).as_deref() == Ok("1");
    set(REQUIRE_ALL) || var.is_some_and(set)
}

/// `test` cannot run here because of `why`. Panics (the test fails) when
/// the environment is required (see [`required`]); otherwise records the
/// skip and returns, and the caller returns too.
///
/// # Panics
/// When the environment is required: that is its purpose.
#[track_caller]
pub fn missing(test: &str, require_var: Option<&str>, why: &str) {
    if required(require_var) {
        let var = match require_var {
            Some(v) if std::env::var(v).as_deref() == Ok("1") => v,
            _ => REQUIRE_ALL,
        };
        panic!("{test} cannot run: {why} ({var}=1: this environment is required here)");
    }
    let line = format!("SKIP {test}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os(SKIP_LOG) {
        // One write of one short line with O_APPEND: lines of tests
        // running at once do not interleave.
        let logged = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = logged {
            // The skip must not go uncounted: better a failed test.
            panic!(
                "{test}: skipped ({why}), and could not record it in {}: {e}",
                std::path::Path::new(&path).display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The environment is process-wide: one test does every case in turn.
    #[test]
    fn a_skip_is_logged_unless_required_then_it_fails() {
        let dir = std::env::temp_dir().join(format!("baton-testenv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let log = dir.join("skipped");
        // SAFETY: this crate's only test sets the environment; no other
        // thread reads it meanwhile.
        unsafe {
            std::env::remove_var(REQUIRE_ALL);
            std::env::remove_var("BATON_REQUIRE_X");
            std::env::set_var(SKIP_LOG, &log);
        }
        missing("t1", Some("BATON_REQUIRE_X"), "no x here");
        missing("t2", None, "no y here");
        let text = std::fs::read_to_string(&log).expect("log");
        assert_eq!(text, "SKIP t1: no x here\nSKIP t2: no y here\n");

        // SAFETY: as above.
        unsafe { std::env::set_var("BATON_REQUIRE_X", "1") };
        let e = std::panic::catch_unwind(|| missing("t3", Some("BATON_REQUIRE_X"), "no x"))
            .expect_err("required");
        let msg = e.downcast_ref::<String>().expect("message");
        assert!(
            msg.contains("t3 cannot run: no x (BATON_REQUIRE_X=1"),
            "{msg}"
        );
        // Only its own variable: another test's environment may still skip.
        missing("t4", Some("BATON_REQUIRE_Y"), "no y");

        // SAFETY: as above.
        unsafe {
            std::env::remove_var("BATON_REQUIRE_X");
            std::env::set_var(REQUIRE_ALL, "1");
        }
        let e = std::panic::catch_unwind(|| missing("t5", None, "no z")).expect_err("all");
        let msg = e.downcast_ref::<String>().expect("message");
        assert!(msg.contains("(BATON_REQUIRE_ALL=1"), "{msg}");
        let text = std::fs::read_to_string(&log).expect("log");
        assert_eq!(text.lines().count(), 3, "{text}");
        // SAFETY: as above.
        unsafe {
            std::env::remove_var(REQUIRE_ALL);
            std::env::remove_var(SKIP_LOG);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
