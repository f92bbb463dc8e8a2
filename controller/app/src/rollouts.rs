//! Rollouts: the driver that moves them (every replica runs it; the
//! store's compare-and-set lets one step through), what it observes for
//! the pure machine ([`baton_model::rollout`]), and the operators' status,
//! pause, resume and abort. Every step, automatic or not, is audited.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::tally::Acc;
use baton_proto::pack::rollout::Rollout;
use baton_proto::pack::with_version;
use tokio::sync::watch;

use crate::app::{App, AppError, AppResult, now};

use crate::caller::Caller;
use baton_model::rollout::{self, AgentView, Effect, Observed, Step};
use baton_model::time::{self, SignedDuration};
use baton_model::{
    AgentRow, AuditRow, CohortFigures, DeliveryRow, DeliveryState, PackKey, PackVersionRow,
    RefTime, RolloutChange, RolloutRow,
};
use baton_store::StoreOps;
use baton_store::{FeedbackScope, MAX_PAGE};

/// How often the driver looks at open rollouts when nothing wakes it.
pub const TICK: Duration = Duration::from_secs(1);

/// One target agent in a rollout's status.
#[derive(Clone, Debug, PartialEq)]
pub struct RolloutAgent {
    /// As the machine saw it.
    pub view: AgentView,
    /// The stage that admitted it (`None`: not in the cohort).
    pub stage: Option<u32>,
    /// Left out of verdicts (`skip_offline`).
    pub skipped: bool,
    /// The version it holds of the pack.
    pub held: Option<u64>,
    /// When its delivery row last changed (`None`: it has none).
    pub since: Option<RefTime>,
}

/// A rollout as `rollout status` shows it.
#[derive(Clone, Debug)]
pub struct RolloutStatus {
    /// As stored.
    pub row: RolloutRow,
    /// Stages in the pack's `rollout:`.
    pub stages: usize,
    /// Every agent the pack targets, cohort first.
    pub agents: Vec<RolloutAgent>,
    /// The current stage's figures so far.
    pub cohort: CohortFigures,
    /// The baseline's, same window.
    pub baseline: Option<CohortFigures>,
    /// The version's `rollout:` section: the gates the figures are
    /// judged against, the soak.
    pub spec: Arc<Rollout>,
}

/// One targeted agent as the rollout sees it: what it holds of the
/// version (`d`, its delivery row), whether its clock is within `bound`,
/// and its membership of the cohort.
fn rollout_agent(
    row: &RolloutRow,
    a: &AgentRow,
    d: Option<&DeliveryRow>,
    bound: SignedDuration,
) -> RolloutAgent {
    let held = d.and_then(|d| d.held).map(|h| h.version);
    let member = row.members.get(&a.id);
    let view = AgentView {
        id: a.id.clone(),
        canary: a
            .labels_for(&row.tenant)
            .get("canary")
            .is_some_and(|v| v == "true"),
        connected: a.connected,
        holds: held == Some(row.version),
        refused: d
            .filter(|d| d.version == row.version && d.state == DeliveryState::Nacked)
            .map(|d| d.reason.clone()),
        staged: d
            .and_then(|d| d.staged)
            .is_some_and(|st| st.version == row.version),
        clock_ok: a.clock.as_ref().is_some_and(|c| c.uncertainty <= bound),
        last_seen: (a.last_seen.as_nanos() > 0).then_some(a.last_seen),
    };
    RolloutAgent {
        view,
        stage: member.map(|m| m.stage),
        skipped: member.is_some_and(|m| m.skipped),
        held,
        since: d.map(|d| d.updated),
    }
}

/// The pack's `rollout:` section of `version` (parsed once per version,
/// see [`crate::texts`]).
async fn spec_of(app: &App, key: &PackKey, version: u64) -> AppResult<Arc<Rollout>> {
    let text = app
        .pack_text(key, version)
        .await?
        .ok_or_else(|| AppError::NotFound(format!("{key} v{version} is not stored")))?;
    text.rollout
        .clone()
        .ok_or_else(|| AppError::Invalid(format!("{key} v{version} has no valid rollout: section")))
}

impl App {
    /// Every agent `row`'s pack targets, with what it holds, and the
    /// cohort's and baseline's figures over the current stage.
    async fn observe(
        &self,
        spec: &Rollout,
        row: &RolloutRow,
    ) -> AppResult<(Observed, Vec<RolloutAgent>)> {
        let bound = time::span(i64::try_from(spec.max_uncertainty.as_nanos()).unwrap_or(i64::MAX));
        let key = row.key();
        let pack = self
            .store
            .pack_version(&key, Some(row.version))
            .await?
            .ok_or_else(|| AppError::NotFound(format!("{key} v{} is not stored", row.version)))?;
        let agents = self.targeted_agents(&key, &pack).await?;
        let rows = self.rows_of_pack(&key).await?;
        let mut out = Vec::with_capacity(agents.len());
        let (mut off_new, mut off_base) = (None::<SignedDuration>, None::<SignedDuration>);
        for a in &agents {
            let ra = rollout_agent(row, a, rows.get(&a.id), bound);
            let offset = a
                .clock
                .as_ref()
                .filter(|_| a.connected)
                .map(|c| c.offset.abs());
            if ra.stage.is_some() && !ra.skipped {
                off_new = off_new.max(offset);
            } else if ra.stage.is_none() && ra.held.is_some() && ra.held == row.from {
                off_base = off_base.max(offset);
            }
            out.push(ra);
        }
        out.sort_by(|a, b| (a.stage.is_none(), &a.view.id).cmp(&(b.stage.is_none(), &b.view.id)));
        let (cohort, baseline, stage_settled) = self.figures(row, &out).await?;
        let members = out
            .iter()
            .filter(|a| a.stage.is_some() && !a.skipped)
            .count() as u64;
        let outsiders = out
            .iter()
            .filter(|a| a.stage.is_none() && a.held.is_some() && a.held == row.from)
            .count() as u64;
        // The last stage leaves nobody outside the cohort: its baseline
        // is the one the stage before it was judged against (the README
        // says so), not an absolute threshold in disguise.
        let baseline = if outsiders > 0 {
            Some(baseline.figures(outsiders, off_base))
        } else {
            row.verdicts.iter().rev().find_map(|v| v.baseline.clone())
        };
        let obs = Observed {
            now: now(),
            targets: out.iter().map(|a| a.view.clone()).collect(),
            cohort: CohortFigures {
                stage_settled,
                ..cohort.figures(members, off_new)
            },
            baseline,
        };
        Ok((obs, out))
    }

    /// The agents of the pack's tenant that `pack` targets, all pages.
    async fn targeted_agents(
        &self,
        key: &PackKey,
        pack: &PackVersionRow,
    ) -> AppResult<Vec<AgentRow>> {
        // An agent an operator withdrew this version from is none of its
        // targets: never admitted, never waited for.
        let withdrawn = self.store.withdrawn_from(key).await?;
        let stopped = |id: &str| withdrawn.get(id).is_some_and(|&v| pack.version <= v);
        self.agents_where(Some(key.tenant.clone()), |a| {
            a.serves(&key.tenant, self.cfg.binding)
                && pack.targets.matches(&a.id, &a.labels_for(&key.tenant))
                && !stopped(&a.id)
        })
        .await
    }

    /// Every delivery row of the pack, by agent, all pages.
    async fn rows_of_pack(&self, key: &PackKey) -> AppResult<HashMap<String, DeliveryRow>> {
        let rows = self.all_deliveries(key, None).await?;
        Ok(rows.into_iter().map(|r| (r.agent_id.clone(), r)).collect())
    }

    /// Feedback of the current stage's window: the cohort's firings of
    /// the version, the baseline's of `from`. Read incrementally.
    async fn figures(
        &self,
        row: &RolloutRow,
        agents: &[RolloutAgent],
    ) -> AppResult<(Acc, Acc, u64)> {
        let Some(since) = row.stage_started else {
            return Ok((Acc::default(), Acc::default(), 0));
        };
        let key = row.key();
        let slot = (key.clone(), row.version, row.stage, since);
        let mut tally = self
            .rollout_tallies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&slot)
            .unwrap_or_default();
        // Members (with the stage that admitted them) and outsiders;
        // skipped members count for neither.
        let member: HashMap<&str, Option<u32>> = agents
            .iter()
            .filter(|a| !a.skipped)
            .map(|a| (a.view.id.as_str(), a.stage))
            .collect();
        // Followed by mark, not paged by id: with writers in parallel a
        // row can commit after one with a higher id was read, and a
        // failure the gates never count could pass a stage.
        let scope = FeedbackScope::Pack { key: &key, since };
        let mut read_to = match tally.read_to {
            Some(m) => m,
            None => self.store.feedback_mark_at(since).await?,
        };
        loop {
            let (page, next) = self.store.feedback_after(read_to, scope, MAX_PAGE).await?;
            let done = page.len() < MAX_PAGE as usize;
            read_to = next;
            for f in &page {
                match member.get(f.agent_id.as_str()) {
                    Some(Some(stage)) if f.version == row.version => {
                        let before = tally.cohort.settled;
                        tally.cohort.add(f);
                        if *stage == row.stage {
                            tally.stage_settled += tally.cohort.settled - before;
                        }
                    }
                    Some(None) if Some(f.version) == row.from => tally.baseline.add(f),
                    _ => {}
                }
            }
            if done {
                break;
            }
        }
        tally.read_to = Some(read_to);
        let out = (
            tally.cohort.clone(),
            tally.baseline.clone(),
            tally.stage_settled,
        );
        let mut t = self
            .rollout_tallies
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Stages that ended are forgotten: only open ones are kept.
        t.retain(|(k, v, _, _), _| !(k == &key && *v == row.version));
        t.insert(slot, tally);
        Ok(out)
    }

    /// Stores a step (compare-and-set on the row's rev) with what it
    /// implies: the gate, a rollback's republished version. Audited, and
    /// the rows that changed are delivered. `false`: someone else moved
    /// the rollout first; nothing was done.
    async fn apply(&self, row: &RolloutRow, step: Step, who: &str) -> AppResult<bool> {
        let Some(mut next) = step.next else {
            return Ok(true);
        };
        let key = row.key();
        let mut republish = None;
        let mut effect = step.effect;
        let mut said = step.said;
        if effect == Some(Effect::Rollback) {
            match self.rollback_version(row).await {
                Ok(Some(p)) => {
                    next.rollback = Some(p.version);
                    republish = Some(p);
                }
                Ok(None) => effect = Some(Effect::Withdraw),
                Err(e) => {
                    said.push(format!(
                        "rollback impossible ({e}): the version is withdrawn instead"
                    ));
                    effect = Some(Effect::Withdraw);
                }
            }
        }
        let gate = next.gate(effect == Some(Effect::Withdraw));
        let change = RolloutChange {
            row: next.clone(),
            admit: step.admit,
            skip: step.skip,
            republish: republish.clone(),
            gate,
        };
        let Some(changed) = self.store.advance_rollout(change, now()).await? else {
            return Ok(false);
        };
        // Stored: the sessions act on it first, whatever happens to the
        // audit records after.
        self.delivered(&changed, republish.map(|r| self.specs.text(r)).as_ref());
        for line in &said {
            tracing::info!(pack = %key, version = row.version, "rollout: {line}");
            let audit = AuditRow {
                at: now(),
                who: who.to_string(),
                tenant: key.tenant.clone(),
                role: String::new(),
                action: "rollout".into(),
                target: format!("{key} v{}", row.version),
                result: line.clone(),
            };
            if let Err(e) = self.store.put_audit(audit).await {
                // The step is stored and acted on; its record is what is
                // missing (the log line above says it).
                tracing::error!(pack = %key, "rollout step not audited: {e}");
            }
        }
        Ok(true)
    }

    /// The previous version's content as a new version above the latest
    /// (agents refuse lower versions), or `None` when there is no previous
    /// version (the pack was new).
    async fn rollback_version(&self, row: &RolloutRow) -> AppResult<Option<PackVersionRow>> {
        let Some(from) = row.from else {
            return Ok(None);
        };
        let key = row.key();
        let old = self
            .store
            .pack_version(&key, Some(from))
            .await?
            .ok_or_else(|| AppError::NotFound(format!("{key} v{from} is not stored")))?;
        let latest = self
            .store
            .pack_version(&key, None)
            .await?
            .map_or(row.version, |p| p.version);
        let version = latest.max(row.version) + 1;
        // A signature covered the old version's bytes, not the renumbered
        // ones: left out, a box that requires signatures refuses the
        // rollback as unsigned (said in the deliveries) rather than as a
        // forgery. (The fix is an operator-signed rollback; issue 39's note.)
        let text = baton_trust::pack::split(&old.yaml).map_or(old.yaml.as_str(), |(body, _)| body);
        let yaml = with_version(text, version).map_err(|e| {
            AppError::Invalid(format!(
                "{key} v{from} cannot be numbered v{version}: {}",
                e.render("its text").trim_end()
            ))
        })?;
        Ok(Some(PackVersionRow {
            version,
            yaml,
            pushed: now(),
            rollout: false,
            ..old
        }))
    }

    /// One look at every open rollout: each moving one is stepped until
    /// it rests (a passed stage starts the next at once).
    pub async fn step_rollouts(&self) -> AppResult<()> {
        let open = self.store.rollouts(None, true).await?;
        // What was read of rollouts that ended is dropped.
        self.rollout_tallies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(k, v, _, _), _| open.iter().any(|r| r.key() == *k && r.version == *v));
        for row in open {
            if !row.state.is_moving() {
                continue;
            }
            let key = row.key();
            // One rollout's trouble (its text unreadable, a failed read)
            // is its own: the others move on.
            if let Err(e) = self.step_rollout(row).await {
                tracing::warn!(pack = %key, "rollout not stepped: {e}");
            }
        }
        Ok(())
    }

    /// Steps one rollout until it rests (a passed stage starts the next
    /// at once), or someone else moved it.
    async fn step_rollout(&self, mut row: RolloutRow) -> AppResult<()> {
        let who = self.replica().unwrap_or("controller").to_string();
        let spec = spec_of(self, &row.key(), row.version).await?;
        for _ in 0..8 {
            if row.state == baton_model::RolloutState::WaitingWindow
                && row.stage_started.is_none()
                && !rollout::window_open(&spec, now())
            {
                // Nothing to observe until a window opens.
                break;
            }
            let (obs, _) = self.observe(&spec, &row).await?;
            let step = rollout::step(&spec, &row, &obs);
            if step.next.is_none() || !self.apply(&row, step, &who).await? {
                break;
            }
            match self.store.rollout(&row.key(), Some(row.version)).await? {
                Some(r) if r.state.is_moving() => row = r,
                _ => break,
            }
        }
        Ok(())
    }

    /// A rollout the caller may see (`version` `None`: the pack's newest).
    async fn visible_rollout(
        &self,
        caller: &Caller,
        tenant: &str,
        pack: &str,
    ) -> AppResult<RolloutRow> {
        let missing = || AppError::NotFound(format!("no rollout of pack {pack}"));
        let tenant = caller.tenant_of(tenant).ok_or_else(missing)?;
        self.store
            .rollout(&PackKey::new(tenant, pack), None)
            .await?
            .ok_or_else(missing)
    }

    /// `rollout status`.
    pub async fn rollout_status(
        &self,
        caller: &Caller,
        tenant: &str,
        pack: &str,
    ) -> AppResult<RolloutStatus> {
        let row = self.visible_rollout(caller, tenant, pack).await?;
        let spec = spec_of(self, &row.key(), row.version).await?;
        let (obs, agents) = self.observe(&spec, &row).await?;
        Ok(RolloutStatus {
            stages: spec.stages.len(),
            row,
            agents,
            cohort: obs.cohort,
            baseline: obs.baseline,
            spec,
        })
    }

    /// `rollout list`: the caller's tenant's (or every) rollout.
    pub async fn rollout_list(&self, caller: &Caller) -> AppResult<Vec<RolloutRow>> {
        Ok(self.store.rollouts(caller.tenant(), false).await?)
    }

    /// `rollout pause|resume|abort`: audited, refused ones included.
    pub async fn rollout_command(
        &self,
        caller: &Caller,
        tenant: &str,
        pack: &str,
        command: RolloutCommand,
    ) -> AppResult<RolloutRow> {
        let target_tenant = caller.tenant_of(tenant).unwrap_or_default();
        let result = self
            .rollout_command_inner(caller, tenant, pack, command)
            .await;
        let row = self
            .audited(caller, &target_tenant, command.action(), pack, result)
            .await?;
        let what = format!(
            "{} the rollout of v{} (now {})",
            command.done(),
            row.version,
            row.state.as_str()
        );
        self.announce(caller, &row.key(), "", what);
        Ok(row)
    }

    async fn rollout_command_inner(
        &self,
        caller: &Caller,
        tenant: &str,
        pack: &str,
        command: RolloutCommand,
    ) -> AppResult<RolloutRow> {
        caller.may_change()?;
        // A concurrent step (the driver on any replica) may move the
        // rollout between the read and the write: read again and retry.
        for _ in 0..16 {
            let row = self.visible_rollout(caller, tenant, pack).await?;
            let spec = spec_of(self, &row.key(), row.version).await?;
            let who = caller.who.to_string();
            let now = now();
            let step = match command {
                RolloutCommand::Pause => rollout::pause(&row, &format!("paused by {who}"), now),
                RolloutCommand::Resume => rollout::resume(&row, &who, now),
                RolloutCommand::Abort => {
                    rollout::abort(&spec, &row, &format!("aborted by {who}"), now)
                }
            }
            .map_err(AppError::Conflict)?;
            if self.apply(&row, step, &who).await? {
                return self
                    .store
                    .rollout(&row.key(), Some(row.version))
                    .await?
                    .ok_or_else(|| AppError::NotFound(format!("no rollout of pack {pack}")));
            }
        }
        Err(AppError::Unavailable(
            "the rollout kept changing under this command; try again".into(),
        ))
    }
}

/// What an operator asks of a rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutCommand {
    /// Hold it where it is.
    Pause,
    /// Let a paused rollout go on.
    Resume,
    /// End it (final), with the pack's `on_abort`.
    Abort,
}

impl RolloutCommand {
    /// The command named by its word (`pause`, `resume`, `abort`).
    pub fn parse(word: &str) -> Option<RolloutCommand> {
        match word {
            "pause" => Some(RolloutCommand::Pause),
            "resume" => Some(RolloutCommand::Resume),
            "abort" => Some(RolloutCommand::Abort),
            _ => None,
        }
    }

    /// Its word.
    pub fn word(self) -> &'static str {
        match self {
            RolloutCommand::Pause => "pause",
            RolloutCommand::Resume => "resume",
            RolloutCommand::Abort => "abort",
        }
    }

    fn done(self) -> &'static str {
        match self {
            RolloutCommand::Pause => "paused",
            RolloutCommand::Resume => "resumed",
            RolloutCommand::Abort => "aborted",
        }
    }

    fn action(self) -> &'static str {
        match self {
            RolloutCommand::Pause => "rollout.pause",
            RolloutCommand::Resume => "rollout.resume",
            RolloutCommand::Abort => "rollout.abort",
        }
    }
}

/// Step open rollouts every [`TICK`] until `stop`.
pub async fn run(app: Arc<App>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = stop.changed() => return,
        }
        if let Err(e) = app.step_rollouts().await {
            tracing::warn!("rollouts not stepped: {e}");
        }
    }
}
