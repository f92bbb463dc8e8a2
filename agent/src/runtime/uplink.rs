//! The control thread's side of the controller link (`crate::link`):
//! hello, pushes, cancels, feedback, clock reports and pack leases. Called
//! from [`Agent::step`] with bounded work per call; nothing here blocks or
//! awaits (the link thread does the IO).
//!
//! The session's rules (fencing, the feedback window, leases, when the
//! clock is reported) are a value of their own, sans IO:
//! [`baton_control::Session`] takes each link event with the journal's
//! facts and returns commands; this module carries them out (journal,
//! link, core) in order, the first failing one ending the loop.
//!
//! # A session
//!
//! `Connected` → Hello (agent id, labels, version, capabilities, the held
//! packs with their `stopped` flags, the journal id, the outbox's first and
//! last seq, `max-packs`). `Welcome` → the outbox is acknowledged up to the
//! controller's `feedback_acked_seq`, the send window opens at the outbox
//! front, a clock report goes out. From then on feedback flows in seq
//! order, [`PAGE`] records per batch, at most [`MAX_IN_FLIGHT`]
//! unacknowledged; an entry leaves the journal only when a `FeedbackAck`
//! covers it. Every reconnect starts again at
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
//! cancel is logged and counted). See [`baton_control::session::fence`].
//!
//! # Leases
//!
//! A pack with `lease: L` whose `L` has passed without contact with the
//! controller enters its safe state (`lease_lost`, reported in feedback
//! like every safe state) — that pack only. It is journalled stopped, so
//! it stays stopped across restarts; **a higher version of the pack brings
//! it back** (a re-push of the same version is `unchanged` and leaves it
//! stopped). See [`baton_control::session::lease`] for what counts as
//! contact. Only an agent with a controller configured enforces leases.
//!
//! [`PAGE`]: baton_control::session::window::PAGE
//! [`MAX_IN_FLIGHT`]: baton_control::session::window::MAX_IN_FLIGHT

mod push;
mod stage;

use std::collections::VecDeque;
use std::time::Duration;

use baton_journal::JournalError;
use baton_proto::RefTime;
use baton_proto::wire;
use baton_sched::PackKey;

use super::agent::Agent;
use super::error::RuntimeError;
use super::link_state::{StagedPacks, Uplink};
use super::trust::TrustStatus;
use crate::link::{FeedbackPage, FromLink, Link, LinkConfig, ToLink};
use baton_clock::MonoTime;
use baton_control::session::{Cmd, Facts, Input, Order, Session};

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
/// How long the way out waits for the link thread.
const LINK_STOP_WAIT: Duration = Duration::from_secs(1);
/// Retry interval while the link's channel is full.
const RETRY_FULL: Duration = Duration::from_millis(5);

/// What a push or cancel carries, held while the session decides whether
/// it may be acted on.
enum OrderBody {
    Push {
        pack: wire::PackRef,
        yaml: String,
        stage: Option<crate::link::StageAt>,
    },
    Cancel {
        pack: wire::PackRef,
    },
}

impl OrderBody {
    fn label(&self) -> String {
        let (Self::Push { pack, .. } | Self::Cancel { pack }) = self;
        format!("{}/{} v{}", pack.tenant, pack.pack, pack.version)
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

impl Agent {
    /// Start the link thread if a controller is configured.
    pub(super) fn start_uplink(&mut self) -> Result<(), RuntimeError> {
        if self.cfg.controllers.is_empty() {
            return Ok(());
        }
        let mut link_cfg = LinkConfig::new(self.cfg.controllers.clone(), self.cfg.id.clone());
        link_cfg.time_exchange = self.cfg.clock.link;
        link_cfg.tls = self.cfg.tls.clone();
        let link = Link::start(link_cfg, self.clock.clone(), std::thread::current())
            .map_err(RuntimeError::LinkStart)?;
        let now = self.mono_now();
        self.plane.uplink = Some(Uplink {
            link,
            session: Session::new(now),
            pending: VecDeque::new(),
            backlog: false,
            closed: false,
            staged: StagedPacks::default(),
            trust_told: None,
        });
        Ok(())
    }

    /// For `/metrics`: whether the session is established (welcomed), the
    /// messages waiting for the link, and the refusals of stale
    /// controllers; `None` without a controller.
    pub(super) fn link_metrics(&self) -> Option<(bool, usize, crate::metrics::StaleSnap)> {
        let up = self.plane.uplink.as_ref()?;
        Some((
            up.session.welcomed() && !up.closed,
            up.pending.len(),
            up.session.stale(),
        ))
    }

    /// Stop the link thread (the way out), waiting at most a second.
    pub(super) fn stop_uplink(&mut self) {
        if let Some(up) = &mut self.plane.uplink
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
    pub(super) fn uplink_step(&mut self) -> Result<(), RuntimeError> {
        let Some(mut up) = self.plane.uplink.take() else {
            return Ok(());
        };
        let r = self.uplink_pass(&mut up);
        up.flush();
        self.plane.uplink = Some(up);
        r
    }

    fn uplink_pass(&mut self, up: &mut Uplink) -> Result<(), RuntimeError> {
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
        self.update_step(up);
        if let Some(session) = up.session.current()
            && self.plane.held.take_changed()
        {
            up.queue(session, ToLink::Held(self.held_list()));
        }
        let now = self.mono_now();
        let clock_now = self.clock.status().map(|e| (e.source, e.state));
        if let Some(Cmd::ClockReport { session }) = up.session.clock_report_due(now, clock_now) {
            up.queue(session, ToLink::ClockReport(self.clock_report()));
            // At the clock's pace: a list that expired meanwhile is said.
            self.tell_trust(up);
        }
        up.flush();
        self.send_feedback(up)
    }

    /// The earliest instant the link side has work (for the loop's sleep).
    pub(super) fn uplink_wake(&self, now: RefTime) -> Option<RefTime> {
        let up = self.plane.uplink.as_ref()?;
        if up.backlog {
            return Some(now);
        }
        if !up.pending.is_empty() {
            return Some(now + RETRY_FULL);
        }
        let back = self.journal.outbox_range().map(|(_, b)| b);
        if up
            .session
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
        let leases = self
            .plane
            .held
            .next_lease_expiry(&up.session, |k| self.running(k));
        let at = [
            up.session.next_wake(),
            leases,
            self.update_wake(up.session.current()),
        ]
        .into_iter()
        .flatten()
        .min();
        at.map(|m| self.clock.to_ref(m))
    }

    fn on_link(&mut self, up: &mut Uplink, ev: FromLink) -> Result<(), RuntimeError> {
        let now = self.mono_now();
        let mut body = None;
        let mut reason = String::new();
        let input = match ev {
            FromLink::Connected { session } => Input::Connected { session },
            FromLink::Welcome {
                session,
                acked_seq,
                session_gen,
                ..
            } => Input::Welcome {
                session,
                acked_seq,
                generation: session_gen,
            },
            FromLink::Push {
                session,
                pack,
                yaml,
                session_gen,
                stage,
            } => {
                body = Some(OrderBody::Push { pack, yaml, stage });
                Input::Order {
                    session,
                    generation: session_gen,
                    order: Order::Push,
                }
            }
            FromLink::Cancel {
                session,
                pack,
                session_gen,
            } => {
                body = Some(OrderBody::Cancel { pack });
                Input::Order {
                    session,
                    generation: session_gen,
                    order: Order::Cancel,
                }
            }
            FromLink::FeedbackAck { session, seq } => Input::FeedbackAck { session, seq },
            FromLink::TrustLists { chain, .. } => {
                // Not the session's business: a list is taken for its root
                // signature, whoever relays it.
                let now_ns = self.clock.now().as_nanos();
                let taken = match &mut self.plane.trust {
                    Some(t) => t.offer(&chain, now_ns),
                    None => false,
                };
                if taken {
                    self.stop_no_longer_allowed(up, now_ns)?;
                }
                self.tell_trust(up);
                return Ok(());
            }
            FromLink::ReleaseOffer { session, offer } => {
                // Not the session's business either: taken for its
                // release key's signature, whoever relays it.
                self.upkeep.rolled_back = None;
                self.on_release_offer(up, session, offer);
                return Ok(());
            }
            FromLink::ReleaseChunk { session, chunk } => {
                self.on_release_chunk(session, chunk);
                return Ok(());
            }
            FromLink::ReleaseWithdraw { session, version } => {
                self.on_release_withdraw(up, session, &version);
                return Ok(());
            }
            FromLink::Alive { session } => Input::Alive { session },
            FromLink::Disconnected { session, reason: r } => {
                reason = r;
                Input::Disconnected { session }
            }
        };
        let facts = self.session_facts();
        for cmd in up.session.handle(now, input, facts) {
            self.carry_out(up, cmd, &mut body, &reason)?;
        }
        if self.upkeep.trial.is_some() && up.session.welcomed() {
            self.confirm_trial();
        }
        Ok(())
    }

    /// What the journal holds, as the session's rules read it.
    fn session_facts(&self) -> Facts {
        Facts {
            highest_gen: self.journal.session_gen(),
            last_seq: self.journal.next_seq().saturating_sub(1),
            outbox_front: self.journal.outbox_range().map(|(front, _)| front),
        }
    }

    /// One command of the session's rules (see [`Cmd`]); an error ends the
    /// loop, so nothing after it runs.
    fn carry_out(
        &mut self,
        up: &mut Uplink,
        cmd: Cmd,
        body: &mut Option<OrderBody>,
        reason: &str,
    ) -> Result<(), RuntimeError> {
        match cmd {
            Cmd::Discard {
                keep: Some(session),
            } => up.pending.retain(|o| o.session == session),
            Cmd::Discard { keep: None } => up.pending.clear(),
            Cmd::Hello { session } => {
                let trust = self.trust_status();
                let mut hello = self.hello();
                hello.trust = Some(wire_trust(trust.as_ref()));
                hello.update = self.hello_update();
                up.trust_told = Some(trust.unwrap_or_default());
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
                self.plane.held.told();
            }
            Cmd::JournalGeneration {
                session,
                generation,
            } => {
                // Durable before anything else of this session is
                // looked at.
                self.journal.record_session_gen(generation)?;
                tracing::info!(
                    session,
                    session_gen = generation,
                    "controller link: a new session generation, journalled"
                );
                // Only now is the session accepted.
                let (now, facts) = (self.mono_now(), self.session_facts());
                let journalled = Input::Journalled {
                    session,
                    generation,
                };
                for cmd in up.session.handle(now, journalled, facts) {
                    self.carry_out(up, cmd, body, reason)?;
                }
            }
            Cmd::Refuse { session, stale } => {
                tracing::error!(session, "{stale}");
                up.queue(session, ToLink::Refuse(stale.to_string()));
            }
            Cmd::AckFeedback { seq, claimed } => {
                if let Some(claimed) = claimed {
                    tracing::warn!(
                        acked = claimed,
                        last = seq,
                        journal_id = %self.journal.id(),
                        "the controller acknowledged feedback this journal never wrote; taken as up to the last written"
                    );
                }
                // An entry leaves the journal only once acknowledged.
                self.ack(seq)?;
            }
            Cmd::ClockReport { session } => {
                up.queue(session, ToLink::ClockReport(self.clock_report()));
            }
            Cmd::IgnoreAck { session, seq } => tracing::warn!(
                session,
                acked = seq,
                "controller link: feedback ack from a session not accepted, ignored"
            ),
            Cmd::Ended { session } => {
                tracing::info!(session, "controller link: disconnected ({reason})");
            }
            Cmd::Act { reply_on, .. } => match body.take() {
                Some(OrderBody::Push { pack, yaml, stage }) => {
                    self.act_on_push(up, reply_on, pack, yaml, stage)?;
                }
                Some(OrderBody::Cancel { pack }) => self.act_on_cancel(up, pack)?,
                None => {}
            },
            Cmd::RefuseOrder {
                stale, reply_on, ..
            } => match body.take() {
                Some(b @ OrderBody::Push { .. }) => {
                    let label = b.label();
                    tracing::error!(pack = %label, "pushed pack refused: {stale}");
                    if let (Some(session), OrderBody::Push { pack, .. }) = (reply_on, b) {
                        let message = format!("pack {label}: {stale}");
                        up.queue(
                            session,
                            nack(&pack, wire::NackReason::Stale, message, Vec::new()),
                        );
                    }
                }
                Some(b @ OrderBody::Cancel { .. }) => {
                    tracing::error!(pack = %b.label(), "controller cancel ignored: {stale}");
                }
                None => {}
            },
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

    /// A newer list taken: each running pack it no longer allows (its
    /// signer's key revoked, its tenant now requiring signatures or no
    /// longer named) is withdrawn as a cancel withdraws it, at once: its
    /// safe state driven, removed from the journal, the controller told
    /// by the next Held (and a push of it again refused, with why).
    fn stop_no_longer_allowed(&mut self, up: &mut Uplink, now_ns: i64) -> Result<(), RuntimeError> {
        let Some(t) = &self.plane.trust else {
            return Ok(());
        };
        for (key, why) in t.no_longer_allowed(now_ns) {
            if self.core.held(&key).is_none() {
                continue;
            }
            // A copy kept aside for a switch goes too (it is checked again
            // at its instant, but must not stay armed meanwhile).
            self.drop_staged(up, &key);
            tracing::error!(
                pack = %key,
                "trust: the trust list taken no longer allows this pack ({why}): withdrawn, its safe state driven"
            );
            // Removed from the held set, which owes the controller a Held.
            match self.cancel_local(&key) {
                Ok(_) | Err(RuntimeError::NotHeld(_)) => {}
                // Half-way through: the loop's fault, and the way out
                // drives every safe state.
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The box's trust now (`None`: no root installed, nothing checked).
    fn trust_status(&self) -> Option<TrustStatus> {
        let t = self.plane.trust.as_ref()?;
        Some(t.status(self.clock.now().as_nanos()))
    }

    /// Tells the session the box's trust when it changed since it was
    /// last told (its Hello included).
    fn tell_trust(&self, up: &mut Uplink) {
        let Some(session) = up.session.current() else {
            return;
        };
        let Some(now) = self.trust_status() else {
            return;
        };
        if up.trust_told.as_ref() == Some(&now) {
            return;
        }
        up.queue(session, ToLink::TrustState(wire_trust(Some(&now))));
        up.trust_told = Some(now);
    }

    /// The Hello of a new session (its trust filled in by the caller).
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
            agent_version: crate::version::version().to_string(),
            capabilities: CAPABILITIES.iter().map(|c| (*c).to_string()).collect(),
            packs: self.held_list(),
            journal_id: self.journal.id().to_string(),
            feedback_first_seq: first,
            feedback_last_seq: last,
            max_packs: u32::try_from(self.cfg.max_packs).unwrap_or(u32::MAX),
            session_gen: self.journal.session_gen(),
            trust: None,
            update: None,
            arch: std::env::consts::ARCH.to_string(),
        }
    }

    /// Every held pack, its version, and whether it is stopped in its safe
    /// state; in (tenant, pack) order.
    fn held_list(&self) -> Vec<wire::HeldPack> {
        let mut keys: Vec<&PackKey> = self.plane.held.keys().collect();
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

    /// Packs whose lease ran out: their safe state (that pack only).
    fn check_leases(&mut self, up: &Uplink) -> Result<(), RuntimeError> {
        let now = self.mono_now();
        let expired = self
            .plane
            .held
            .leases_out(&up.session, now, |k| self.running(k));
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
    fn send_feedback(&mut self, up: &mut Uplink) -> Result<(), RuntimeError> {
        let Some(session) = up.session.current() else {
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
            let Some((from, n)) = up.session.next_page(Some(front)) else {
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
            up.session.sent_through(last);
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

/// The box's trust as the link says it (`None`: no root installed).
fn wire_trust(t: Option<&TrustStatus>) -> wire::TrustState {
    let Some(t) = t else {
        return wire::TrustState::default();
    };
    wire::TrustState {
        root: true,
        list_version: t.list_version,
        list_expires_ns: t.list_expires_ns,
        signed_tenants: t.signed_tenants.clone(),
        nothing_runs: t.nothing_runs.clone().unwrap_or_default(),
        refused: t.refused.clone().unwrap_or_default(),
    }
}
