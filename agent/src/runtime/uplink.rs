//! The control thread's side of the controller link (`crate::link`):
//! hello, pushes, cancels, feedback, clock reports and pack leases. Called
//! from [`Agent::step`] with bounded work per call; nothing here blocks or
//! awaits (the link thread does the IO).
//!
//! # A session
//!
//! `Connected` → Hello (agent id, labels, version, capabilities, the held
//! packs with their `stopped` flags, the journal id, the outbox's first and
//! last seq, `max-packs`). `Welcome` → the outbox is acknowledged up to the
//! controller's `feedback_acked_seq`, the send window opens at the outbox
//! front, a clock report goes out. From then on feedback flows in seq
//! order, [`window::PAGE`] records per batch, at most
//! [`window::MAX_IN_FLIGHT`] unacknowledged; an entry leaves the journal
//! only when a `FeedbackAck` covers it. Every reconnect starts again at
//! the outbox front: whatever was in flight is sent again (the controller
//! de-duplicates by seq within the journal id).
//!
//! # Pushes
//!
//! A pushed YAML is validated again (`parse_pack`), must be the pack its
//! `PackRef` names, must fit in `max-packs`, and goes through
//! [`Agent::accept`] like a pack file. The answer: `PackAck` (`unchanged`
//! for the same version and text), or `PackNack` with a reason —
//! `INVALID` (every error with its line, column and instruction),
//! `RESOURCE_EXHAUSTED`, `CLOCK`, `UNAVAILABLE` (the journal failed: the
//! control loop then ends through its one way out, as on any journal
//! error) or `REFUSED` (this agent's own checks: lines, programs, owners,
//! versions). After any change of the held set a `Held` goes out.
//!
//! # Fencing
//!
//! Hello carries the highest session generation the journal holds; a
//! Welcome below it is refused (the session is dropped, is not contact,
//! and nothing it sends is acted on), one above it is journalled before
//! anything else of the session is handled; a push or cancel sent on
//! another generation than its session's is refused (`STALE` nack; a
//! cancel is logged and counted). See [`fence`].
//!
//! # Leases
//!
//! A pack with `lease: L` whose `L` has passed without contact with the
//! controller enters its safe state (`lease_lost`, reported in feedback
//! like every safe state) — that pack only. It is journalled stopped, so
//! it stays stopped across restarts; **a higher version of the pack brings
//! it back** (a re-push of the same version is `unchanged` and leaves it
//! stopped). See [`lease`] for what counts as contact. Only an agent with
//! a controller configured enforces leases.

pub mod fence;
mod lease;
mod stage;
mod window;

use std::collections::VecDeque;

use baton_proto::wire;

use super::*;
use crate::link::{FeedbackPage, FromLink, Link, LinkConfig, Outgoing, SendError, ToLink};
use baton_clock::MonoTime;
use baton_clock::estimator::ClockState;
use baton_clock::sample::SourceKind;
use fence::{Fence, Welcomed};
use lease::{LeaseClock, Leased};
use window::SendWindow;

/// What the agent tells the controller it can do.
pub const CAPABILITIES: &[&str] = &["gpio", "exec", "lease"];
/// Link events handled per step, at most (and at most one push or cancel:
/// parsing a large pack takes a while, and firings are armed in between).
const EVENTS_PER_STEP: usize = 32;
/// Messages waiting for room in the link's channel beyond which no more
/// link events are taken (back-pressure to the link).
const PENDING_CAP: usize = 32;
/// Feedback pages read from the journal per step, at most.
const PAGES_PER_STEP: usize = 4;
/// Clock reports, this often (and after every Welcome).
const CLOCK_REPORT_EVERY: Duration = Duration::from_secs(5);
/// How long the way out waits for the link thread.
const LINK_STOP_WAIT: Duration = Duration::from_secs(1);
/// Retry interval while the link's channel is full.
const RETRY_FULL: Duration = Duration::from_millis(5);

/// The control thread's link state.
#[derive(Debug)]
pub(super) struct Uplink {
    link: Link,
    /// The session Hello was sent on, while it lasts.
    session: Option<u64>,
    /// The current session was welcomed: feedback and clock reports flow.
    welcomed: bool,
    window: SendWindow,
    /// Messages the link's channel had no room for, in order.
    pending: VecDeque<Outgoing>,
    lease: LeaseClock,
    next_clock_report: MonoTime,
    /// Source and state of the last clock report.
    last_clock: Option<(SourceKind, ClockState)>,
    /// The last step left link events waiting: step again at once.
    backlog: bool,
    /// The link thread is gone (logged once).
    closed: bool,
    /// How the current session's Welcome was decided (fencing).
    fence: Fence,
    /// Refusals of a stale controller, for `/metrics`.
    stale: crate::metrics::StaleSnap,
    /// Versions staged for a switch at an instant (`activate: together`).
    staged: stage::StagedPacks,
}

impl Uplink {
    fn queue(&mut self, session: u64, msg: ToLink) {
        self.pending.push_back(Outgoing { session, msg });
    }

    /// Hand queued messages to the link, in order, as far as it has room.
    fn flush(&mut self) {
        while let Some(o) = self.pending.pop_front() {
            match self.link.try_send(o) {
                Ok(()) => {}
                Err(SendError::Full(o)) => {
                    self.pending.push_front(o);
                    break;
                }
                Err(SendError::Closed(_)) => {
                    if !self.closed {
                        tracing::error!(
                            "the controller link thread ended: running without a controller (leases will run out)"
                        );
                        self.closed = true;
                    }
                    self.pending.clear();
                    break;
                }
            }
        }
    }
}

/// A nack for `pack`.
fn nack(
    pack: &wire::PackRef,
    reason: wire::NackReason,
    message: String,
    errors: Vec<wire::PackError>,
) -> ToLink {
    ToLink::Nack(wire::PackNack {
        pack: Some(pack.clone()),
        errors,
        reason: reason as i32,
        message,
    })
}

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
    /// Start the link thread if a controller is configured.
    pub(super) fn start_uplink(&mut self) -> anyhow::Result<()> {
        if self.cfg.controllers.is_empty() {
            return Ok(());
        }
        let mut link_cfg = LinkConfig::new(self.cfg.controllers.clone(), self.cfg.id.clone());
        link_cfg.time_exchange = self.cfg.clock.link;
        link_cfg.tls = self.cfg.tls.clone();
        let link = Link::start(link_cfg, self.clock.clone(), std::thread::current())
            .map_err(|e| anyhow::anyhow!("starting the controller link thread: {e}"))?;
        let now = self.mono_now();
        self.uplink = Some(Uplink {
            link,
            session: None,
            welcomed: false,
            window: SendWindow::default(),
            pending: VecDeque::new(),
            lease: LeaseClock::new(now),
            next_clock_report: now,
            last_clock: None,
            backlog: false,
            closed: false,
            fence: Fence::default(),
            stale: crate::metrics::StaleSnap::default(),
            staged: stage::StagedPacks::new(),
        });
        Ok(())
    }

    /// For `/metrics`: whether the session is established (welcomed), the
    /// messages waiting for the link, and the refusals of stale
    /// controllers; `None` without a controller.
    pub(super) fn link_metrics(&self) -> Option<(bool, usize, crate::metrics::StaleSnap)> {
        let up = self.uplink.as_ref()?;
        Some((up.welcomed && !up.closed, up.pending.len(), up.stale))
    }

    /// Stop the link thread (the way out), waiting at most a second.
    pub(super) fn stop_uplink(&mut self) {
        if let Some(up) = &mut self.uplink
            && !up.link.stop(LINK_STOP_WAIT)
        {
            tracing::warn!("the controller link thread did not stop within {LINK_STOP_WAIT:?}");
        }
    }

    /// Now on the monotonic scale (leases, report intervals).
    pub(super) fn mono_now(&self) -> MonoTime {
        self.clock.to_mono(self.clock.now())
    }

    /// One pass of the link's control side: link events (bounded), leases,
    /// `Held` after changes, clock reports, feedback pages (bounded).
    pub(super) fn uplink_step(&mut self) -> anyhow::Result<()> {
        let Some(mut up) = self.uplink.take() else {
            return Ok(());
        };
        let r = self.uplink_pass(&mut up);
        up.flush();
        self.uplink = Some(up);
        r
    }

    fn uplink_pass(&mut self, up: &mut Uplink) -> anyhow::Result<()> {
        self.switch_due(up)?;
        up.flush();
        up.backlog = false;
        let mut taken = 0;
        while up.pending.len() < PENDING_CAP {
            if taken == EVENTS_PER_STEP {
                up.backlog = true;
                break;
            }
            let Some(ev) = up.link.try_recv() else { break };
            taken += 1;
            let heavy = matches!(ev, FromLink::Push { .. } | FromLink::Cancel { .. });
            self.on_link(up, ev)?;
            up.flush();
            if heavy {
                up.backlog = true;
                break;
            }
        }
        self.check_leases(up)?;
        if let Some(session) = up.session
            && self.held_changed
        {
            self.held_changed = false;
            up.queue(session, ToLink::Held(self.held_list()));
        }
        let now = self.mono_now();
        // Every few seconds, and at once when the source or state changes.
        let clock_now = self.clock.status().map(|e| (e.source, e.state));
        if let Some(session) = up.session
            && up.welcomed
            && (now >= up.next_clock_report || clock_now != up.last_clock)
        {
            up.last_clock = clock_now;
            up.queue(session, ToLink::ClockReport(self.clock_report()));
            up.next_clock_report = now + CLOCK_REPORT_EVERY;
        }
        up.flush();
        self.send_feedback(up)
    }

    /// The earliest instant the link side has work (for the loop's sleep).
    pub(super) fn uplink_wake(&self, now: RefTime) -> Option<RefTime> {
        let up = self.uplink.as_ref()?;
        if up.backlog {
            return Some(now);
        }
        if !up.pending.is_empty() {
            return Some(now + RETRY_FULL);
        }
        let back = self.journal.outbox_range().map(|(_, b)| b);
        if up
            .window
            .next_page(None)
            .is_some_and(|(from, _)| back.is_some_and(|b| b >= from))
        {
            return Some(now);
        }
        if let Some(t) = Self::next_switch(up) {
            // A staged version's instant is kept to the loop's precision:
            // a lease or a report may come later.
            return Some(t.max(now));
        }
        let mut at: Option<MonoTime> = None;
        if up.welcomed {
            at = Some(up.next_clock_report);
        }
        for (key, h) in &self.held {
            let Some(lease) = h.lease else { continue };
            if !self.core.held(key).is_some_and(|(_, active)| active) {
                continue;
            }
            let t = up.lease.expiry(&Leased {
                lease,
                since: h.since,
            });
            at = Some(at.map_or(t, |a| a.min(t)));
        }
        at.map(|m| self.clock.to_ref(m))
    }

    fn on_link(&mut self, up: &mut Uplink, ev: FromLink) -> anyhow::Result<()> {
        let now = self.mono_now();
        match ev {
            FromLink::Connected { session } => {
                up.session = Some(session);
                up.welcomed = false;
                up.fence.connected(session);
                up.window.close();
                // Whatever waited for an earlier session is moot: Hello
                // says where things stand.
                up.pending.retain(|o| o.session == session);
                let hello = self.hello();
                tracing::info!(
                    session,
                    packs = hello.packs.len(),
                    journal_id = %hello.journal_id,
                    session_gen = hello.session_gen,
                    feedback_first_seq = hello.feedback_first_seq,
                    feedback_last_seq = hello.feedback_last_seq,
                    "controller link: connected, hello sent"
                );
                up.queue(session, ToLink::Hello(Box::new(hello)));
                self.held_changed = false;
            }
            FromLink::Welcome {
                session,
                acked_seq,
                session_gen,
                ..
            } => {
                if up.session != Some(session) {
                    return Ok(());
                }
                // Journalled (when it raises the fence) before anything
                // else of this session is looked at.
                match up.fence.welcome(&mut self.journal, session, session_gen)? {
                    Welcomed::Refused(stale) => {
                        // Not contact: a stale controller cannot cancel
                        // anything either, so leases keep running.
                        up.stale.welcomes += 1;
                        tracing::error!(session, "{stale}");
                        up.queue(session, ToLink::Refuse(stale.to_string()));
                        return Ok(());
                    }
                    Welcomed::Accepted {
                        generation,
                        raised: true,
                    } => tracing::info!(
                        session,
                        session_gen = generation,
                        "controller link: a new session generation, journalled"
                    ),
                    Welcomed::Accepted { .. } => {}
                }
                up.lease.contact(now);
                let acked_seq = self.known_seq(acked_seq);
                self.ack(acked_seq)?;
                let front = self
                    .journal
                    .outbox_range()
                    .map_or(acked_seq.saturating_add(1), |(f, _)| f);
                up.window.open(front, acked_seq);
                up.welcomed = true;
                up.queue(session, ToLink::ClockReport(self.clock_report()));
                up.next_clock_report = now + CLOCK_REPORT_EVERY;
            }
            FromLink::Push {
                session,
                pack,
                yaml,
                session_gen,
                stage,
            } => {
                if let Err(stale) = up.fence.check(&self.journal, session, session_gen) {
                    // Not contact, not parsed, nothing journalled.
                    up.stale.pushes += 1;
                    let label = format!("{}/{} v{}", pack.tenant, pack.pack, pack.version);
                    tracing::error!(session, pack = %label, "pushed pack refused: {stale}");
                    if up.session == Some(session) {
                        let message = format!("pack {label}: {stale}");
                        up.queue(
                            session,
                            nack(&pack, wire::NackReason::Stale, message, Vec::new()),
                        );
                    }
                    return Ok(());
                }
                up.lease.contact(now);
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
                if up.session == Some(session) {
                    up.queue(session, reply);
                }
                if let Some(e) = fault {
                    return Err(e);
                }
            }
            FromLink::Cancel {
                session,
                pack,
                session_gen,
            } => {
                if let Err(stale) = up.fence.check(&self.journal, session, session_gen) {
                    up.stale.cancels += 1;
                    let label = format!("{}/{} v{}", pack.tenant, pack.pack, pack.version);
                    tracing::error!(session, pack = %label, "controller cancel ignored: {stale}");
                    return Ok(());
                }
                up.lease.contact(now);
                let key = PackKey {
                    tenant: pack.tenant.clone(),
                    pack: pack.pack.clone(),
                };
                self.drop_staged(up, &key);
                self.on_cancel(pack)?;
                // Held again even when nothing changed: it is how the
                // controller learns that the cancel took effect.
                self.held_changed = true;
            }
            FromLink::FeedbackAck { session, seq } => {
                // A refused (or not yet welcomed) controller's store is not
                // where feedback must land: its acks drop nothing.
                if !up.fence.accepted(session) {
                    tracing::warn!(
                        session,
                        acked = seq,
                        "controller link: feedback ack from a session not accepted, ignored"
                    );
                    return Ok(());
                }
                up.lease.contact(now);
                // An entry leaves the journal only once acknowledged.
                let seq = self.known_seq(seq);
                self.ack(seq)?;
                if up.session == Some(session) {
                    up.window.acked(seq);
                }
            }
            FromLink::Alive { session } => {
                if up.fence.accepted(session) {
                    up.lease.contact(now);
                }
            }
            FromLink::Disconnected { session, reason } => {
                up.fence.ended(session);
                if up.session == Some(session) {
                    up.session = None;
                    up.welcomed = false;
                    up.window.close();
                    up.pending.clear();
                    tracing::info!(session, "controller link: disconnected ({reason})");
                }
            }
        }
        Ok(())
    }

    /// The controller has feedback up to `seq`: it leaves the journal, and
    /// a drop count the acknowledged front carried is never sent again.
    fn ack(&mut self, seq: u64) -> Result<(), JournalError> {
        let before = self.journal.dropped();
        self.journal.ack_feedback(seq)?;
        let reported = before.saturating_sub(self.journal.dropped());
        if reported > 0 {
            tracing::info!(
                dropped = reported,
                acked = seq,
                "controller link: outbox drops acknowledged by the controller"
            );
        }
        Ok(())
    }

    /// An acknowledged seq, at most the last this journal handed out: an
    /// ack beyond it (a confused controller) must not swallow feedback
    /// that does not exist yet.
    fn known_seq(&self, seq: u64) -> u64 {
        let last = self.journal.next_seq().saturating_sub(1);
        if seq > last {
            tracing::warn!(
                acked = seq,
                last,
                journal_id = %self.journal.id(),
                "the controller acknowledged feedback this journal never wrote; taken as up to the last written"
            );
        }
        seq.min(last)
    }

    /// The Hello of a new session.
    fn hello(&self) -> wire::Hello {
        let (first, last) = self.journal.outbox_range().unwrap_or((0, 0));
        wire::Hello {
            agent_id: self.cfg.id.clone(),
            labels: self
                .cfg
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            capabilities: CAPABILITIES.iter().map(|c| (*c).to_string()).collect(),
            packs: self.held_list(),
            journal_id: self.journal.id().to_string(),
            feedback_first_seq: first,
            feedback_last_seq: last,
            max_packs: u32::try_from(self.cfg.max_packs).unwrap_or(u32::MAX),
            session_gen: self.journal.session_gen(),
        }
    }

    /// Every held pack, its version, and whether it is stopped in its safe
    /// state; in (tenant, pack) order.
    fn held_list(&self) -> Vec<wire::HeldPack> {
        let mut keys: Vec<&PackKey> = self.held.keys().collect();
        keys.sort();
        keys.into_iter()
            .filter_map(|k| {
                let (version, active) = self.core.held(k)?;
                Some(wire::HeldPack {
                    pack: Some(wire::PackRef {
                        tenant: k.tenant.clone(),
                        pack: k.pack.clone(),
                        version,
                    }),
                    stopped: !active,
                })
            })
            .collect()
    }

    /// The clock's estimate as the controller shows it. `offset_ns` is
    /// reference time minus this box's system clock (`CLOCK_REALTIME`): what
    /// an operator compares across agents; zero where the system clock is
    /// the source.
    fn clock_report(&self) -> wire::ClockReport {
        // The outbox's extent: what the controller has not acknowledged.
        let outbox_entries = Some(match self.journal.outbox_range() {
            Some((first, last)) if last >= first => last - first + 1,
            _ => 0,
        });
        let Some(e) = self.clock.status() else {
            return wire::ClockReport {
                source: wire::ClockSource::System as i32,
                state: wire::ClockState::Locked as i32,
                offset_ns: 0,
                jitter_ns: 0,
                uncertainty_ns: self.clock.uncertainty_ns(),
                frequency_ppm: 0.0,
                at_ns: self.clock.now().as_nanos(),
                outbox_entries,
            };
        };
        let (_, system_offset, _) = baton_clock::system::read_offset();
        wire::ClockReport {
            source: baton_proto::feedback::ClockSource::from(e.source).code(),
            state: baton_proto::feedback::ClockState::from(e.state).code(),
            offset_ns: e.target_ns.saturating_sub(system_offset),
            jitter_ns: e.jitter_ns,
            uncertainty_ns: e.uncertainty_ns,
            frequency_ppm: e.frequency_ppm,
            at_ns: self.clock.now().as_nanos(),
            outbox_entries,
        }
    }

    /// A staged push: parsed and checked like any push, then kept aside
    /// ([`stage`]).
    fn stage_push(
        &mut self,
        up: &mut Uplink,
        r: &wire::PackRef,
        yaml: String,
        stage: crate::link::StageAt,
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
    fn on_push(&mut self, r: &wire::PackRef, yaml: String) -> (ToLink, Option<anyhow::Error>) {
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
        self.heap_trim.parsed();
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
        if !self.held.contains_key(&key) && self.held.len() >= self.cfg.max_packs {
            let message = format!(
                "this agent holds {} packs, its limit (max-packs): retry once one is cancelled",
                self.held.len()
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
    ) -> (ToLink, Option<anyhow::Error>) {
        use wire::NackReason as R;
        let label = format!("{}/{} v{}", r.tenant, r.pack, r.version);
        let result = self.accept(yaml, pack);
        match result {
            Ok(verdict) => {
                let unchanged = verdict == Verdict::Unchanged;
                if unchanged {
                    tracing::info!(pack = %label, "pushed again with the same content: unchanged");
                } else {
                    self.held_changed = true;
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
                let fault = e.is_fault().then(|| anyhow::Error::from(e));
                (nack(r, reason, message, errors), fault)
            }
        }
    }

    /// A pack withdrawn by the controller: its safe state, then it is
    /// removed (as `baton-agent cancel`). Not held: nothing to do.
    fn on_cancel(&mut self, r: wire::PackRef) -> anyhow::Result<()> {
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
            // A journal failure is the loop's fault, as everywhere.
            Err(e) if e.downcast_ref::<JournalError>().is_some() => Err(e),
            Err(e) => {
                tracing::error!(pack = %key, "controller cancel: {e:#}");
                Ok(())
            }
        }
    }

    /// Packs whose lease ran out: their safe state (that pack only).
    fn check_leases(&mut self, up: &Uplink) -> anyhow::Result<()> {
        let now = self.mono_now();
        let expired: Vec<(PackKey, Duration)> = self
            .held
            .iter()
            .filter_map(|(k, h)| {
                let lease = h.lease?;
                let p = Leased {
                    lease,
                    since: h.since,
                };
                up.lease.expired(&p, now).then(|| (k.clone(), lease))
            })
            .filter(|(k, _)| self.core.held(k).is_some_and(|(_, active)| active))
            .collect();
        for (key, lease) in expired {
            let mut out = Vec::new();
            if self
                .core
                .lease_lost_pack(&key, self.clock.now())
                .drain_into(&mut out)
            {
                tracing::warn!(
                    pack = %key,
                    "no contact with the controller for its lease ({}): safe state driven; a higher version brings the pack back",
                    baton_proto::time::format_duration(lease)
                );
                self.process(out)?;
            }
        }
        Ok(())
    }

    /// Feedback pages to the link, as the window allows (bounded per step).
    fn send_feedback(&mut self, up: &mut Uplink) -> anyhow::Result<()> {
        let Some(session) = up.session else {
            return Ok(());
        };
        for _ in 0..PAGES_PER_STEP {
            if !up.pending.is_empty() {
                // The link is not keeping up: no more reading from disk.
                break;
            }
            let Some((front, back)) = self.journal.outbox_range() else {
                break;
            };
            let Some((from, n)) = up.window.next_page(Some(front)) else {
                break;
            };
            if from > back {
                break;
            }
            let page = self
                .journal
                .outbox_page(from, usize::try_from(n).unwrap_or(usize::MAX))?;
            let Some(&(last, _)) = page.last() else {
                break;
            };
            // Drops not yet reported ride on one entry (see `carry_drops`):
            // this page's first, or the one that carried them before.
            self.journal.carry_drops(from)?;
            let carried = page.iter().find_map(|(seq, _)| {
                let n = self.journal.dropped_before(*seq);
                (n > 0).then_some((*seq, n))
            });
            if let Some((seq, dropped)) = carried {
                tracing::warn!(
                    seq,
                    dropped,
                    "controller link: feedback entries dropped at the outbox cap (outbox-cap); the controller is told on this entry"
                );
            }
            up.window.sent_through(last);
            up.queue(
                session,
                ToLink::Feedback(FeedbackPage {
                    records: page,
                    carried,
                }),
            );
            up.flush();
        }
        Ok(())
    }
}
