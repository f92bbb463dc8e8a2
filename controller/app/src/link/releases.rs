//! Agent updates on the link: the release an agent is to be offered
//! (read at its Welcome and whenever an update admits or withdraws it),
//! pieces of that release served as the box asks for them, and what the
//! box says of the update, stored. The controller only relays: the box
//! checks the signature, the digest and its architecture itself.

use std::sync::Arc;

use super::{Effect, End, Now, RELEASE_QUEUE, RELEASE_REQUESTS, Session, ToAgent, Wait};
use crate::link::pushes::Work;
use baton_model::{RELEASE_PIECE, ReleaseRow, UpdatePhase, UpdateRow};

impl Session {
    /// At the Welcome: what the box said of its last update made true
    /// (it runs the version it was updating to: the update is done), and
    /// the release it is to be offered read.
    pub(super) fn update_at_welcome(&mut self, now: Now) {
        if let Some(u) = &self.agent.update
            && u.version == self.agent.agent_version
            && u.phase != UpdatePhase::Running
        {
            let running = UpdateRow {
                phase: UpdatePhase::Running,
                reason: String::new(),
                held_bytes: u.size,
                at: now.wall,
                ..u.clone()
            };
            self.agent.update = Some(running.clone());
            self.work.push_back(Work::Update(running));
        }
        self.work.push_back(Work::Offer);
    }

    /// The release the store says the agent is to be offered: offered
    /// unless it runs it already or gave that version up (it would refuse
    /// it again: the rollback it said stays what operators see); offered
    /// again after a refusal (read at each resync), which may have been
    /// for now only.
    pub(super) fn offer(&mut self, release: Option<Arc<ReleaseRow>>) {
        self.withdraw_other(release.as_deref());
        let Some(r) = release else {
            self.offered = None;
            return;
        };
        let given_up = self
            .agent
            .update
            .as_ref()
            .is_some_and(|u| u.version == r.version && u.phase.gives_up());
        if r.version == self.agent.agent_version || given_up {
            self.offered = None;
            return;
        }
        if self.offered.as_ref().is_some_and(|o| **o == *r) {
            // Offered on this stream already: the box is at it.
            return;
        }
        tracing::info!(agent = %self.agent.id, version = %r.version, "release offered");
        self.offered = Some(r.clone());
        self.send(ToAgent::ReleaseOffer(r));
    }

    /// A release the box says it is downloading or has installed (not yet
    /// run) that it is no longer to be offered (its update aborted or
    /// superseded): withdrawn, once per stream, so the box neither goes on
    /// downloading it nor restarts into it.
    fn withdraw_other(&mut self, target: Option<&ReleaseRow>) {
        let Some(u) = &self.agent.update else {
            return;
        };
        let pending = matches!(u.phase, UpdatePhase::Downloading | UpdatePhase::Installed);
        let other = target.is_none_or(|t| t.version != u.version);
        if !pending || !other || self.withdrawn.as_deref() == Some(u.version.as_str()) {
            return;
        }
        let version = u.version.clone();
        tracing::info!(agent = %self.agent.id, version = %version, "release withdrawn from the agent");
        self.withdrawn = Some(version.clone());
        if self.offered.as_ref().is_some_and(|o| o.version == version) {
            self.offered = None;
        }
        self.send(ToAgent::ReleaseWithdraw(version));
    }

    /// The box asks for bytes of a release: served from the release
    /// offered on this stream only, a piece at a time, at the stream's
    /// pace (a request past it waits its turn, up to [`RELEASE_QUEUE`]).
    /// A request for anything else is a box that does not follow the
    /// protocol.
    pub(super) fn on_release_request(
        &mut self,
        now: Now,
        version: String,
        offset: u64,
        length: u32,
    ) {
        let Some(r) = self.offered.clone() else {
            // Withdrawn since (an abort): the box's download stalls and
            // it gives up; nothing more is served.
            return;
        };
        if r.version != version {
            // A request still in flight for the release offered before
            // (an update superseded): dropped and counted.
            self.release_requests.dropped += 1;
            return;
        }
        if offset >= r.size || length == 0 {
            self.end(End::Bad(format!(
                "asked for {length} bytes at {offset} of release {version}, which has {}",
                r.size
            )));
            return;
        }
        if !self.release_queue.is_empty() {
            self.wait_turn(now, version, offset, length);
            return;
        }
        match self.release_requests.bucket.take(now.mono) {
            Ok(()) => self.read_piece(&r, version, offset, length),
            Err(_) => self.wait_turn(now, version, offset, length),
        }
    }

    /// A request past the pace: queued for its turn, or dropped past
    /// [`RELEASE_QUEUE`].
    fn wait_turn(&mut self, now: Now, version: String, offset: u64, length: u32) {
        if self.release_queue.len() >= RELEASE_QUEUE {
            let agent = self.agent.id.clone();
            self.release_requests.dropped += 1;
            if self.release_requests.dropped == 1 {
                tracing::warn!(
                    agent,
                    "agent asks for more release pieces at once than an agent does: the excess is dropped"
                );
            }
            return;
        }
        self.release_queue.push_back((version, offset, length));
        self.schedule_release(now);
    }

    /// The next turn of a waiting request: one pace interval on.
    fn schedule_release(&mut self, now: Now) {
        if self.release_due.is_none() && !self.release_queue.is_empty() {
            let interval = std::time::Duration::from_secs_f64(1.0 / RELEASE_REQUESTS.rate);
            self.release_due = Some(now.mono + interval);
        }
    }

    /// The request at the head of the queue, if its turn came.
    pub(super) fn release_due(&mut self, now: Now) {
        if self.release_requests.bucket.take(now.mono).is_ok()
            && let Some((version, offset, length)) = self.release_queue.pop_front()
        {
            match self.offered.clone() {
                Some(r) if r.version == version => self.read_piece(&r, version, offset, length),
                // Withdrawn or superseded while it waited: only the
                // requests for what is offered now wait on.
                other => {
                    let now_offered = other.map(|r| r.version.clone());
                    self.release_queue
                        .retain(|(v, _, _)| now_offered.as_ref() == Some(v));
                }
            }
        }
        self.schedule_release(now);
    }

    fn read_piece(&mut self, r: &ReleaseRow, version: String, offset: u64, length: u32) {
        let index = offset / RELEASE_PIECE;
        self.effect(
            Effect::Piece {
                version: version.clone(),
                arch: r.arch.clone(),
                index,
            },
            Wait::Piece {
                version,
                offset,
                length,
            },
        );
    }

    /// A piece read: the bytes asked for within it (a request across two
    /// pieces is answered short; the box asks for the rest at once).
    pub(super) fn piece_read(
        &mut self,
        version: String,
        offset: u64,
        length: u32,
        piece: Option<Vec<u8>>,
    ) {
        let Some(piece) = piece else {
            tracing::error!(
                agent = %self.agent.id,
                version,
                offset,
                "store: a piece of a stored release is missing; not answered"
            );
            return;
        };
        let start = (offset % RELEASE_PIECE) as usize;
        let end = start.saturating_add(length as usize).min(piece.len());
        if start >= end {
            return;
        }
        self.send(ToAgent::ReleaseChunk {
            version,
            offset,
            data: piece[start..end].to_vec(),
        });
    }

    /// What the box says of an update: kept, and stored within the
    /// stream's rate (past it, the latest is held back and stored when
    /// the rate allows: the box says most steps once). A refusal of the
    /// release offered lets the next read offer it again.
    pub(super) fn on_update(&mut self, now: Now, row: UpdateRow) {
        self.agent.update = Some(row.clone());
        if row.phase == UpdatePhase::Refused
            && self
                .offered
                .as_ref()
                .is_some_and(|o| o.version == row.version)
        {
            self.offered = None;
        }
        let agent = self.agent.id.clone();
        if !self.update_reports.allow(&agent, now.mono) {
            self.update_held_back = Some(row);
            return;
        }
        self.update_held_back = None;
        if matches!(row.phase, UpdatePhase::Refused | UpdatePhase::RolledBack) {
            tracing::warn!(agent = %agent, version = %row.version, phase = row.phase.as_str(), reason = %row.reason, "agent update not taken");
        }
        let session = self.agent.session_gen;
        self.effect(Effect::Update { session, row }, Wait::Written);
    }
}
