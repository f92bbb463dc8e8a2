//! The memory store's releases, agent updates and release targets:
//! plain maps, the reads and the primitives over them.

use std::collections::BTreeMap;

use crate::{AgentUpdateRow, MAX_PAGE, ReleaseRow, ReleaseTarget, StoreError, StoreResult, fits};

/// What the memory store keeps of releases and updates.
#[derive(Clone, Debug, Default)]
pub(super) struct Releases {
    /// By (version, architecture).
    rows: BTreeMap<(String, String), ReleaseRow>,
    /// By (version, architecture, index).
    pieces: BTreeMap<(String, String, u64), Vec<u8>>,
    /// By id.
    updates: BTreeMap<u64, AgentUpdateRow>,
    /// By agent.
    targets: BTreeMap<String, ReleaseTarget>,
}

impl Releases {
    pub(super) fn release(&self, version: &str, arch: &str) -> Option<ReleaseRow> {
        self.rows
            .get(&(version.to_owned(), arch.to_owned()))
            .cloned()
    }

    pub(super) fn put_release(&mut self, row: &ReleaseRow) -> StoreResult<()> {
        fits(row.size, "release size")?;
        self.rows
            .insert((row.version.clone(), row.arch.clone()), row.clone());
        Ok(())
    }

    pub(super) fn put_piece(&mut self, version: &str, arch: &str, index: u64, data: &[u8]) {
        self.pieces
            .insert((version.to_owned(), arch.to_owned(), index), data.to_vec());
    }

    pub(super) fn piece(&self, version: &str, arch: &str, index: u64) -> Option<Vec<u8>> {
        self.pieces
            .get(&(version.to_owned(), arch.to_owned(), index))
            .cloned()
    }

    /// Newest upload first (then by version and architecture).
    pub(super) fn list(&self) -> Vec<ReleaseRow> {
        let mut v: Vec<ReleaseRow> = self.rows.values().cloned().collect();
        v.sort_by(|a, b| (b.uploaded, &a.version, &a.arch).cmp(&(a.uploaded, &b.version, &b.arch)));
        v
    }

    pub(super) fn offer(&self, agent: &str, arch: &str) -> Option<ReleaseRow> {
        let t = self.targets.get(agent)?;
        self.release(&t.version, arch)
    }

    pub(super) fn open_updates(&self) -> Vec<AgentUpdateRow> {
        self.updates
            .values()
            .filter(|u| !u.machine.state.is_final())
            .cloned()
            .collect()
    }

    /// Newest first.
    pub(super) fn updates(&self, open_only: bool) -> Vec<AgentUpdateRow> {
        let all = self.updates.values().rev();
        if open_only {
            all.filter(|u| !u.machine.state.is_final())
                .cloned()
                .collect()
        } else {
            all.take(MAX_PAGE as usize).cloned().collect()
        }
    }

    pub(super) fn update(&self, id: Option<u64>) -> Option<AgentUpdateRow> {
        match id {
            Some(id) => self.updates.get(&id).cloned(),
            None => self.updates.values().next_back().cloned(),
        }
    }

    pub(super) fn insert_update(&mut self, row: &AgentUpdateRow) -> StoreResult<u64> {
        let id = self.updates.keys().next_back().map_or(1, |k| k + 1);
        fits(id, "update id")?;
        let mut row = row.clone();
        row.id = id;
        row.machine.version = id;
        row.machine.rev = 0;
        self.updates.insert(id, row);
        Ok(id)
    }

    pub(super) fn cas_update(&mut self, row: &AgentUpdateRow) -> StoreResult<bool> {
        let Some(stored) = self.updates.get_mut(&row.id) else {
            return Err(StoreError::Invalid(format!("no agent update {}", row.id)));
        };
        if stored.machine.rev != row.machine.rev {
            return Ok(false);
        }
        let mut next = row.clone();
        next.machine.rev += 1;
        fits(next.machine.rev, "update rev")?;
        *stored = next;
        Ok(true)
    }

    pub(super) fn set_targets(&mut self, update: u64, version: &str, ids: &[String]) {
        for id in ids {
            self.targets.insert(
                id.clone(),
                ReleaseTarget {
                    agent_id: id.clone(),
                    version: version.to_owned(),
                    update,
                },
            );
        }
    }

    pub(super) fn clear_targets(&mut self, update: u64) {
        self.targets.retain(|_, t| t.update != update);
    }

    pub(super) fn forget_agent(&mut self, id: &str) {
        self.targets.remove(id);
    }
}
