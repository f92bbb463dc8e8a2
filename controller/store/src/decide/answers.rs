//! Agents' answers (ack, nack, pending) decided many at once: one batch
//! of answers from many streams takes the locks, reads the agents and
//! their rows, and writes what changed in a constant number of
//! statements (a pack's targets once per batch, a gated pack's cohort
//! once per answer), where one decision per answer took a dozen round
//! trips each.

use std::collections::{BTreeSet, HashMap};

use baton_model::planner;
use baton_model::{AgentRow, AnswerRow, DeliveryRow, PackKey, PackTargets};

use super::locks;
use crate::error::{StoreError, StoreResult};
use crate::tx::Tx;

/// Each answer decided as [`super::answer`] decides one, in order (a
/// later answer about the same pair sees what an earlier one made of
/// it): its row as it is now (`None`: no row, or an agent not stored), or
/// its own refusal ([`StoreError::Fenced`]: its stream is not the agent's
/// current one), which fails no other. An `Err` of the whole is the
/// store's, and nothing of it is written.
pub fn answers(
    tx: &mut dyn Tx,
    answers: &[AnswerRow],
) -> StoreResult<Vec<StoreResult<Option<DeliveryRow>>>> {
    let ids: BTreeSet<&str> = answers.iter().map(|a| a.agent_id.as_str()).collect();
    let ids: Vec<&str> = ids.into_iter().collect();
    locks::agents_in(tx, &ids, answers.iter().map(|a| a.key.tenant.as_str()))?;
    let agents: HashMap<String, AgentRow> = tx
        .agents(&ids)?
        .into_iter()
        .map(|a| (a.id.clone(), a))
        .collect();
    let pairs: BTreeSet<(String, PackKey)> = answers
        .iter()
        .filter(|a| agents.contains_key(&a.agent_id))
        .map(|a| (a.agent_id.clone(), a.key.clone()))
        .collect();
    let pairs: Vec<(String, PackKey)> = pairs.into_iter().collect();
    let mut rows: HashMap<(String, PackKey), DeliveryRow> = tx
        .rows_of_pairs(&pairs)?
        .into_iter()
        .map(|r| ((r.agent_id.clone(), r.key()), r))
        .collect();
    // What each pair ends as: `Some` written, `None` deleted.
    let mut changed: HashMap<(String, PackKey), Option<DeliveryRow>> = HashMap::new();
    let binding = tx.binding();
    let mut plain: HashMap<PackKey, Option<PackTargets>> = HashMap::new();
    let mut out = Vec::with_capacity(answers.len());
    for a in answers {
        let Some(agent) = agents.get(&a.agent_id) else {
            out.push(Ok(None));
            continue;
        };
        if agent.session_gen != a.session_gen {
            out.push(Err(StoreError::Fenced {
                agent: a.agent_id.clone(),
                session: a.session_gen,
                current: agent.session_gen,
            }));
            continue;
        }
        let pair = (a.agent_id.clone(), a.key.clone());
        let Some(row) = rows.get(&pair) else {
            out.push(Ok(None));
            continue;
        };
        // A pack without a rollout's gate reads the same for every
        // agent: read once per batch (a push's acks arrive together),
        // not once per answer. A gated pack's cohort is read for the
        // agent alone, as before.
        let mut gated: Option<Option<PackTargets>> = None;
        if !plain.contains_key(&a.key) {
            let p = tx.pack_targets(&a.key, Some(&a.agent_id))?;
            if p.as_ref().is_some_and(|p| p.gate.is_some()) {
                gated = Some(p);
            } else {
                plain.insert(a.key.clone(), p);
            }
        }
        let pack = match &gated {
            Some(p) => p.as_ref(),
            None => plain.get(&a.key).and_then(Option::as_ref),
        };
        let next = planner::answered(
            agent, pack, row, a.version, &a.answer, a.attempts, binding, a.at,
        );
        match &next {
            Some(n) if n == row => {}
            Some(n) => {
                rows.insert(pair.clone(), n.clone());
                changed.insert(pair, Some(n.clone()));
            }
            None => {
                rows.remove(&pair);
                changed.insert(pair, None);
            }
        }
        out.push(Ok(next));
    }
    let mut puts = Vec::new();
    let mut gone = Vec::new();
    for (pair, row) in changed {
        match row {
            Some(r) => puts.push(r),
            None => gone.push(pair),
        }
    }
    puts.sort_by_key(|r| (r.agent_id.clone(), r.key()));
    gone.sort();
    if !puts.is_empty() {
        tx.put_rows(&puts)?;
    }
    if !gone.is_empty() {
        tx.delete_rows(&gone)?;
    }
    Ok(out)
}
