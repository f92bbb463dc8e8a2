//! Which agent binary a start runs, and when a new one is given up: the
//! launcher's decision, sans-IO. The state is one small document replaced
//! whole ([`crate::versions::Versions::write_state`]); that replacement is
//! the atomic switch between versions.
//!
//! A new version is first a *trial*: the launcher starts it once. It
//! confirms itself when it is healthy ([`confirm`]; the agent says when).
//! A trial that comes back to the launcher unconfirmed — it exited, it
//! crashed, the watchdog or a stop ended it, the box lost power — is rolled
//! back: the version that ran before is started again and the rollback is
//! kept for the agent to report. So a build that cannot start runs at most
//! once, and the safe state's guarantee stays the running agent's: every
//! start, whichever binary, drives the journal's packs as any restart does.
//!
//! The packaged binary (`/usr/bin/baton-agent`, the launcher itself) is the
//! floor: with no state, when the versions it names are gone, and when the
//! package itself was upgraded since the state was written (a package
//! installed by hand wins over an earlier self-update).

/// What the launcher keeps between starts. Unknown fields are ignored,
/// not refused: the launcher is the packaged binary, usually older than
/// the versions that write this, and a state it could not read would pin
/// the box to it.
#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct BootState {
    /// The packaged binary's version when this was written.
    pub packaged: String,
    /// The version confirmed healthy, run at each start (`None`: the
    /// packaged binary).
    #[serde(default)]
    pub settled: Option<String>,
    /// A version on trial, and whether the launcher started it already.
    #[serde(default)]
    pub trial: Option<Trial>,
    /// The last version given up, for the agent to report (cleared when
    /// a new version is settled).
    #[serde(default)]
    pub rolled_back: Option<RolledBack>,
    /// The versions given up on this box, newest last (at most
    /// [`GIVEN_UP_KEPT`]): never run again here; a fixed build comes under
    /// a new version.
    #[serde(default)]
    pub given_up: Vec<String>,
}

/// How many versions given up a box remembers.
pub const GIVEN_UP_KEPT: usize = 16;

impl BootState {
    /// Whether `version` was given up on this box.
    pub fn gave_up(&self, version: &str) -> bool {
        self.given_up.iter().any(|v| v == version)
    }

    fn give_up(&mut self, r: RolledBack) {
        if !self.gave_up(&r.from) {
            self.given_up.push(r.from.clone());
        }
        let over = self.given_up.len().saturating_sub(GIVEN_UP_KEPT);
        self.given_up.drain(..over);
        self.rolled_back = Some(r);
    }
}

/// A version on trial.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Trial {
    /// Its version.
    pub version: String,
    /// Whether the launcher started it (a second start is a rollback).
    pub started: bool,
}

/// A version given up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RolledBack {
    /// The version given up.
    pub from: String,
    /// The version run instead (`None`: the packaged binary).
    pub to: Option<String>,
    /// Why.
    pub why: String,
}

/// What a start runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launch {
    /// The packaged binary.
    Packaged,
    /// An installed version.
    Version(String),
}

/// The launcher's decision at a start: what to run, and the state to
/// write first (`None`: unchanged). `packaged` is the launcher's own
/// version; `installed` says whether a version's binary is in place.
pub fn at_launch(
    state: Option<&BootState>,
    packaged: &str,
    installed: impl Fn(&str) -> bool,
) -> (Option<BootState>, Launch) {
    let Some(state) = state else {
        return (None, Launch::Packaged);
    };
    if state.packaged != packaged {
        // The package was upgraded (or downgraded) by hand since: it wins,
        // and the versions installed before are no longer run.
        let fresh = BootState {
            packaged: packaged.to_string(),
            ..BootState::default()
        };
        return (Some(fresh), Launch::Packaged);
    }
    let mut next = state.clone();
    if let Some(trial) = &state.trial {
        let why = if trial.started {
            Some("it ended before it confirmed itself healthy")
        } else if !installed(&trial.version) {
            Some("its binary is not installed")
        } else {
            None
        };
        match why {
            None => {
                next.trial = Some(Trial {
                    version: trial.version.clone(),
                    started: true,
                });
                return (Some(next), Launch::Version(trial.version.clone()));
            }
            Some(why) => {
                next.trial = None;
                let to = state.settled.clone().filter(|v| installed(v));
                next.give_up(RolledBack {
                    from: trial.version.clone(),
                    to,
                    why: why.to_string(),
                });
            }
        }
    }
    let launch = match &next.settled {
        Some(v) if installed(v) => Launch::Version(v.clone()),
        Some(_) => {
            next.settled = None;
            Launch::Packaged
        }
        None => Launch::Packaged,
    };
    let changed = (next != *state).then_some(next);
    (changed, launch)
}

/// After the launcher could not run `version` (`why`): the state to
/// write (`None`: unchanged) and what to run instead. `lasting`: the
/// failure will come again (its binary is not its signed release, the
/// kernel refuses it) rather than pass (a full process table).
///
/// A trial is rolled back to the version settled before it, and given up
/// on this box only when the failure is lasting. A settled version whose
/// failure is lasting is dropped (said as a rollback to the packaged
/// binary, not given up: the same version signed again may mend it); one
/// whose failure may pass is kept, and this start runs the packaged
/// binary.
pub fn exec_failed(
    state: Option<&BootState>,
    version: &str,
    why: &str,
    lasting: bool,
) -> (Option<BootState>, Launch) {
    let Some(s) = state else {
        return (None, Launch::Packaged);
    };
    let mut next = s.clone();
    if s.trial.as_ref().is_some_and(|t| t.version == version) {
        next.trial = None;
        let r = RolledBack {
            from: version.to_string(),
            to: s.settled.clone(),
            why: why.to_string(),
        };
        if lasting {
            next.give_up(r);
        } else {
            next.rolled_back = Some(r);
        }
        let launch = s.settled.clone().map_or(Launch::Packaged, Launch::Version);
        return (Some(next), launch);
    }
    if lasting && s.settled.as_deref() == Some(version) {
        next.settled = None;
        next.rolled_back = Some(RolledBack {
            from: version.to_string(),
            to: None,
            why: why.to_string(),
        });
        return (Some(next), Launch::Packaged);
    }
    (None, Launch::Packaged)
}

/// The state once `version` is on trial (installed and verified): the
/// next start runs it once. `packaged` names the packaged binary only
/// when there is no state yet (the running binary is then the packaged
/// one); a state keeps the one it names.
pub fn stage(state: Option<&BootState>, packaged: &str, version: &str) -> BootState {
    let mut next = match state {
        Some(s) => s.clone(),
        None => BootState {
            packaged: packaged.to_string(),
            ..BootState::default()
        },
    };
    next.trial = Some(Trial {
        version: version.to_string(),
        started: false,
    });
    // A new version's trial: an older rollback is no longer news.
    next.rolled_back = None;
    next
}

/// The state once an installed `version` no longer runs (its release
/// withdrawn before the box restarted into it): its trial undone if the
/// launcher has not started it (`None`: nothing to write — not on trial,
/// or started already, when it is the running agent's to decide).
pub fn unstage(state: Option<&BootState>, version: &str) -> Option<BootState> {
    let state = state?;
    let trial = state.trial.as_ref()?;
    if trial.version != version || trial.started {
        return None;
    }
    Some(BootState {
        trial: None,
        ..state.clone()
    })
}

/// The state once the running agent, of `version`, is healthy: settled
/// if it was the trial (`None`: nothing to write).
pub fn confirm(state: Option<&BootState>, version: &str) -> Option<BootState> {
    let state = state?;
    let trial = state.trial.as_ref()?;
    if trial.version != version || !trial.started {
        return None;
    }
    Some(BootState {
        settled: Some(version.to_string()),
        trial: None,
        rolled_back: None,
        ..state.clone()
    })
}

/// The versions a box keeps: the one settled, the one on trial (and
/// nothing else, once a trial is decided: the one before is what a
/// rollback would run, and it is the settled one until the confirmation).
pub fn kept(state: Option<&BootState>) -> Vec<String> {
    let Some(s) = state else {
        return Vec::new();
    };
    s.settled
        .iter()
        .chain(s.trial.as_ref().map(|t| &t.version))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_withdrawn_trial_is_undone_only_before_it_ran() {
        let staged = stage(None, "0.1.0", "0.2.0");
        let undone = unstage(Some(&staged), "0.2.0").expect("undone");
        assert_eq!(undone.trial, None);
        assert_eq!(undone.packaged, "0.1.0");
        assert_eq!(unstage(Some(&staged), "0.3.0"), None, "another version");
        let mut started = staged.clone();
        if let Some(t) = started.trial.as_mut() {
            t.started = true;
        }
        assert_eq!(
            unstage(Some(&started), "0.2.0"),
            None,
            "it runs: its own to decide"
        );
        assert_eq!(unstage(None, "0.2.0"), None);
    }

    const PKG: &str = "0.1.0";

    fn all(_: &str) -> bool {
        true
    }

    /// Runs the launcher's decision like a start does: write, then run.
    fn start(state: &mut Option<BootState>, installed: impl Fn(&str) -> bool) -> Launch {
        let (next, launch) = at_launch(state.as_ref(), PKG, installed);
        if let Some(n) = next {
            *state = Some(n);
        }
        launch
    }

    #[test]
    fn a_trial_runs_once_and_is_settled_when_it_confirms() {
        let mut s = None;
        assert_eq!(start(&mut s, all), Launch::Packaged);
        s = Some(stage(s.as_ref(), PKG, "0.2.0"));
        assert_eq!(start(&mut s, all), Launch::Version("0.2.0".into()));
        // Only the trial that was started may confirm, and only its version.
        assert_eq!(confirm(s.as_ref(), "0.1.0"), None);
        s = confirm(s.as_ref(), "0.2.0");
        assert_eq!(
            s.as_ref().and_then(|s| s.settled.clone()).as_deref(),
            Some("0.2.0")
        );
        // Settled: every start runs it, nothing written.
        assert_eq!(
            at_launch(s.as_ref(), PKG, all),
            (None, Launch::Version("0.2.0".into()))
        );
        assert_eq!(kept(s.as_ref()), vec!["0.2.0".to_string()]);
    }

    #[test]
    fn a_trial_back_at_the_launcher_unconfirmed_is_rolled_back_to_what_ran_before() {
        // Settled on 0.2.0, 0.3.0 on trial: it starts, then ends (crash,
        // watchdog, power) before it confirms.
        let mut s = Some(BootState {
            packaged: PKG.into(),
            settled: Some("0.2.0".into()),
            ..BootState::default()
        });
        s = Some(stage(s.as_ref(), PKG, "0.3.0"));
        assert_eq!(
            kept(s.as_ref()),
            vec!["0.2.0".to_string(), "0.3.0".to_string()]
        );
        assert_eq!(start(&mut s, all), Launch::Version("0.3.0".into()));
        assert_eq!(start(&mut s, all), Launch::Version("0.2.0".into()));
        let st = s.clone().expect("state");
        assert_eq!(st.trial, None);
        assert_eq!(
            st.rolled_back,
            Some(RolledBack {
                from: "0.3.0".into(),
                to: Some("0.2.0".into()),
                why: "it ended before it confirmed itself healthy".into()
            })
        );
        // A confirmation arriving late (the rolled-back binary is gone)
        // changes nothing.
        assert_eq!(confirm(s.as_ref(), "0.3.0"), None);
        // And the next start stays where it is.
        assert_eq!(start(&mut s, all), Launch::Version("0.2.0".into()));
    }

    /// The second update of a box, made by a settled version (not the
    /// packaged one): the packaged version and the settled one are kept,
    /// so a failure rolls back to the settled one.
    #[test]
    fn a_second_update_keeps_what_runs_now_as_the_version_to_roll_back_to() {
        let mut s = Some(BootState {
            packaged: PKG.into(),
            settled: Some("0.2.0".into()),
            ..BootState::default()
        });
        // Staged by 0.2.0 (the running build).
        s = Some(stage(s.as_ref(), "0.2.0", "0.3.0"));
        let st = s.clone().expect("state");
        assert_eq!(
            (st.packaged.as_str(), st.settled.as_deref()),
            (PKG, Some("0.2.0"))
        );
        assert_eq!(
            kept(s.as_ref()),
            vec!["0.2.0".to_string(), "0.3.0".to_string()]
        );
        assert_eq!(start(&mut s, all), Launch::Version("0.3.0".into()));
        assert_eq!(start(&mut s, all), Launch::Version("0.2.0".into()));
        // Given up for good on this box; a settled version clears the
        // report, not the memory.
        let st = s.clone().expect("state");
        assert!(st.gave_up("0.3.0"));
        s = Some(stage(s.as_ref(), "0.2.0", "0.4.0"));
        start(&mut s, all);
        s = confirm(s.as_ref(), "0.4.0");
        let st = s.expect("state");
        assert_eq!(
            (st.rolled_back.is_none(), st.gave_up("0.3.0")),
            (true, true)
        );
    }

    /// A trial that cannot be executed falls back to the settled version;
    /// a settled version that cannot be executed is kept for the next
    /// start, and this one runs the packaged binary.
    #[test]
    fn an_exec_failure_rolls_a_trial_back_to_the_settled_version_and_keeps_a_settled_one() {
        let settled = BootState {
            packaged: PKG.into(),
            settled: Some("0.2.0".into()),
            ..BootState::default()
        };
        let mut s = Some(stage(Some(&settled), PKG, "0.3.0"));
        assert_eq!(start(&mut s, all), Launch::Version("0.3.0".into()));
        let (next, launch) = exec_failed(s.as_ref(), "0.3.0", "Exec format error", true);
        assert_eq!(launch, Launch::Version("0.2.0".into()));
        let next = next.expect("written");
        assert_eq!(next.settled.as_deref(), Some("0.2.0"));
        assert!(next.gave_up("0.3.0"));
        let r = next.rolled_back.clone().expect("said");
        assert_eq!(r.to.as_deref(), Some("0.2.0"));
        assert!(r.why.contains("Exec format error"), "{}", r.why);
        assert_eq!(
            exec_failed(
                Some(&settled),
                "0.2.0",
                "Resource temporarily unavailable",
                false
            ),
            (None, Launch::Packaged)
        );
        // A settled binary that is not its release any more: dropped,
        // said, not given up (signed again, it may come back).
        let (next, launch) = exec_failed(Some(&settled), "0.2.0", "digest", true);
        let next = next.expect("written");
        assert_eq!(
            (launch, next.settled.clone(), next.gave_up("0.2.0")),
            (Launch::Packaged, None, false)
        );
        assert_eq!(next.rolled_back.map(|r| r.from), Some("0.2.0".to_string()));
        // A trial's passing failure: rolled back, not given up.
        let mut s = Some(stage(Some(&settled), PKG, "0.3.0"));
        start(&mut s, all);
        let (next, _) = exec_failed(s.as_ref(), "0.3.0", "Cannot allocate memory", false);
        let next = next.expect("written");
        assert!(next.trial.is_none() && !next.gave_up("0.3.0") && next.rolled_back.is_some());
    }

    /// A state written by a newer version (a field this launcher does not
    /// know) is read, not refused.
    #[test]
    fn a_state_from_a_newer_version_is_read() {
        let text = r#"{"packaged": "0.1.0", "settled": "0.3.0", "trial": null, "future": [1, 2]}"#;
        let s: BootState = serde_json::from_str(text).expect("read");
        assert_eq!(
            at_launch(Some(&s), PKG, all),
            (None, Launch::Version("0.3.0".into()))
        );
    }

    #[test]
    fn the_packaged_binary_is_the_floor() {
        // A trial whose binary is missing: rolled back before it runs.
        let mut s = Some(stage(None, PKG, "0.2.0"));
        assert_eq!(start(&mut s, |_| false), Launch::Packaged);
        assert_eq!(
            s.as_ref()
                .and_then(|s| s.rolled_back.as_ref())
                .map(|r| r.why.as_str()),
            Some("its binary is not installed")
        );
        // A settled version deleted by hand: the packaged binary.
        let mut s = Some(BootState {
            packaged: PKG.into(),
            settled: Some("0.2.0".into()),
            ..BootState::default()
        });
        assert_eq!(start(&mut s, |_| false), Launch::Packaged);
        assert_eq!(s.as_ref().and_then(|s| s.settled.clone()), None);
        // The package upgraded since: it wins, the state starts afresh.
        let s = Some(BootState {
            packaged: "0.0.9".into(),
            settled: Some("0.2.0".into()),
            trial: Some(Trial {
                version: "0.3.0".into(),
                started: false,
            }),
            rolled_back: None,
            given_up: vec!["0.1.5".into()],
        });
        let (next, launch) = at_launch(s.as_ref(), PKG, all);
        assert_eq!(launch, Launch::Packaged);
        assert_eq!(
            next,
            Some(BootState {
                packaged: PKG.into(),
                ..BootState::default()
            })
        );
    }
}
