//! The controller's pack commands on the control thread: a push (to run
//! now, or staged for an instant), checked like a pack file and answered
//! with an ack or a nack; a cancel, which drives the pack's safe state and
//! removes it. Both are fenced first (a stale session's are refused).

use baton_proto::pack::{Pack, parse_pack};
use baton_proto::wire;
use baton_sched::PackKey;

use super::nack;
use crate::link::{StageAt, ToLink};
use crate::runtime::agent::Agent;
use crate::runtime::error::{AcceptError, RuntimeError};
use crate::runtime::link_state::Uplink;
use baton_control::admission::Verdict;

/// Pack errors with their positions, as the wire carries them.
fn wire_errors(errs: &baton_proto::PackErrors) -> Vec<wire::PackError> {
    errs.0
        .iter()
        .map(|e| wire::PackError {
            line: e.pos.line,
            column: e.pos.col,
            instruction: e.instruction.clone().unwrap_or_default(),
            message: e.message.clone(),
        })
        .collect()
}

impl Agent {
    /// A pushed pack the session's fence let through; its answer goes on
    /// `reply_on` (`None`: its session ended, the next Hello says where
    /// things stand).
    pub(super) fn act_on_push(
        &mut self,
        up: &mut Uplink,
        reply_on: Option<u64>,
        pack: wire::PackRef,
        yaml: String,
        stage: Option<StageAt>,
    ) -> Result<(), RuntimeError> {
        let (reply, fault) = match stage {
            Some(stage) => (self.stage_push(up, &pack, yaml, stage), None),
            None => {
                // A version to run now: whatever was staged of the
                // pack is superseded.
                let key = PackKey {
                    tenant: pack.tenant.clone(),
                    pack: pack.pack.clone(),
                };
                self.drop_staged(up, &key);
                self.on_push(&pack, yaml)
            }
        };
        if let Some(session) = reply_on {
            up.queue(session, reply);
        }
        if let Some(e) = fault {
            return Err(e);
        }
        Ok(())
    }

    /// A controller's cancel the session's fence let through.
    pub(super) fn act_on_cancel(
        &mut self,
        up: &mut Uplink,
        pack: wire::PackRef,
    ) -> Result<(), RuntimeError> {
        let key = PackKey {
            tenant: pack.tenant.clone(),
            pack: pack.pack.clone(),
        };
        self.drop_staged(up, &key);
        self.on_cancel(pack)?;
        // Held again even when nothing changed: it is how the
        // controller learns that the cancel took effect.
        self.plane.held.mark_changed();
        Ok(())
    }

    /// A staged push: parsed and checked like any push, then kept aside
    /// ([`stage`]).
    fn stage_push(
        &mut self,
        up: &mut Uplink,
        r: &wire::PackRef,
        yaml: String,
        stage: StageAt,
    ) -> ToLink {
        // A new staging replaces the old one, refused or not: a copy armed
        // for an instant the controller no longer wants must never stay
        // armed because its replacement did not pass.
        let key = PackKey {
            tenant: r.tenant.clone(),
            pack: r.pack.clone(),
        };
        self.drop_staged(up, &key);
        match self.parse_push(r, &yaml) {
            Ok(pack) => self.on_stage(up, r, yaml, pack, stage),
            Err(reply) => reply,
        }
    }

    /// A pushed pack: the answer, and a fault that must end the loop.
    fn on_push(&mut self, r: &wire::PackRef, yaml: String) -> (ToLink, Option<RuntimeError>) {
        let pack = match self.parse_push(r, &yaml) {
            Ok(p) => p,
            Err(reply) => return (reply, None),
        };
        self.accept_push(r, yaml, pack)
    }

    /// The pushed text parsed, named as the push names it, within the
    /// agent's pack limit; else the refusal to send.
    fn parse_push(&mut self, r: &wire::PackRef, yaml: &str) -> Result<Pack, ToLink> {
        use wire::NackReason as R;
        let label = format!("{}/{} v{}", r.tenant, r.pack, r.version);
        // Valid or not, the parse tree is garbage now.
        self.upkeep.heap_trim.parsed();
        let pack = match parse_pack(yaml) {
            Ok(p) => p,
            Err(errs) => {
                // The log gets the first few; the controller gets them all.
                let shown: Vec<String> = errs.0.iter().take(10).map(|e| e.to_string()).collect();
                tracing::warn!(
                    pack = %label,
                    errors = errs.0.len(),
                    "pushed pack is invalid:\n{}",
                    shown.join("\n")
                );
                let first = errs.0.first().map(|e| e.to_string()).unwrap_or_default();
                let message = format!(
                    "pack {label} is invalid: {} error(s), the first at {first}",
                    errs.0.len()
                );
                return Err(nack(r, R::Invalid, message, wire_errors(&errs)));
            }
        };
        if pack.tenant != r.tenant || pack.id != r.pack || pack.version != r.version {
            let message = format!(
                "the push names pack {label} but its YAML is pack {}/{} v{}",
                pack.tenant, pack.id, pack.version
            );
            tracing::warn!(pack = %label, "pushed pack refused: {message}");
            return Err(nack(r, R::Invalid, message, Vec::new()));
        }
        let key = PackKey::of(&pack);
        if !self.plane.held.contains(&key) && self.plane.held.len() >= self.cfg.max_packs {
            let message = format!(
                "this agent holds {} packs, its limit (max-packs): retry once one is cancelled",
                self.plane.held.len()
            );
            tracing::warn!(pack = %label, "pushed pack refused: {message}");
            return Err(nack(r, R::ResourceExhausted, message, Vec::new()));
        }
        Ok(pack)
    }

    /// A parsed push accepted (or refused): the answer, and a fault that
    /// must end the loop.
    fn accept_push(
        &mut self,
        r: &wire::PackRef,
        yaml: String,
        pack: Pack,
    ) -> (ToLink, Option<RuntimeError>) {
        use wire::NackReason as R;
        let label = format!("{}/{} v{}", r.tenant, r.pack, r.version);
        let result = self.accept(yaml, pack);
        match result {
            Ok(verdict) => {
                let unchanged = verdict == Verdict::Unchanged;
                if unchanged {
                    tracing::info!(pack = %label, "pushed again with the same content: unchanged");
                } else {
                    self.plane.held.mark_changed();
                }
                (
                    ToLink::Ack(wire::PackAck {
                        pack: Some(r.clone()),
                        unchanged,
                        staged: false,
                        activate_at_ns: 0,
                    }),
                    None,
                )
            }
            Err(e) => {
                let (reason, errors) = match &e {
                    AcceptError::Clock { .. } => (R::Clock, Vec::new()),
                    AcceptError::NotLive(errs) => (R::Invalid, wire_errors(errs)),
                    AcceptError::Journal(_) | AcceptError::Fault(_) => (R::Unavailable, Vec::new()),
                    // A line another pack is letting go of: free in a
                    // moment, retried like capacity.
                    AcceptError::Refused(a) if a.is_transient() => {
                        (R::ResourceExhausted, Vec::new())
                    }
                    AcceptError::Refused(_) | AcceptError::Core(_) => (R::Refused, Vec::new()),
                };
                let message = format!("pack {label}: {e}");
                tracing::warn!(pack = %label, reason = reason.as_str_name(), "pushed pack refused: {e}");
                let fault = e.is_fault().then(|| RuntimeError::from(e));
                (nack(r, reason, message, errors), fault)
            }
        }
    }

    /// A pack withdrawn by the controller: its safe state, then it is
    /// removed (as `baton-agent cancel`). Not held: nothing to do.
    fn on_cancel(&mut self, r: wire::PackRef) -> Result<(), RuntimeError> {
        let key = PackKey {
            tenant: r.tenant,
            pack: r.pack,
        };
        if self.core.held(&key).is_none() {
            tracing::info!(pack = %key, "controller cancel of a pack not held: nothing to do");
            return Ok(());
        }
        match self.cancel_local(&key) {
            Ok(msg) => {
                tracing::info!(pack = %key, "controller cancel: {msg}");
                Ok(())
            }
            Err(e @ RuntimeError::NotHeld(_)) => {
                tracing::error!(pack = %key, "controller cancel: {}", crate::runtime::error::Chain(&e));
                Ok(())
            }
            // The journal or the dispatcher failed half-way through a
            // cancel whose safe state may not have been handed over: the
            // loop's fault, so the way out drives every safe state.
            Err(e) => Err(e),
        }
    }
}
