//! The driver of agent updates: what each step observes for the pure
//! rollout machine, and its steps stored (compare-and-set on the update's
//! rev, so two replicas never both take one) with the offers they imply.
//!
//! What the machine's words mean for an update:
//! - a member **holds** the version when it runs it (its hello says the
//!   version), is connected, and its clock is locked within the plan's
//!   `max_uncertainty`: "back on its link, its clock locked" is what a
//!   stage waits for, and `stage_deadline` (`after: 2m, then: abort`) is
//!   the "within N s" gate;
//! - a member **refused** when it rolled the version back (its build did
//!   not come up healthy): the stage fails and the update aborts. A box
//!   that refused an offer (on trial itself, another version waiting, a
//!   stalled download, no release key in its list) is only missing: it is
//!   offered again at its stream's next resync, its words are in the
//!   status, and the stage's deadline acts on it;
//! - the **cohort's figures** are its members' firings (of any pack)
//!   from when each ran the new version; the **baseline** the targets not
//!   yet admitted, same window: `abort_if` and `compare: baseline` judge
//!   lateness p99 and clock offset as for a pack;
//! - an **abort** withdraws the offers, and each session tells its box
//!   (`ReleaseWithdraw`): a box still downloading stops, a box that
//!   installed the release and had not restarted into it undoes its trial;
//!   a box that failed rolled itself back; a box updated stays on the new
//!   version (an update to the older release takes it back).

use std::collections::HashMap;

use baton_model::rollout::{self, AgentView, Observed, Step};
use baton_model::time::{self, SignedDuration};
use baton_model::{AgentRow, AgentUpdateRow, AuditRow, FeedbackScope, MAX_PAGE, UpdatePhase};
use baton_proto::pack::rollout::Rollout;
use baton_store::StoreOps;

use super::{UpdateAgent, plan_of};
use crate::app::{App, AppResult, now};
use crate::tally::Tally;

/// Step open agent updates every [`crate::rollouts::TICK`] until `stop`
/// (every replica runs it; the store's compare-and-set lets one step
/// through).
pub async fn run(app: std::sync::Arc<App>, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(crate::rollouts::TICK) => {}
            _ = stop.changed() => return,
        }
        if let Err(e) = run_step(&app).await {
            tracing::warn!("agent updates not stepped: {e}");
        }
    }
}

/// One look at every open update: each moving one stepped until it
/// rests (a passed stage starts the next at once).
pub async fn run_step(app: &App) -> AppResult<()> {
    let open = app.store.agent_updates(true).await?;
    app.update_tallies
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(id, _, _), _| open.iter().any(|u| u.id == *id));
    for row in open {
        if !row.machine.state.is_moving() {
            continue;
        }
        let id = row.id;
        if let Err(e) = app.step_update(row).await {
            tracing::warn!(update = id, "agent update not stepped: {e}");
        }
    }
    Ok(())
}

/// A target as the machine sees it.
fn view(row: &AgentUpdateRow, a: &AgentRow, bound: SignedDuration) -> UpdateAgent {
    let member = row.machine.members.get(&a.id);
    let clock_ok = a.clock.as_ref().is_some_and(|c| {
        c.state == "locked" && time::span_ns(c.uncertainty) <= time::span_ns(bound)
    });
    let runs = a.agent_version == row.version;
    let refused = a
        .update
        .as_ref()
        .filter(|u| u.version == row.version && u.phase.gives_up() && !runs)
        .map(|u| format!("{}: {}", u.phase.as_str(), u.reason));
    UpdateAgent {
        agent: a.clone(),
        view: AgentView {
            id: a.id.clone(),
            canary: a.labels.get("canary").is_some_and(|v| v == "true"),
            connected: a.connected,
            holds: runs && a.connected && clock_ok,
            refused,
            staged: false,
            clock_ok,
            last_seen: (a.last_seen.as_nanos() > 0).then_some(a.last_seen),
        },
        stage: member.map(|m| m.stage),
        skipped: member.is_some_and(|m| m.skipped),
    }
}

impl App {
    /// Every target of `row` as the machine sees it, with the cohort's
    /// and the baseline's figures over the current stage.
    pub(crate) async fn observe_update(
        &self,
        spec: &Rollout,
        row: &AgentUpdateRow,
    ) -> AppResult<(Observed, Vec<UpdateAgent>)> {
        let bound = time::span(i64::try_from(spec.max_uncertainty.as_nanos()).unwrap_or(i64::MAX));
        let targets: std::collections::HashSet<&str> =
            row.targets.iter().map(String::as_str).collect();
        let mut out: Vec<UpdateAgent> = self
            .agents_where(None, |a| targets.contains(a.id.as_str()))
            .await?
            .iter()
            .map(|a| view(row, a, bound))
            .collect();
        out.sort_by(|a, b| (a.stage.is_none(), &a.view.id).cmp(&(b.stage.is_none(), &b.view.id)));
        let offset = |u: &UpdateAgent| {
            u.agent
                .clock
                .as_ref()
                .filter(|_| u.agent.connected)
                .map(|c| c.offset.abs())
        };
        let (mut off_new, mut off_base) = (None::<SignedDuration>, None::<SignedDuration>);
        for u in &out {
            if u.stage.is_some() && !u.skipped && u.view.holds {
                off_new = off_new.max(offset(u));
            } else if u.stage.is_none() {
                off_base = off_base.max(offset(u));
            }
        }
        let tally = self.update_figures(row, &out).await?;
        let members = out
            .iter()
            .filter(|u| u.stage.is_some() && !u.skipped && u.view.holds)
            .count() as u64;
        let outsiders = out.iter().filter(|u| u.stage.is_none()).count() as u64;
        let baseline = if outsiders > 0 {
            Some(tally.baseline.figures(outsiders, off_base))
        } else {
            row.machine
                .verdicts
                .iter()
                .rev()
                .find_map(|v| v.baseline.clone())
        };
        let obs = Observed {
            now: now(),
            targets: out.iter().map(|u| u.view.clone()).collect(),
            cohort: baton_model::CohortFigures {
                stage_settled: tally.stage_settled,
                ..tally.cohort.figures(members, off_new)
            },
            baseline,
        };
        Ok((obs, out))
    }

    /// Firings of the current stage's window, read incrementally: a
    /// member's from when it ran the new version (its word "running"),
    /// the targets' not yet admitted as the baseline.
    async fn update_figures(
        &self,
        row: &AgentUpdateRow,
        agents: &[UpdateAgent],
    ) -> AppResult<Tally> {
        let Some(since) = row.machine.stage_started else {
            return Ok(Tally::default());
        };
        let slot = (row.id, row.machine.stage, since);
        let mut tally = self
            .update_tallies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&slot)
            .unwrap_or_default();
        // Members, from when they ran the version (a member's firings
        // before are not the version's; read once, they are not read
        // again); outsiders.
        let running_since = |u: &UpdateAgent| {
            u.agent
                .update
                .as_ref()
                .filter(|w| w.version == row.version && w.phase == UpdatePhase::Running)
                .map(|w| w.at)
        };
        let who: HashMap<&str, (Option<u32>, Option<baton_model::RefTime>)> = agents
            .iter()
            .filter(|u| !u.skipped)
            .map(|u| (u.view.id.as_str(), (u.stage, running_since(u))))
            .collect();
        let mut read_to = match tally.read_to {
            Some(m) => m,
            None => self.store.feedback_mark_at(since).await?,
        };
        loop {
            let (page, next) = self
                .store
                .feedback_after(read_to, FeedbackScope::All, MAX_PAGE)
                .await?;
            let done = page.len() < MAX_PAGE as usize;
            read_to = next;
            for f in &page {
                match who.get(f.agent_id.as_str()) {
                    Some((Some(stage), Some(from))) if f.actual >= *from => {
                        let before = tally.cohort.settled;
                        tally.cohort.add(f);
                        if *stage == row.machine.stage {
                            tally.stage_settled += tally.cohort.settled - before;
                        }
                    }
                    Some((None, _)) => tally.baseline.add(f),
                    _ => {}
                }
            }
            if done {
                break;
            }
        }
        tally.read_to = Some(read_to);
        let out = Tally {
            read_to: tally.read_to,
            cohort: tally.cohort.clone(),
            baseline: tally.baseline.clone(),
            stage_settled: tally.stage_settled,
        };
        self.update_tallies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(slot, tally);
        Ok(out)
    }

    /// Steps one update until it rests, or someone else moved it.
    async fn step_update(&self, mut row: AgentUpdateRow) -> AppResult<()> {
        let who = self.replica().unwrap_or("controller").to_string();
        let plan = plan_of(&row.plan)?;
        for _ in 0..8 {
            // One instant for the window's check and the step it decides.
            let at = now();
            if row.machine.stage_started.is_none() && !rollout::window_open(&plan.rollout, at) {
                if row.machine.state != baton_model::RolloutState::WaitingWindow {
                    let step = rollout::step(
                        &plan.rollout,
                        &row.machine,
                        &Observed {
                            now: at,
                            targets: Vec::new(),
                            cohort: Default::default(),
                            baseline: None,
                        },
                    );
                    self.apply_update(&row, step, &who).await?;
                }
                break;
            }
            let (obs, _) = self.observe_update(&plan.rollout, &row).await?;
            let step = rollout::step(&plan.rollout, &row.machine, &obs);
            if step.next.is_none() || !self.apply_update(&row, step, &who).await? {
                break;
            }
            match self.store.agent_update(Some(row.id)).await? {
                Some(r) if r.machine.state.is_moving() => row = r,
                _ => break,
            }
        }
        Ok(())
    }

    /// Stores a step (compare-and-set on the update's rev) with the
    /// offers it implies: the agents it admits are offered the release
    /// (their streams told at once, here and on the other replicas), an
    /// abort withdraws every offer. Audited. `false`: someone else moved
    /// the update first; nothing was done.
    pub(crate) async fn apply_update(
        &self,
        row: &AgentUpdateRow,
        step: Step,
        who: &str,
    ) -> AppResult<bool> {
        let Some(machine) = step.next else {
            return Ok(true);
        };
        let withdraw = step.effect.is_some();
        let admit: Vec<String> = step.admit.into_iter().map(|(id, _)| id).collect();
        let next = AgentUpdateRow {
            machine,
            ..row.clone()
        };
        if !self
            .store
            .advance_agent_update(next, admit.clone(), withdraw)
            .await?
        {
            return Ok(false);
        }
        for id in &admit {
            self.hub.send(id, crate::hub::SessionCmd::Release);
        }
        if withdraw {
            self.hub.send_all(|| crate::hub::SessionCmd::Release);
            self.announce_release_change(None);
        } else if !admit.is_empty() {
            self.announce_release_change(Some(&admit));
        }
        for line in step.said {
            // The machine speaks of a pack's cohort copy on an abort; an
            // update withdraws its offers.
            let line = match line.split_once("; the cohort") {
                Some((head, _)) if line.starts_with("aborted: ") => format!(
                    "{head}; offers of {} withdrawn (boxes that failed rolled themselves back; boxes updated stay on it)",
                    row.version
                ),
                _ => line,
            };
            tracing::info!(update = row.id, version = %row.version, "agent update: {line}");
            let audit = AuditRow {
                at: now(),
                who: who.to_string(),
                tenant: String::new(),
                role: String::new(),
                action: "update".into(),
                target: format!("agent update {} to {}", row.id, row.version),
                result: line,
            };
            if let Err(e) = self.store.put_audit(audit).await {
                tracing::error!(update = row.id, "agent update step not audited: {e}");
            }
        }
        Ok(true)
    }
}
