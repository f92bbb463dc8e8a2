//! Real-time set-up of the dispatcher thread. All `unsafe` for scheduling
//! lives here (STYLE.md habit 3).
//!
//! Each step may be refused (no CAP_SYS_NICE, RLIMIT_RTPRIO 0, RLIMIT_MEMLOCK,
//! a container's cpuset): the agent then logs one clear warning naming what
//! was refused and runs at normal priority. It never refuses to start.

use std::io;

/// What the dispatcher asks for.
#[derive(Clone, Copy, Debug)]
pub struct RtConfig {
    /// SCHED_FIFO priority (1..=99); `None` leaves the normal policy.
    pub priority: Option<i32>,
    /// CPU to pin the dispatcher to.
    pub cpu: Option<usize>,
    /// Lock all memory (no page faults on the firing path).
    pub mlockall: bool,
}

impl Default for RtConfig {
    fn default() -> Self {
        RtConfig {
            priority: Some(80),
            cpu: None,
            mlockall: true,
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

/// Touch `bytes` of the calling thread's stack so those pages are resident
/// (and, under mlockall, locked) before the first deadline.
#[inline(never)]
pub fn prefault_stack(bytes: usize) {
    let mut buf = [0u8; 64 * 1024];
    let n = bytes.min(buf.len());
    for i in (0..n).step_by(4096) {
        // Volatile: the writes must happen even though nothing reads them.
        // SAFETY: `i < n <= buf.len()`.
        unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), 1) };
    }
    std::hint::black_box(&buf);
}

/// Lock the process's memory: no page of the agent is ever paged out, so
/// the firing path never waits on the disk. Called once start-up is done
/// (packs parsed, freed memory returned): locked pages cannot be given
/// back, so locking earlier would pin the parser's garbage for good.
pub fn lock_memory(st: &mut RtStatus) {
    // MCL_ONFAULT: lock pages as they are touched instead of faulting in
    // every mapping (thread stacks, allocator reservations) up front —
    // resident memory stays what the agent uses, and no used page is
    // ever paged out. The dispatcher pre-touches its own stack.
    // SAFETY: flags only; no pointers.
    let mut rc =
        unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    if rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // Kernel older than 4.4: no MCL_ONFAULT.
        // SAFETY: as above.
        rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
    }
    if rc == 0 {
        st.locked = true;
    } else {
        st.refused
            .push(format!("mlockall: {}", io::Error::last_os_error()));
    }
}

/// Apply `cfg` to the calling thread: affinity, timer slack, SCHED_FIFO.
/// (`cfg.mlockall` is applied later by [`lock_memory`].)
pub fn apply_to_current_thread(cfg: &RtConfig) -> RtStatus {
    let mut st = RtStatus::default();
    // Timer slack 1 ns: the kernel must not coalesce our wake-ups.
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long and no pointers.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if let Some(cpu) = cfg.cpu {
        // SAFETY: `set` is a zeroed, valid cpu_set_t; CPU_SET bounds-checks
        // against its size; pid 0 is the calling thread.
        let rc = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if rc == 0 {
            st.pinned = true;
        } else {
            st.refused
                .push(format!("pin to CPU {cpu}: {}", io::Error::last_os_error()));
        }
    }
    if let Some(prio) = cfg.priority {
        let param = libc::sched_param {
            sched_priority: prio.clamp(1, 99),
        };
        // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
        if rc == 0 {
            st.fifo = true;
        } else {
            st.refused.push(format!(
                "SCHED_FIFO priority {}: {}",
                param.sched_priority,
                io::Error::last_os_error()
            ));
        }
    }
    st
}

/// Keep the calling thread (and the threads it spawns later) off `cpu`, so
/// the dispatcher pinned there has it to itself. No-op on a single-CPU box.
pub fn avoid_cpu(cpu: usize) -> io::Result<()> {
    let n = std::thread::available_parallelism().map_or(1, usize::from);
    if n < 2 {
        return Ok(());
    }
    // SAFETY: `set` is a zeroed cpu_set_t; CPU_SET bounds-checks; pid 0 is
    // the calling thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in (0..n).filter(|c| *c != cpu) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sleep on a futex word until it differs from `seen`, or until the
/// absolute `CLOCK_MONOTONIC` deadline (ns), whichever comes first.
///
/// Why a futex and not `clock_nanosleep(TIMER_ABSTIME)`: both sleep to an
/// absolute monotonic deadline, but only the futex can be woken early
/// without signals when an earlier firing arrives.
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, seen: u32, deadline_ns: Option<i64>) {
    let ts = deadline_ns.map(|d| libc::timespec {
        tv_sec: d.div_euclid(1_000_000_000),
        tv_nsec: d.rem_euclid(1_000_000_000),
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` outlives the call; FUTEX_WAIT_BITSET reads it and the
    // optional absolute timeout (CLOCK_MONOTONIC without FUTEX_CLOCK_REALTIME).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG,
            seen,
            ts_ptr,
            std::ptr::null::<u32>(),
            libc::FUTEX_BITSET_MATCH_ANY,
        );
    }
}

/// Wake every waiter on a futex word (after changing it).
pub fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: `word` is valid; FUTEX_WAKE takes no other pointers.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn futex_wait_returns_at_the_deadline_or_on_change() {
        let w = AtomicU32::new(0);
        // Word already changed: returns at once even with no deadline.
        futex_wait(&w, 1, None);
        // Deadline in the past: returns at once.
        futex_wait(&w, 0, Some(crate::clock::mono_now().0 - 1));
        // A waker on another thread ends an unbounded wait.
        std::thread::scope(|s| {
            s.spawn(|| {
                w.fetch_add(1, Ordering::Release);
                futex_wake(&w);
            });
            let seen = 0;
            while w.load(Ordering::Acquire) == seen {
                futex_wait(&w, seen, Some(crate::clock::mono_now().0 + 5_000_000_000));
            }
        });
        assert_eq!(w.load(Ordering::Acquire), 1);
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
