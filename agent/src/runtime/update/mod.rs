//! Agent updates on the control thread (issue 39): a release the
//! controller offers is checked against the box's trust list (a release
//! key of its newest list, this box's architecture), downloaded a piece at
//! a time at the configured rate (`baton_update::fetch`) by the update
//! worker ([`worker`]), installed beside the running version and put on
//! trial; the loop then ends at a quiet moment (no firing due within
//! `update.quiet-margin`, nothing armed, no version staged for a switch)
//! through its one way out, and the binary's `main` hands over to the
//! launcher, which starts the new version once ([`trial`]).
//!
//! The controller only relays: an offer is taken for its signature, and
//! each piece for the signed digest the whole must match. What the box
//! does with an offer is said back (`UpdateState`) on the stream it came
//! on; a box that was rolled back says so in each Hello until the next
//! offer.

pub(super) mod state;
mod trial;
mod worker;

use baton_clock::MonoTime;
use baton_proto::wire;
use baton_proto::wire::update_state::Phase;
use baton_trust::{KeyId, ReleaseManifest, Signature, SignedRelease};
use baton_update::{Fetch, Versions};

use super::agent::Agent;
use super::link_state::Uplink;
use crate::link::ToLink;
use state::Offer;
use worker::{Done, Job, Worker};

/// How often a download's progress is said, at most.
const PROGRESS_EVERY_NS: i64 = 5_000_000_000;

/// The longest manifest read: a few fields (a controller's garbage is
/// refused before it is parsed).
const MANIFEST_MAX: usize = 4096;

fn state(version: &str, phase: Phase) -> wire::UpdateState {
    wire::UpdateState {
        version: version.to_string(),
        phase: phase as i32,
        ..wire::UpdateState::default()
    }
}

fn refused(version: &str, why: impl Into<String>) -> wire::UpdateState {
    wire::UpdateState {
        reason: why.into(),
        ..state(version, Phase::Refused)
    }
}

/// The offer as baton-trust reads it.
fn signed_release(o: &wire::ReleaseOffer) -> Result<SignedRelease, String> {
    let key = KeyId::from_hex(&o.key)
        .ok_or_else(|| format!("release key id {:?}: 16 hex digits", o.key))?;
    let signature = Signature::from_base64(&o.signature).map_err(|e| format!("release {e}"))?;
    Ok(SignedRelease {
        body: o.manifest.clone(),
        key,
        signature,
    })
}

/// The version an offer names, for a refusal of an offer that is not
/// read (empty when it names none).
fn named_version(o: &wire::ReleaseOffer) -> String {
    serde_json::from_str::<serde_json::Value>(&o.manifest)
        .ok()
        .and_then(|v| v.get("version")?.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl Agent {
    /// A release offered on `session`.
    pub(super) fn on_release_offer(
        &mut self,
        up: &mut Uplink,
        session: u64,
        offer: wire::ReleaseOffer,
    ) {
        match self.take_offer(session, &offer) {
            Ok(Some(said)) | Err(said) => {
                if said.phase == Phase::Refused as i32 {
                    tracing::warn!(version = %said.version, "agent update: release refused: {}", said.reason);
                }
                up.queue(session, ToLink::UpdateState(said));
            }
            Ok(None) => {}
        }
    }

    /// What the box does with an offer: `Ok(None)` a download begun (its
    /// progress said as the worker answers), else what to say.
    fn take_offer(
        &mut self,
        session: u64,
        offer: &wire::ReleaseOffer,
    ) -> Result<Option<wire::UpdateState>, wire::UpdateState> {
        if offer.manifest.len() > MANIFEST_MAX {
            return Err(refused(
                "",
                format!(
                    "a release manifest of {} bytes; at most {MANIFEST_MAX}",
                    offer.manifest.len()
                ),
            ));
        }
        let named = named_version(offer);
        let signed = signed_release(offer).map_err(|e| refused(&named, e))?;
        let now_ns = self.clock.now().as_nanos();
        let manifest = match &self.plane.trust {
            Some(t) => t.check_release(&signed, now_ns, std::env::consts::ARCH),
            None => Err("this box has no trust directory (trust-dir): it takes no release".into()),
        }
        .map_err(|e| refused(&named, e))?;
        let version = manifest.version.clone();
        if version == crate::version::version() {
            return Ok(Some(state(&version, Phase::Running)));
        }
        if self.upkeep.trial.is_some() {
            return Err(refused(
                &version,
                "this agent is itself a version on trial until a controller welcomes it; offer again after",
            ));
        }
        let u = &mut self.plane.update;
        if u.given_up.contains(&version) {
            return Err(refused(
                &version,
                format!(
                    "version {version} was rolled back on this box and is not run here again; a fixed build comes under a new version"
                ),
            ));
        }
        if u.installed.as_deref() == Some(&version) {
            return Ok(Some(state(&version, Phase::Installed)));
        }
        if u.installed.is_some() {
            return Err(refused(
                &version,
                format!(
                    "version {} is installed and waits for a quiet moment to restart into; offer again after it runs",
                    u.installed.as_deref().unwrap_or_default()
                ),
            ));
        }
        if let Some(o) = &mut u.offer
            && o.version == version
        {
            // The same release again (a new stream, a controller's
            // resend): go on from what is held, on this stream.
            o.session = session;
            if let Some(f) = &mut o.fetch {
                f.new_stream();
                return Ok(Some(downloading(&version, f.held(), o.size)));
            }
            return Ok(None);
        }
        self.begin_download(session, signed, manifest)
            .map(|()| None)
    }

    fn begin_download(
        &mut self,
        session: u64,
        signed: SignedRelease,
        manifest: ReleaseManifest,
    ) -> Result<(), wire::UpdateState> {
        let version = manifest.version.clone();
        let size = manifest.size;
        let job = Job::Begin {
            signed: Box::new(signed),
            manifest,
        };
        if !self.ask_worker(job) {
            return Err(refused(
                &version,
                "the update worker is busy or could not start; offer again",
            ));
        }
        tracing::info!(version = %version, size, "agent update: release offered and its signature checked; downloading");
        self.plane.update.offer = Some(Offer {
            version,
            size,
            session,
            fetch: None,
            said_at: None,
        });
        Ok(())
    }

    /// Hands `job` to the update worker, started at the first job;
    /// `false` when it has no room or could not start (said).
    fn ask_worker(&mut self, job: Job) -> bool {
        let u = &mut self.plane.update;
        if u.worker.is_none() {
            let versions = Versions::of_data_dir(&self.cfg.data_dir);
            match Worker::start(versions, std::thread::current()) {
                Ok(w) => u.worker = Some(w),
                Err(e) => {
                    tracing::error!("agent update: starting the update worker: {e}");
                    return false;
                }
            }
        }
        u.worker.as_ref().is_some_and(|w| w.give(job))
    }

    /// A piece of the release being downloaded: only on the offer's
    /// stream, at most a piece's length (a controller cannot push more
    /// than the box asks at its pace).
    pub(super) fn on_release_chunk(&mut self, session: u64, chunk: wire::ReleaseChunk) {
        let u = &mut self.plane.update;
        let (Some(o), Some(w)) = (&u.offer, &u.worker) else {
            return;
        };
        if o.version != chunk.version
            || o.session != session
            || chunk.data.len() > baton_update::fetch::CHUNK as usize
        {
            return;
        }
        // No room: dropped, asked again after the fetch's patience.
        let _ = w.give(Job::Piece {
            version: chunk.version,
            offset: chunk.offset,
            data: chunk.data,
        });
    }

    /// Each pass of the link: the worker's answers, the request due.
    pub(super) fn update_step(&mut self, up: &mut Uplink) {
        let now = self.mono_now();
        while let Some(done) = self.plane.update.worker.as_ref().and_then(Worker::answer) {
            self.on_worker(up, done, now);
        }
        let Some(o) = &mut self.plane.update.offer else {
            return;
        };
        let Some(f) = o
            .fetch
            .as_mut()
            .filter(|_| up.session.current() == Some(o.session))
        else {
            return;
        };
        while let Some(r) = f.due(now.as_nanos().max(0) as u64) {
            up.queue(
                o.session,
                ToLink::ReleaseRequest(wire::ReleaseRequest {
                    version: o.version.clone(),
                    offset: r.offset,
                    length: r.len,
                }),
            );
        }
        if f.stalled() {
            let why = "no piece kept after asking again several times: the download is given up (offer again)";
            tracing::warn!(version = %o.version, "agent update: {why}");
            up.queue(o.session, ToLink::UpdateState(refused(&o.version, why)));
            self.plane.update.offer = None;
        }
    }

    fn on_worker(&mut self, up: &mut Uplink, done: Done, now: MonoTime) {
        let rate = self.cfg.update.download_rate;
        let margin = self.cfg.update.quiet_margin;
        let u = &mut self.plane.update;
        match done {
            Done::Held { version, held } => {
                let Some(o) = u.offer.as_mut().filter(|o| o.version == version) else {
                    return;
                };
                let now_ns = now.as_nanos().max(0) as u64;
                let f = o
                    .fetch
                    .get_or_insert_with(|| Fetch::new(o.size, held, rate, now_ns));
                f.kept(held);
                let due = o
                    .said_at
                    .is_none_or(|t| now.nanos_since(t) >= PROGRESS_EVERY_NS);
                if due {
                    o.said_at = Some(now);
                    up.queue(
                        o.session,
                        ToLink::UpdateState(downloading(&version, held, o.size)),
                    );
                }
            }
            Done::Installed { version } => {
                // Installed is on trial in the launcher's state: it is what
                // the box restarts into, even when another offer came
                // meanwhile (that one is refused: offered again once this
                // runs).
                let o = u.offer.take();
                tracing::info!(version = %version, "agent update: installed and checked; restarting into it at a quiet moment");
                u.installed = Some(version.clone());
                if let Some(o) = o {
                    let waits = wire::UpdateState {
                        reason: format!(
                            "restarts into it at the first moment with no firing due within {} and nothing armed (a pack firing more often keeps it waiting)",
                            baton_proto::time::format_duration(margin)
                        ),
                        ..state(&version, Phase::Installed)
                    };
                    up.queue(o.session, ToLink::UpdateState(waits));
                    if o.version != version {
                        let why = format!(
                            "version {version} was installed first and waits to run; offer again after it runs"
                        );
                        up.queue(o.session, ToLink::UpdateState(refused(&o.version, why)));
                    }
                }
            }
            Done::Confirmed { version, result } => self.trial_confirmed(&version, result),
            Done::Withdrawn { version, result } => {
                u.withdrawing = false;
                let why = match result {
                    Ok(_) => {
                        if u.installed.as_deref() == Some(version.as_str()) {
                            u.installed = None;
                        }
                        tracing::info!(version = %version, "agent update: withdrawn by the controller before it ran; this version runs on");
                        "withdrawn by the controller before it ran; the running version runs on"
                            .to_string()
                    }
                    Err(e) => {
                        // Not undone: it stays installed and runs at the
                        // quiet moment, as before the withdrawal.
                        tracing::warn!(version = %version, "agent update: withdrawal not written: {e}");
                        format!("withdrawal not written ({e}): it still restarts into it")
                    }
                };
                if let Some(session) = up.session.current() {
                    up.queue(session, ToLink::UpdateState(refused(&version, why)));
                }
            }
            Done::Failed { version, why } => {
                let Some(o) = u.offer.take_if(|o| o.version == version) else {
                    return;
                };
                tracing::warn!(version = %version, "agent update: not installed: {why}");
                up.queue(o.session, ToLink::UpdateState(refused(&version, why)));
            }
        }
    }

    /// When the next request may be due (for the loop's wake-up): only
    /// while the offer's stream is the current one (requests go nowhere
    /// else, so a wake-up for them would spin).
    pub(super) fn update_wake(&self, current: Option<u64>) -> Option<MonoTime> {
        let o = self.plane.update.offer.as_ref()?;
        if current != Some(o.session) {
            return None;
        }
        let f = o.fetch.as_ref()?;
        f.wake_at()
            .map(|ns| MonoTime::from_nanos(i64::try_from(ns).unwrap_or(i64::MAX)))
    }

    /// The controller no longer offers `version`: a download of it stops
    /// (what was kept stays for a later offer), and an install of it not
    /// yet run is undone by the worker (no restart into it meanwhile). A
    /// version this agent already runs is the trial's to decide, not this.
    pub(super) fn on_release_withdraw(&mut self, up: &mut Uplink, session: u64, version: &str) {
        let u = &mut self.plane.update;
        if u.offer.take_if(|o| o.version == version).is_some() {
            tracing::info!(version = %version, "agent update: download stopped, the release withdrawn by the controller");
            up.queue(
                session,
                ToLink::UpdateState(refused(
                    version,
                    "withdrawn by the controller during its download",
                )),
            );
        }
        if u.installed.as_deref() == Some(version) && !u.restarting && !u.withdrawing {
            let asked = u.worker.as_ref().is_some_and(|w| {
                w.give(Job::Withdraw {
                    version: version.to_string(),
                })
            });
            u.withdrawing = asked;
            if !asked {
                tracing::warn!(version = %version, "agent update: the withdrawal could not be handed to the worker; it still restarts into it");
            }
        }
    }

    /// The version to restart into now, if one is installed and the box is
    /// quiet: no firing, retry or timeout due within the quiet margin,
    /// nothing armed or running, no version staged for a switch.
    pub fn update_restart_due(&mut self) -> Option<String> {
        if self.plane.update.withdrawing {
            return None;
        }
        let version = self.plane.update.installed.clone()?;
        let now = self.clock.now();
        let margin = self.cfg.update.quiet_margin;
        let quiet_core = self.core.next_wake().is_none_or(|t| t.since(now) > margin);
        let staged = self
            .plane
            .uplink
            .as_ref()
            .is_some_and(|up| up.staged.next_switch().is_some());
        if !quiet_core || !self.firing.arming.idle() || staged {
            return None;
        }
        if !self.plane.update.restarting {
            self.plane.update.restarting = true;
            tracing::info!(version = %version, "agent update: a quiet moment; restarting into the new version (safe states first)");
            if let Some(up) = self.plane.uplink.as_mut()
                && let Some(session) = up.session.current()
            {
                up.queue(
                    session,
                    ToLink::UpdateState(state(&version, Phase::Restarting)),
                );
                up.flush();
            }
        }
        Some(version)
    }

    /// What a Hello says of updates: the last rollback, until an offer.
    pub(super) fn hello_update(&self) -> Option<wire::UpdateState> {
        let r = self.upkeep.rolled_back.as_ref()?;
        Some(wire::UpdateState {
            reason: crate::launch::rolled_back_line(r),
            ..state(&r.from, Phase::RolledBack)
        })
    }
}

fn downloading(version: &str, held: u64, size: u64) -> wire::UpdateState {
    wire::UpdateState {
        held_bytes: held,
        size,
        ..state(version, Phase::Downloading)
    }
}
