//! What the control loop is built from: handed in, so tests drive the
//! whole loop on a manual clock and an in-memory device.

use std::sync::Arc;
use std::sync::mpsc::Receiver;

use baton_journal::{Journal, Recovered};

use super::ports::{Clock, Device};
use super::safety::{self, SharedSafeTable};
use crate::exec::{ExecPool, ExecResult};

/// What the control loop is built from.
pub struct Parts {
    /// Reference time.
    pub clock: Arc<dyn Clock>,
    /// The opened journal.
    pub journal: Journal,
    /// What the journal recovered.
    pub recovered: Recovered,
    /// Where GPIO jobs go.
    pub device: Box<dyn Device>,
    /// Exec workers.
    pub exec: ExecPool,
    /// Their results.
    pub exec_rx: Receiver<ExecResult>,
    /// The safe-state table the panic hook reads.
    pub safe_table: SharedSafeTable,
    /// Where the dispatch ledger lives (`crate::ledger`); `None`: in
    /// anonymous memory (nothing survives the process).
    pub ledger: Option<std::path::PathBuf>,
    /// Writes the safe state without the device's thread (`safety`);
    /// `None` where the device has no thread to be stuck.
    pub safe_driver: Option<Arc<safety::SafeDriver>>,
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts").finish_non_exhaustive()
    }
}
