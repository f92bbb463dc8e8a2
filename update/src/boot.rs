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

/// What the launcher keeps between starts.
#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// The last version given up, for the agent to report.
    #[serde(default)]
    pub rolled_back: Option<RolledBack>,
}

/// A version on trial.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trial {
    /// Its version.
    pub version: String,
    /// Whether the launcher started it (a second start is a rollback).
    pub started: bool,
}

/// A version given up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
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
                next.rolled_back = Some(RolledBack {
                    from: trial.version.clone(),
                    to: state.settled.clone(),
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

/// The state once `version` is on trial (installed and verified): the
/// next start runs it once.
pub fn stage(state: Option<&BootState>, packaged: &str, version: &str) -> BootState {
    let mut next = match state {
        Some(s) if s.packaged == packaged => s.clone(),
        _ => BootState {
            packaged: packaged.to_string(),
            ..BootState::default()
        },
    };
    next.trial = Some(Trial {
        version: version.to_string(),
        started: false,
    });
    next
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
