//! The dispatch ledger: one slot per attempt armed ahead, in a shared
//! memory mapping that outlives the process.
//!
//! An attempt is *armed* when its start record is journalled and it is on
//! its way to the device (the control thread's backlog, the dispatcher's
//! queue, an exec firing waiting for its instant). From then on two threads
//! may decide its fate, and the slot is where they meet:
//!
//! - the thread that runs it *claims* it at its instant (`ARMED →
//!   EXECUTING`, one compare-and-swap) right before the device call, and
//!   marks it `OK` or `FAILED` right after;
//! - the control thread *withdraws* it (sets the `WITHDRAW` bit) when the
//!   core decided that it must not run (a newer version, a timeout, a
//!   safe state): if the slot was still `ARMED`, the claim can no longer
//!   succeed and the attempt provably never touches the device; if it was
//!   already claimed, it is too late and the attempt's own result stands.
//!
//! So the cancellation flag is per attempt, checked at its instant, and
//! the race between "run" and "withdraw" has exactly one winner, known to
//! both sides at once, without a lock or a system call.
//!
//! # Surviving `kill -9`
//!
//! The mapping is `MAP_SHARED` on a file (by default in `/dev/shm`, a
//! tmpfs: its pages are page cache that is never written back, so a store
//! never faults or waits on a disk). When the process dies, whatever was
//! stored is still in the file. On restart ([`Ledger::previous`]) every
//! attempt the journal says started but has no result is resolved from its
//! slot: claimed and finished → its outcome; never claimed → it did not
//! run; claimed, not finished (the process died inside the device call) →
//! still unknown. Each slot names its attempt by a 64-bit fingerprint of
//! the execution id, written before the start record is made durable.
//!
//! Slots are handed out and freed by the control thread only, and a slot
//! is freed only once its attempt's result is in the journal (written to
//! the kernel), so a slot read after a crash is the latest word on the
//! attempt that owns the fingerprint.
//!
//! # Power loss
//!
//! A power cut loses the page cache: the file is gone (tmpfs) or stale (a
//! disk file, whose contents may predate the last claims). The header
//! carries the kernel's boot id: a ledger from another boot is never
//! trusted, and the attempts it would have resolved stay `outcome
//! unknown` (README, "Guarantees").
//!
//! # Cost on the real-time path
//!
//! Two atomic read-modify-writes on a cache line of locked, already
//! faulted memory per attempt (claim, finish). No system call, no
//! allocation.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;

use baton_sys::shared::AtomicMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// First bytes of a ledger file.
const MAGIC: [u8; 8] = *b"BATONLG1";
/// The layout's version (bytes 8..12).
const VERSION: u32 = 2;
/// Header size; slots start here (cache-line aligned).
const HEADER: usize = 512;
/// Offset of the owner's data directory in the header (length u16, then
/// the path's bytes): a starting agent removes ledgers in its directory
/// whose owner is gone ([`Ledger::collect_orphans`]).
const OWNER_AT: usize = 64;
/// Longest owner path kept.
const OWNER_MAX: usize = HEADER - OWNER_AT - 2;
/// Bytes per slot: fingerprint (u64), state (u32), padding.
const SLOT: usize = 16;
/// Offset of the boot id in the header (36 ASCII bytes, padded to 40).
const BOOT_AT: usize = 16;
/// Offset of the journal id's fingerprint in the header.
const JOURNAL_AT: usize = 56;

/// Slots of the durable ledger (16 bytes each: 128 KiB).
pub const DEFAULT_SLOTS: u32 = 8192;

const FREE: u32 = 0;
const ARMED: u32 = 1;
const EXECUTING: u32 = 2;
const OK: u32 = 3;
const FAILED: u32 = 4;
const STATE: u32 = 0xff;
/// Set by [`Slot::withdraw`]; a claim needs the state to be exactly `ARMED`.
const WITHDRAW: u32 = 0x100;

/// What a slot says about its attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Never claimed: it did not touch the device (it may have been
    /// withdrawn, reached too late, or was still waiting).
    NotRun,
    /// Claimed and not finished: the process died inside the device call.
    Interrupted,
    /// Claimed and finished: the device call returned without an error.
    Succeeded,
    /// Claimed and finished: the device call failed.
    Failed,
}

/// The stable fingerprint of an execution id (FNV-1a, 64 bits; never 0).
pub fn fingerprint(id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

/// The kernel's boot id (a fresh UUID each boot), or empty if unknown.
fn boot_id() -> [u8; 40] {
    let mut out = [0u8; 40];
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let b = s.trim().as_bytes();
        let n = b.len().min(out.len());
        out[..n].copy_from_slice(&b[..n]);
    }
    out
}

/// The ledger (see the module docs).
#[derive(Debug)]
pub struct Ledger {
    map: AtomicMap,
    slots: u32,
    /// Where it lives; `None` for an anonymous one (tests, overflow).
    path: Option<PathBuf>,
}

/// What a ledger left by the previous run says, read before a new one
/// replaces it.
#[derive(Debug, Default)]
pub struct Previous {
    /// Fingerprint → fate, for every slot in use. Empty when not trusted.
    pub fates: HashMap<u64, Fate>,
    /// Why it is not trusted (absent, another boot, another journal, bad
    /// header); `None` when it is.
    pub distrust: Option<String>,
}

impl Previous {
    /// What the previous run's ledger says of `id`, if it is trusted and
    /// holds it.
    pub fn fate(&self, id: &str) -> Option<Fate> {
        self.fates.get(&fingerprint(id)).copied()
    }
}

impl Ledger {
    /// Read the ledger a previous run left at `path` (if any) for the
    /// journal `journal_id`. Never fails: an unusable file is reported as
    /// not trusted.
    pub fn previous(path: &Path, journal_id: &str) -> Previous {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Previous {
                    fates: HashMap::new(),
                    distrust: Some(
                        "no ledger was left (first start, or the machine rebooted)".into(),
                    ),
                };
            }
            Err(e) => {
                return Previous {
                    fates: HashMap::new(),
                    distrust: Some(format!("cannot read it: {e}")),
                };
            }
        };
        let distrust = |why: &str| Previous {
            fates: HashMap::new(),
            distrust: Some(why.to_string()),
        };
        if bytes.len() < HEADER || bytes[..8] != MAGIC {
            return distrust("not a ledger (bad header)");
        }
        let u32_at =
            |o: usize| u32::from_ne_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[o..o + 8]);
            u64::from_ne_bytes(b)
        };
        if u32_at(8) != VERSION {
            return distrust("it is of another layout (an older agent's)");
        }
        if bytes[BOOT_AT..BOOT_AT + 40] != boot_id() {
            return distrust(
                "it was written before the last boot (its page cache may have been lost)",
            );
        }
        if u64_at(JOURNAL_AT) != fingerprint(journal_id) {
            return distrust("it belongs to another journal");
        }
        let slots = u32_at(12) as usize;
        if bytes.len() < HEADER + slots * SLOT {
            return distrust("it is shorter than its header says");
        }
        let mut fates = HashMap::new();
        for i in 0..slots {
            let at = HEADER + i * SLOT;
            let state = u32_at(at + 8) & STATE;
            let fate = match state {
                ARMED => Fate::NotRun,
                EXECUTING => Fate::Interrupted,
                OK => Fate::Succeeded,
                FAILED => Fate::Failed,
                _ => continue,
            };
            // Two slots of one id (not expected): the one that ran wins,
            // so nothing that may have run is fired again.
            let e = fates.entry(u64_at(at)).or_insert(fate);
            if *e == Fate::NotRun {
                *e = fate;
            }
        }
        Previous {
            fates,
            distrust: None,
        }
    }

    /// A fresh ledger of `slots` slots at `path` for the journal
    /// `journal_id`, replacing whatever was there (read it first with
    /// [`Ledger::previous`]). Every page is written now, so none faults
    /// on the real-time path.
    pub fn create(path: &Path, journal_id: &str, slots: u32) -> io::Result<Ledger> {
        Self::create_for(path, journal_id, slots, None)
    }

    /// [`Ledger::create`], naming the data directory that owns it (so that
    /// a ledger whose owner is gone — a test's temporary directory, a
    /// removed agent — can be collected; see [`Ledger::collect_orphans`]).
    pub fn create_for(
        path: &Path,
        journal_id: &str,
        slots: u32,
        owner: Option<&Path>,
    ) -> io::Result<Ledger> {
        let len = HEADER + slots as usize * SLOT;
        let mut header = [0u8; HEADER];
        if let Some(o) = owner {
            let o = o.as_os_str().as_encoded_bytes();
            if o.len() <= OWNER_MAX {
                header[OWNER_AT..OWNER_AT + 2].copy_from_slice(&(o.len() as u16).to_ne_bytes());
                header[OWNER_AT + 2..OWNER_AT + 2 + o.len()].copy_from_slice(o);
            }
        }
        header[..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_ne_bytes());
        header[12..16].copy_from_slice(&slots.to_ne_bytes());
        header[BOOT_AT..BOOT_AT + 40].copy_from_slice(&boot_id());
        header[JOURNAL_AT..JOURNAL_AT + 8].copy_from_slice(&fingerprint(journal_id).to_ne_bytes());
        // Written whole into a temporary file, then renamed: a crash here
        // leaves the old ledger or the new one, never a torn header.
        let tmp = path.with_extension("tmp");
        {
            let mut f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all(&header)?;
            f.write_all(&vec![0u8; len - HEADER])?;
        }
        std::fs::rename(&tmp, path)?;
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        let map = AtomicMap::shared(&f, len)?;
        let ledger = Ledger {
            map,
            slots,
            path: Some(path.to_owned()),
        };
        ledger.prefault();
        Ok(ledger)
    }

    /// A ledger in anonymous memory: the same protocol, nothing survives
    /// the process (tests; attempts beyond the durable ledger's slots).
    pub fn anonymous(slots: u32) -> Ledger {
        let len = HEADER + slots as usize * SLOT;
        let map = match AtomicMap::anonymous(len) {
            Ok(m) => m,
            // Out of address space for a few KiB: nothing sensible is left.
            Err(e) => panic!("mapping an anonymous ledger of {len} bytes: {e}"),
        };
        Ledger {
            map,
            slots,
            path: None,
        }
    }

    /// Write every page once (and so fault it in before memory is locked
    /// and before the real-time thread touches it).
    fn prefault(&self) {
        for i in 0..self.slots {
            self.state(i).store(FREE, Ordering::Relaxed);
        }
    }

    /// Number of slots.
    pub fn len(&self) -> u32 {
        self.slots
    }

    /// Whether it has no slot at all.
    pub fn is_empty(&self) -> bool {
        self.slots == 0
    }

    fn print(&self, i: u32) -> &AtomicU64 {
        assert!(i < self.slots, "ledger slot {i} out of {}", self.slots);
        self.map.u64_at(HEADER + i as usize * SLOT)
    }

    fn state(&self, i: u32) -> &AtomicU32 {
        assert!(i < self.slots, "ledger slot {i} out of {}", self.slots);
        self.map.u32_at(HEADER + i as usize * SLOT + 8)
    }

    /// Remove the ledgers `baton-*.ledger` in `dir` (other than `keep`)
    /// whose owner's data directory no longer exists: left behind by an
    /// agent killed for good (a test's temporary directory, a removed
    /// installation). A tmpfs file is memory: nothing else would free it
    /// before the next boot. Best effort.
    pub fn collect_orphans(dir: &Path, keep: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if p == keep || !name.starts_with("baton-") || !name.ends_with(".ledger") {
                continue;
            }
            let mut head = [0u8; HEADER];
            let read = std::fs::File::open(&p)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head));
            let version = u32::from_ne_bytes([head[8], head[9], head[10], head[11]]);
            if read.is_err() || head[..8] != MAGIC || version != VERSION {
                continue;
            }
            let n = usize::from(u16::from_ne_bytes([head[OWNER_AT], head[OWNER_AT + 1]]));
            if n == 0 || n > OWNER_MAX {
                continue;
            }
            let owner = std::ffi::OsStr::from_bytes(&head[OWNER_AT + 2..OWNER_AT + 2 + n]);
            if !Path::new(owner).exists() {
                let _ = std::fs::remove_file(&p);
            }
        }
    }

    /// Remove the file (after a clean stop: everything it could resolve
    /// is in the journal).
    pub fn remove_file(&self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// One attempt's slot: a cheap handle (shared ledger, index) that every
/// thread handling the attempt holds a clone of.
#[derive(Clone, Debug)]
pub struct Slot {
    ledger: Arc<Ledger>,
    index: u32,
}

impl Slot {
    /// Slot `index` of `ledger`, made `ARMED` for the attempt `id`. The
    /// control thread calls it before the attempt's start record is made
    /// durable.
    pub fn arm(ledger: Arc<Ledger>, index: u32, id: &str) -> Slot {
        ledger
            .print(index)
            .store(fingerprint(id), Ordering::Relaxed);
        ledger.state(index).store(ARMED, Ordering::SeqCst);
        Slot { ledger, index }
    }

    /// A slot of a fresh one-slot anonymous ledger, armed (tests).
    pub fn standalone() -> Slot {
        Slot::arm(Arc::new(Ledger::anonymous(1)), 0, "")
    }

    /// Right before the device call: take the attempt (`ARMED →
    /// EXECUTING`). False: it was withdrawn (or already claimed), it
    /// must not run.
    pub fn claim(&self) -> bool {
        self.ledger
            .state(self.index)
            .compare_exchange(ARMED, EXECUTING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Right after the device call of a claimed attempt.
    pub fn finish(&self, ok: bool) {
        // Arithmetic, not a store: keeps a WITHDRAW bit set meanwhile.
        let by = if ok {
            OK - EXECUTING
        } else {
            FAILED - EXECUTING
        };
        self.ledger
            .state(self.index)
            .fetch_add(by, Ordering::SeqCst);
    }

    /// Keep the attempt from the device: true if it had not been claimed
    /// (it never will be: it did not and will not run); false if it was
    /// (too late: its own result stands). Either way the attempt is marked
    /// withdrawn ([`Slot::withdrawn`]: a pulse of it ends at once).
    pub fn withdraw(&self) -> bool {
        let was = self
            .ledger
            .state(self.index)
            .fetch_or(WITHDRAW, Ordering::SeqCst);
        was & STATE == ARMED
    }

    /// Whether [`Slot::withdraw`] was called.
    pub fn withdrawn(&self) -> bool {
        self.ledger.state(self.index).load(Ordering::Acquire) & WITHDRAW != 0
    }

    /// Whether the attempt was claimed (it ran, or is running).
    pub fn claimed(&self) -> bool {
        self.ledger.state(self.index).load(Ordering::Acquire) & STATE >= EXECUTING
    }

    /// Back to free (the control thread, once nothing refers to the
    /// attempt any more and its result is journalled).
    pub(crate) fn release(&self) {
        self.ledger.state(self.index).store(FREE, Ordering::SeqCst);
    }
}

/// The slots of the durable ledger and of the anonymous ones that take the
/// overflow, handed out and taken back by the control thread.
#[derive(Debug)]
pub struct Slots {
    /// `[0]`: the durable ledger; later ones anonymous, made when it is
    /// full and dropped once empty again.
    ledgers: Vec<(Arc<Ledger>, Vec<u32>)>,
    /// Freed, waiting for the journal write that makes their attempts'
    /// results as durable as the slots were.
    freed: Vec<Slot>,
}

/// Slots per overflow ledger.
const OVERFLOW_SLOTS: u32 = 4096;

impl Slots {
    /// Hand out the slots of `ledger` (and overflow beyond them).
    pub fn new(ledger: Arc<Ledger>) -> Slots {
        let free = (0..ledger.len()).rev().collect();
        Slots {
            ledgers: vec![(ledger, free)],
            freed: Vec::new(),
        }
    }

    /// Slots over an anonymous ledger (tests, tools).
    pub fn anonymous() -> Slots {
        Slots::new(Arc::new(Ledger::anonymous(DEFAULT_SLOTS)))
    }

    /// The durable ledger.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledgers[0].0
    }

    /// A slot, armed for `id`.
    pub fn arm(&mut self, id: &str) -> Slot {
        if let Some((l, free)) = self.ledgers.iter_mut().find(|(_, f)| !f.is_empty())
            && let Some(i) = free.pop()
        {
            return Slot::arm(l.clone(), i, id);
        }
        let l = Arc::new(Ledger::anonymous(OVERFLOW_SLOTS));
        let mut free: Vec<u32> = (0..OVERFLOW_SLOTS).rev().collect();
        let i = free.pop().unwrap_or(0);
        self.ledgers.push((l.clone(), free));
        Slot::arm(l, i, id)
    }

    /// The attempt of `slot` is over: nothing will touch the slot again.
    /// It is reused after the next [`Slots::journal_written`].
    pub fn free(&mut self, slot: Slot) {
        self.freed.push(slot);
    }

    /// The journal wrote everything buffered so far: slots freed before
    /// can be reused.
    pub fn journal_written(&mut self) {
        for s in self.freed.drain(..) {
            s.release();
            if let Some((_, free)) = self
                .ledgers
                .iter_mut()
                .find(|(l, _)| Arc::ptr_eq(l, &s.ledger))
            {
                free.push(s.index);
            }
        }
        // Overflow ledgers go once all their slots are back; the first is
        // kept.
        let mut first = true;
        self.ledgers
            .retain(|(l, f)| std::mem::take(&mut first) || f.len() < l.len() as usize);
    }

    /// Give back the room a burst left in the list of freed slots.
    pub fn shrink(&mut self) {
        if self.freed.capacity() > 4 * self.freed.len().max(256) {
            self.freed.shrink_to_fit();
        }
    }

    /// Slots in use (armed, or freed and not yet reusable).
    pub fn in_use(&self) -> usize {
        self.ledgers
            .iter()
            .map(|(l, f)| l.len() as usize - f.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_of_claim_and_withdraw_wins() {
        let s = Slot::standalone();
        assert!(s.withdraw(), "armed: withdrawn in time");
        assert!(!s.claim(), "a withdrawn attempt cannot be claimed");
        assert!(s.withdrawn());
        let s = Slot::standalone();
        assert!(s.claim());
        assert!(!s.withdraw(), "claimed: too late");
        s.finish(true);
        assert!(s.withdrawn() && s.claimed());
    }

    #[test]
    fn a_ledger_left_behind_resolves_its_attempts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger");
        let mut slots = Slots::new(Arc::new(Ledger::create(&path, "j1", 8).expect("create")));
        let armed = slots.arm("a/armed");
        let ran = slots.arm("a/ran");
        let failed = slots.arm("a/failed");
        let cut = slots.arm("a/cut");
        let withdrawn = slots.arm("a/withdrawn");
        assert!(ran.claim() && failed.claim() && cut.claim());
        ran.finish(true);
        failed.finish(false);
        assert!(withdrawn.withdraw());
        let _ = armed;
        let prev = Ledger::previous(&path, "j1");
        assert_eq!(prev.distrust, None);
        assert_eq!(prev.fate("a/armed"), Some(Fate::NotRun));
        assert_eq!(prev.fate("a/withdrawn"), Some(Fate::NotRun));
        assert_eq!(prev.fate("a/ran"), Some(Fate::Succeeded));
        assert_eq!(prev.fate("a/failed"), Some(Fate::Failed));
        assert_eq!(prev.fate("a/cut"), Some(Fate::Interrupted));
        assert_eq!(prev.fate("a/never"), None);
        // Another journal's ledger is not trusted.
        assert!(Ledger::previous(&path, "j2").distrust.is_some());
        // A freed slot is reused only after the journal was written.
        slots.free(ran);
        let before = slots.in_use();
        slots.journal_written();
        assert_eq!(slots.in_use(), before - 1);
        assert_eq!(Ledger::previous(&path, "j1").fate("a/ran"), None);
    }

    #[test]
    fn a_ledger_whose_owner_is_gone_is_collected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let owner = dir.path().join("data");
        std::fs::create_dir(&owner).expect("owner");
        let mine = dir.path().join("baton-1.ledger");
        let theirs = dir.path().join("baton-2.ledger");
        let kept = dir.path().join("baton-3.ledger");
        let gone = dir.path().join("gone");
        drop(Ledger::create_for(&mine, "j", 4, Some(&gone)).expect("mine"));
        drop(Ledger::create_for(&theirs, "j", 4, Some(&gone)).expect("theirs"));
        drop(Ledger::create_for(&kept, "j", 4, Some(&owner)).expect("kept"));
        Ledger::collect_orphans(dir.path(), &mine);
        assert!(mine.exists(), "its own is kept");
        assert!(!theirs.exists(), "an orphan goes");
        assert!(kept.exists(), "one whose owner exists stays");
    }

    #[test]
    fn slots_overflow_into_anonymous_ledgers_and_give_them_back() {
        let mut slots = Slots::new(Arc::new(Ledger::anonymous(2)));
        let taken: Vec<Slot> = (0..5).map(|i| slots.arm(&format!("x{i}"))).collect();
        assert_eq!(slots.ledgers.len(), 2);
        for s in taken {
            slots.free(s);
        }
        slots.journal_written();
        assert_eq!(slots.ledgers.len(), 1);
        assert_eq!(slots.in_use(), 0);
    }
}
