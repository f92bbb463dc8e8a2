//! baton-agent

#![forbid(unsafe_code)]

/// The maps the control loop touches per firing (keyed by execution ids,
/// pack keys, tickets): hashed with foldhash, not SipHash, which was ~7 %
/// of the control thread at 1 000 firings/s. Seeded per process; the keys
/// come from packs (signed-in operators, local files), not from strangers.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub mod bench;
pub mod config;
pub mod dispatcher;
pub mod exec;
pub mod ledger;
pub mod link;
pub mod live;
pub mod metrics;
pub mod outbox;
pub mod rt;
pub mod runtime;
pub mod simulate;
