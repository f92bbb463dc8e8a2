//! baton-agent

#![forbid(unsafe_code)]

/// The maps the control loop touches per firing (keyed by execution ids,
/// pack keys, tickets): hashed with foldhash, not SipHash, which was ~7 %
/// of the control thread at 1 000 firings/s. Seeded per process; the keys
/// come from packs (signed-in operators, local files), not from strangers.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub mod bench;
// The firing path lives in its own crate (Cargo holds the layer); its
// modules keep their paths here.
pub use baton_dispatch::{dispatcher, ledger, rt};
// So is the controller link's side of the agent.
pub use baton_agent_link::{link, outbox};
// And the pool that runs `exec` actions, and the configuration.
pub use baton_agent_config as config;
pub use baton_exec as exec;
pub mod launch;
pub mod live;
pub mod metrics;
pub mod runtime;
pub mod simulate;
pub mod version;
