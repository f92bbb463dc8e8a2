//! Outbox records into `wire::Feedback`, on the link thread: the control
//! thread only reads pages of bytes from the journal, never encodes for
//! the wire.
//!
//! A record is read by `crate::outbox` (binary, or the JSON of agents
//! before it) into the typed `baton_proto::feedback::Record`, which
//! `Record::to_wire` carries without folding: the outcome from the fixed
//! set, the typed reason beside a free `detail`, the clock's source and
//! state, the occurrence, the agent's own event word. Late, withdrawn and
//! stopped attempts are `SKIPPED` with reason `LATE` / `WITHDRAWN` /
//! `SHUTDOWN`; an `on_failure` is `GIVE_UP` (its event word tells it from
//! the give-up before it). Nothing is ever dropped: a record that cannot be
//! read is still sent, `UNSPECIFIED` with its text in `detail`.

use baton_proto::wire;

use crate::outbox::{self, Decoded};

/// The wire form of outbox record `seq` (its bytes as journalled);
/// `dropped_before`: entries the agent dropped just before it.
pub fn feedback(seq: u64, record: &[u8], dropped_before: u64) -> wire::Feedback {
    match outbox::decode(record) {
        Decoded::Record(r) => r.to_wire(seq, dropped_before),
        Decoded::Unreadable(text) => wire::Feedback {
            seq,
            outcome: wire::Outcome::Unspecified as i32,
            detail: text,
            dropped_before,
            ..wire::Feedback::default()
        },
    }
}
