//! Real-time set-up of the dispatcher thread: the policy (what to ask for,
//! what a refusal means); the calls themselves are `baton_sys`'s.
//!
//! Each step may be refused (no CAP_SYS_NICE, RLIMIT_RTPRIO 0, RLIMIT_MEMLOCK,
//! a container's cpuset): the agent then logs one clear warning naming what
//! was refused and runs at normal priority. It never refuses to start.

use std::io;
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering};

use nix::errno::Errno;
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::sys::mman::{MlockAllFlags, mlockall};
use nix::sys::prctl::set_timerslack;
use nix::unistd::Pid;

/// What the dispatcher asks for.
#[derive(Clone, Copy, Debug)]
pub struct RtConfig {
    /// SCHED_FIFO priority (1..=99); `None` leaves the normal policy.
    pub priority: Option<i32>,
    /// CPU to pin the dispatcher to.
    pub cpu: Option<usize>,
    /// Lock all memory (no page faults on the firing path).
    pub mlockall: bool,
    /// How much of a core the dispatcher may spend spinning before
    /// deadlines, in millionths (default 10 000: 1 %).
    pub spin_budget_ppm: u32,
    /// The slowest CPU idle state to leave the agent allows while its
    /// dispatcher runs, in µs (a PM QoS request, [`hold_idle_latency`]);
    /// `None`: the kernel's idle governor decides.
    pub idle_latency_us: Option<u32>,
}

/// Default [`RtConfig::spin_budget_ppm`]: 1 % of a core.
pub const DEFAULT_SPIN_BUDGET_PPM: u32 = 10_000;

impl Default for RtConfig {
    fn default() -> Self {
        RtConfig {
            priority: Some(80),
            cpu: None,
            mlockall: true,
            spin_budget_ppm: DEFAULT_SPIN_BUDGET_PPM,
            idle_latency_us: Some(0),
        }
    }
}

/// What was granted; `refused` lists the steps that were not.
#[derive(Clone, Debug, Default)]
pub struct RtStatus {
    /// SCHED_FIFO in force.
    pub fifo: bool,
    /// Pinned.
    pub pinned: bool,
    /// Memory locked.
    pub locked: bool,
    /// The CPU idle latency request is in force.
    pub idle_held: bool,
    /// Human-readable refusals.
    pub refused: Vec<String>,
}

impl RtStatus {
    /// The one warning to log, if anything was refused.
    pub fn warning(&self) -> Option<String> {
        (!self.refused.is_empty()).then(|| {
            format!(
                "real-time set-up incomplete, running with reduced timing guarantees: {} (grant CAP_SYS_NICE and CAP_IPC_LOCK, or raise RLIMIT_RTPRIO / RLIMIT_MEMLOCK; see systemd/baton-agent.service)",
                self.refused.join("; ")
            )
        })
    }
}

/// How many CPUs a CPU set can name (1024 with glibc): a CPU number at or
/// beyond this is an error, never an index out of bounds.
pub const CPU_SET_CAPACITY: usize = CpuSet::count();

/// The calling thread, for the `sched_*` calls.
fn this_thread() -> Pid {
    Pid::from_raw(0)
}

/// Lock the process's memory: no page of the agent is ever paged out, so
/// the firing path never waits on the disk. Called once start-up is done
/// (packs parsed, freed memory returned): locked pages cannot be given
/// back, so locking earlier would pin the parser's garbage for good. The
/// code and read-only data start-up used are dropped from the resident
/// set first (see [`baton_sys::pages::page_out_file_pages`]): 2.5 of
/// the 5.7 MB of code and libraries a 10 000-instruction agent had
/// resident were start-up's alone, and most of the binary's resident read-only data (messages,
/// tables of the parsers and of the time-zone database) too.
pub fn lock_memory(st: &mut RtStatus) {
    baton_sys::pages::page_out_file_pages();
    // MCL_ONFAULT: lock pages as they are touched instead of faulting in
    // every mapping (thread stacks, allocator reservations) up front —
    // resident memory stays what the agent uses, and no used page is
    // ever paged out. The dispatcher pre-touches its own stack.
    // (nix 0.30 names no MCL_ONFAULT: the bit comes from libc.)
    let base = MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE;
    let on_fault = MlockAllFlags::from_bits_retain(libc::MCL_ONFAULT);
    let (r, mode) = match mlockall(base | on_fault) {
        // Kernel older than 4.4: no MCL_ONFAULT.
        Err(Errno::EINVAL) => (mlockall(base), LOCKED_FULLY),
        r => (r, LOCKED_ON_FAULT),
    };
    match r {
        Ok(()) => {
            st.locked = true;
            LOCK_MODE.store(mode, Ordering::Release);
        }
        Err(e) => st.refused.push(format!("mlockall: {}", io::Error::from(e))),
    }
}

/// How [`lock_memory`] locked memory, for [`return_free_heap`]: not at all,
/// pages locked as they are touched (`MCL_ONFAULT`), or everything up
/// front (kernels before 4.4).
static LOCK_MODE: AtomicU8 = AtomicU8::new(NOT_LOCKED);
const NOT_LOCKED: u8 = 0;
const LOCKED_ON_FAULT: u8 = 1;
const LOCKED_FULLY: u8 = 2;

/// Give the allocator's free heap pages back to the kernel, even once
/// memory is locked. glibc's `malloc_trim` gives back free pages inside
/// the heap with `MADV_DONTNEED`, which the kernel refuses on locked
/// pages, so after [`lock_memory`] the free middle of the heap (a burst's
/// garbage, a pushed pack's parse tree) would stay resident, and locked,
/// for good; only its top could still shrink. The main heap (`[heap]`,
/// the control thread's arena, where parsing and firing allocate) is
/// unlocked, trimmed, and locked again on fault: what is in use stays
/// resident, only free pages go.
///
/// For a moment the heap is not locked: with swap, an in-use page could be
/// paged out then. `MADV_WILLNEED` afterwards starts reading any such page
/// back, so the dispatcher does not take the fault later; still, call it
/// only when nothing is due soon. `malloc_trim` also holds each arena's
/// lock while it walks that arena's free lists (about a millisecond for
/// tens of MB), so another thread's `malloc` or `free` there waits that
/// long.
///
/// Returns the heap's range when the locked heap was trimmed; `Ok(None)`
/// when there was nothing to unlock (memory not locked: a plain trim;
/// locked fully, on an old kernel: no trim, as locking again would fault
/// every free page back in; no glibc; the heap changed under the unlock,
/// so nothing was trimmed this time). An error means the heap could not
/// be locked again on fault: it was then locked fully (which faults its
/// free pages back in) if even that was possible.
pub fn return_free_heap() -> io::Result<Option<(usize, usize)>> {
    #[cfg(target_env = "gnu")]
    {
        match LOCK_MODE.load(Ordering::Acquire) {
            LOCKED_ON_FAULT => {}
            LOCKED_FULLY => return Ok(None),
            _ => {
                baton_sys::release_free_heap();
                return Ok(None);
            }
        }
        let Some((a, b)) = heap_range() else {
            return Ok(None);
        };
        let unlocked = baton_sys::heap::unlock(a, b - a).is_ok();
        // A failure means part of the range went away meanwhile (another
        // thread's allocation shrank the heap): no trim then, but what
        // was unlocked is locked again below.
        if unlocked {
            baton_sys::release_free_heap();
        }
        // The trim may have shrunk the heap from its top: lock what is
        // mapped now (a range past the end would fail with ENOMEM).
        let (a, b) = heap_range().unwrap_or((a, b));
        // Resident pages locked now, others when first touched (as
        // `mlockall(MCL_ONFAULT)` did), without faulting any in.
        baton_sys::heap::lock_on_fault(a, b - a)?;
        baton_sys::heap::advise_will_need(a, b - a);
        Ok(unlocked.then_some((a, b)))
    }
    #[cfg(not(target_env = "gnu"))]
    Ok(None)
}

/// The `[heap]` mapping of this process, from `/proc/self/maps`.
#[cfg(target_env = "gnu")]
fn heap_range() -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    heap_in_maps(&maps)
}

#[cfg_attr(
    not(target_env = "gnu"),
    allow(dead_code, reason = "only glibc is trimmed")
)]
fn heap_in_maps(maps: &str) -> Option<(usize, usize)> {
    let line = maps.lines().find(|l| l.trim_end().ends_with("[heap]"))?;
    let (a, b) = line.split_whitespace().next()?.split_once('-')?;
    Some((
        usize::from_str_radix(a, 16).ok()?,
        usize::from_str_radix(b, 16).ok()?,
    ))
}

/// The set holding only `cpu`; a number a CPU set cannot hold is a clear
/// error (libc's `CPU_SET` would panic on it).
fn only_cpu(cpu: usize) -> io::Result<CpuSet> {
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no such CPU: a CPU set holds CPUs 0..{CPU_SET_CAPACITY}"),
        )
    })?;
    Ok(set)
}

/// Pin the calling thread to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    let set = only_cpu(cpu)?;
    match sched_setaffinity(this_thread(), &set) {
        Ok(()) => Ok(()),
        // The kernel's answer for a CPU that is offline, absent, or outside
        // this process's cpuset: list the allowed ones, not just "Invalid
        // argument".
        Err(Errno::EINVAL) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "CPU {cpu} is not one this thread may run on (allowed: {})",
                allowed_cpus().map_or_else(|e| format!("unknown: {e}"), |s| describe(&s))
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// The CPUs the calling thread may run on (its affinity mask, which a
/// container's cpuset already narrows). Unlike
/// `std::thread::available_parallelism`, these are CPU numbers, not a
/// count (and a cgroup CPU quota does not shrink them).
pub fn allowed_cpus() -> io::Result<CpuSet> {
    Ok(sched_getaffinity(this_thread())?)
}

/// `0,2-3` for messages.
fn describe(set: &CpuSet) -> String {
    let cpus: Vec<usize> = (0..CPU_SET_CAPACITY)
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect();
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j == i {
            out.push_str(&cpus[i].to_string());
        } else {
            out.push_str(&format!("{}-{}", cpus[i], cpus[j]));
        }
        i = j + 1;
    }
    if out.is_empty() { "none".into() } else { out }
}

/// Apply `cfg` to the calling thread: affinity, timer slack, SCHED_FIFO.
/// (`cfg.mlockall` is applied later by [`lock_memory`].)
pub fn apply_to_current_thread(cfg: &RtConfig) -> RtStatus {
    let mut st = RtStatus::default();
    // Timer slack 1 ns: the kernel must not coalesce our wake-ups.
    if let Err(e) = set_timerslack(1) {
        st.refused
            .push(format!("timer slack 1 ns: {}", io::Error::from(e)));
    }
    if let Some(cpu) = cfg.cpu {
        match pin_to_cpu(cpu) {
            Ok(()) => st.pinned = true,
            Err(e) => st.refused.push(format!("pin to CPU {cpu}: {e}")),
        }
    }
    if let Some(prio) = cfg.priority {
        let prio = prio.clamp(1, 99);
        match baton_sys::sched::set_fifo(prio) {
            Ok(()) => st.fifo = true,
            Err(e) => st.refused.push(format!("SCHED_FIFO priority {prio}: {e}")),
        }
    }
    st
}

/// The kernel's PM QoS interface for CPU wake-up latency (the name is
/// historical: it bounds every CPU's idle exit, not DMA).
const PM_QOS_CPU_LATENCY: &str = "/dev/cpu_dma_latency";

/// Ask the kernel to keep every CPU out of idle states slower than `us` to
/// leave, for as long as the returned file stays open (the request ends
/// when it is closed, whatever way the process ends: nothing to undo).
///
/// Why: the dispatcher's wake-up is a timer interrupt on a CPU that is
/// usually idle, and leaving a deep idle state (a halted vCPU, a
/// powered-down core) adds its exit latency to every firing, tens of µs on
/// the boxes measured (docs/bench/latency.md) — the gap between the
/// agent's wake-up and cyclictest's, which makes the same request by
/// default. The price is power: the CPUs poll instead of sleeping
/// (`realtime.idle-latency: off` gives it back). Needs root (the device
/// is 0600): a refusal joins the others in [`RtStatus::refused`].
pub fn hold_idle_latency(us: u32, st: &mut RtStatus) -> Option<std::fs::File> {
    use std::io::Write;
    let request = i32::try_from(us).unwrap_or(i32::MAX).to_ne_bytes();
    let held = std::fs::OpenOptions::new()
        .write(true)
        .open(PM_QOS_CPU_LATENCY)
        .and_then(|mut f| f.write_all(&request).map(|()| f));
    match held {
        Ok(f) => {
            st.idle_held = true;
            Some(f)
        }
        Err(e) => {
            st.refused.push(format!(
                "CPU idle latency {us} µs ({PM_QOS_CPU_LATENCY}): {e}"
            ));
            None
        }
    }
}

/// The CPU wake-up latency every request together allows now, in µs (what
/// [`hold_idle_latency`] changes), if the kernel says.
pub fn idle_latency_in_force() -> Option<i32> {
    use std::io::Read;
    let mut b = [0u8; 4];
    let mut f = std::fs::File::open(PM_QOS_CPU_LATENCY).ok()?;
    f.read_exact(&mut b).ok()?;
    Some(i32::from_ne_bytes(b))
}

/// Keep the calling thread (and the threads it spawns later) off `cpu`, so
/// the dispatcher pinned there has it to itself. The thread keeps every
/// other CPU it was allowed; if `cpu` is not among them (or is no CPU at
/// all: the dispatcher's pin reports that) there is nothing to do, and if
/// it is the only one, the thread stays there (a single-CPU box).
pub fn avoid_cpu(cpu: usize) -> io::Result<()> {
    let mut set = allowed_cpus()?;
    if !set.is_set(cpu).unwrap_or(false) {
        return Ok(());
    }
    set.unset(cpu)?;
    if (0..CPU_SET_CAPACITY).all(|c| !set.is_set(c).unwrap_or(false)) {
        return Ok(());
    }
    Ok(sched_setaffinity(this_thread(), &set)?)
}

/// Futex calls that failed for a reason other than the expected ones (the
/// word had already changed, the deadline passed, a signal). Such a failure
/// cannot happen with the arguments built here; if it ever does, the
/// dispatcher's loop degrades to spinning (correct, but it burns its CPU),
/// so it is counted for telemetry and tests rather than ignored.
static FUTEX_ERRORS: AtomicU64 = AtomicU64::new(0);
/// The errno of the last such failure (0: none yet).
static FUTEX_LAST_ERRNO: AtomicI32 = AtomicI32::new(0);

/// How many futex calls failed unexpectedly, and the last errno, if any.
pub fn futex_errors() -> (u64, Option<Errno>) {
    let n = FUTEX_ERRORS.load(Ordering::Relaxed);
    let e = FUTEX_LAST_ERRNO.load(Ordering::Relaxed);
    (n, (e != 0).then(|| Errno::from_raw(e)))
}

fn count_futex_error(err: &io::Error, expected: &[Errno]) {
    let e = Errno::from_raw(err.raw_os_error().unwrap_or(0));
    if !expected.contains(&e) {
        FUTEX_LAST_ERRNO.store(e as i32, Ordering::Relaxed);
        FUTEX_ERRORS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sleep on a futex word until it differs from `seen`, or until the
/// absolute `CLOCK_MONOTONIC` deadline (ns), whichever comes first
/// (`baton_sys::futex`). A deadline before the clock's epoch is a past
/// deadline.
pub fn futex_wait(word: &AtomicU32, seen: u32, deadline_ns: Option<i64>) {
    if let Err(e) = baton_sys::futex::wait(word, seen, deadline_ns) {
        // EAGAIN: the word had changed; ETIMEDOUT: the deadline passed;
        // EINTR: a signal. All mean "look again", as the caller does.
        count_futex_error(&e, &[Errno::EAGAIN, Errno::ETIMEDOUT, Errno::EINTR]);
    }
}

/// Wake every waiter on a futex word (after changing it).
pub fn futex_wake(word: &AtomicU32) {
    if let Err(e) = baton_sys::futex::wake_all(word) {
        count_futex_error(&e, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_latency_request_is_in_force_while_held_and_named_when_refused() {
        let mut st = RtStatus::default();
        let held = hold_idle_latency(0, &mut st);
        if nix::unistd::geteuid().is_root() {
            // The kernel's aggregate is the smallest request: ours, 0.
            assert!(held.is_some() && st.idle_held, "{:?}", st.refused);
            assert_eq!(idle_latency_in_force(), Some(0));
        } else {
            assert!(held.is_none() && !st.idle_held);
            assert!(
                st.refused[0].contains("/dev/cpu_dma_latency"),
                "{:?}",
                st.refused
            );
        }
    }

    #[test]
    fn sched_fifo_is_in_force_when_granted_and_named_when_refused() {
        let st = std::thread::spawn(|| {
            let st = apply_to_current_thread(&RtConfig {
                priority: Some(10),
                cpu: None,
                mlockall: false,
                spin_budget_ppm: crate::rt::DEFAULT_SPIN_BUDGET_PPM,
                idle_latency_us: None,
            });
            // The policy as the kernel has it.
            let policy = baton_sys::sched::current_policy().expect("sched_getscheduler");
            (st, policy)
        })
        .join()
        .expect("thread");
        let (st, policy) = st;
        if st.fifo {
            assert_eq!(policy, libc::SCHED_FIFO);
        } else {
            assert_ne!(policy, libc::SCHED_FIFO);
            assert!(
                st.refused
                    .iter()
                    .any(|r| r.starts_with("SCHED_FIFO priority 10")),
                "{:?}",
                st.refused
            );
        }
        // As root (CI, and this dev machine) it must be granted: a wrapper
        // that never works (musl's) would otherwise pass as "refused".
        if nix::unistd::geteuid().is_root() {
            assert!(st.fifo, "root is granted SCHED_FIFO: {:?}", st.refused);
        }
    }

    #[test]
    fn the_heap_is_found_in_proc_maps() {
        let maps = "\
55d000000000-55d000100000 r--p 00000000 fe:01 123 /usr/bin/baton-agent
55d001000000-55d001c00000 rw-p 00000000 00:00 0                          [heap]
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";
        assert_eq!(
            heap_in_maps(maps),
            Some((0x55d0_0100_0000, 0x55d0_01c0_0000))
        );
        assert_eq!(heap_in_maps("7ffd0-7ffd1 rw-p 0 00:00 0 [stack]\n"), None);
    }

    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn futex_wait_returns_at_the_deadline_or_on_change() {
        let w = AtomicU32::new(0);
        // Word already changed: returns at once even with no deadline.
        futex_wait(&w, 1, None);
        // Deadline in the past: returns at once.
        futex_wait(&w, 0, Some(baton_clock::mono_now().as_nanos() - 1));
        // A waker on another thread ends an unbounded wait.
        std::thread::scope(|s| {
            s.spawn(|| {
                w.fetch_add(1, Ordering::Release);
                futex_wake(&w);
            });
            let seen = 0;
            while w.load(Ordering::Acquire) == seen {
                futex_wait(
                    &w,
                    seen,
                    Some(baton_clock::mono_now().as_nanos() + 5_000_000_000),
                );
            }
        });
        assert_eq!(w.load(Ordering::Acquire), 1);
        // EAGAIN and ETIMEDOUT above are expected, not errors.
        assert_eq!(futex_errors(), (0, None));
    }

    /// Runs `f` on a fresh thread, so affinity changes stay there.
    fn on_own_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| s.spawn(f).join().expect("thread panicked"))
    }

    #[test]
    fn a_cpu_beyond_the_set_is_a_refusal_not_a_panic() {
        for cpu in [CPU_SET_CAPACITY, CPU_SET_CAPACITY + 1, usize::MAX] {
            let st = on_own_thread(|| {
                apply_to_current_thread(&RtConfig {
                    priority: None,
                    cpu: Some(cpu),
                    mlockall: false,
                    spin_budget_ppm: crate::rt::DEFAULT_SPIN_BUDGET_PPM,
                    idle_latency_us: None,
                })
            });
            assert!(!st.pinned);
            let w = st.warning().expect("a warning");
            assert!(w.contains(&format!("pin to CPU {cpu}: no such CPU")), "{w}");
            // The control thread has nothing to avoid.
            on_own_thread(|| avoid_cpu(cpu)).expect("no-op");
        }
    }

    #[test]
    fn pinning_and_avoiding_an_allowed_cpu() {
        let allowed = allowed_cpus().expect("sched_getaffinity");
        let cpus: Vec<usize> = (0..CPU_SET_CAPACITY)
            .filter(|&c| allowed.is_set(c).unwrap_or(false))
            .collect();
        let first = cpus[0];
        let st = on_own_thread(|| {
            let st = apply_to_current_thread(&RtConfig {
                priority: None,
                cpu: Some(first),
                mlockall: false,
                spin_budget_ppm: crate::rt::DEFAULT_SPIN_BUDGET_PPM,
                idle_latency_us: None,
            });
            let now = allowed_cpus().expect("sched_getaffinity");
            assert_eq!(describe(&now), first.to_string());
            st
        });
        assert!(st.pinned, "{:?}", st.refused);
        on_own_thread(|| {
            avoid_cpu(first).expect("avoid");
            let now = allowed_cpus().expect("sched_getaffinity");
            if cpus.len() > 1 {
                assert!(!now.is_set(first).expect("in range"));
                assert!(cpus[1..].iter().all(|&c| now.is_set(c).unwrap_or(false)));
            } else {
                // The only CPU: the thread stays on it.
                assert!(now.is_set(first).expect("in range"));
            }
        });
    }

    #[test]
    fn cpu_sets_are_described_as_ranges() {
        let mut s = CpuSet::new();
        assert_eq!(describe(&s), "none");
        for c in [0, 2, 3, 4, 7] {
            s.set(c).expect("in range");
        }
        assert_eq!(describe(&s), "0,2-4,7");
    }

    #[test]
    fn refused_steps_give_one_warning_not_an_error() {
        let st = RtStatus {
            refused: vec!["SCHED_FIFO priority 80: Operation not permitted".into()],
            ..RtStatus::default()
        };
        let w = st.warning().expect("a warning");
        assert!(w.contains("SCHED_FIFO priority 80"));
        assert!(RtStatus::default().warning().is_none());
    }
}
