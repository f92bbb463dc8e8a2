//! The kernel's view of the system clock (`adjtimex`, read-only).

use std::io;

/// What `adjtimex` with `modes = 0` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timex {
    /// The call's return value (`TIME_OK` … `TIME_ERROR`).
    pub state: i32,
    /// `status` flags (`STA_*`).
    pub status: i32,
    /// Estimated error, µs.
    pub esterror_us: i64,
    /// Maximum error, µs.
    pub maxerror_us: i64,
}

/// Read the kernel's clock status (no privilege needed). nix and rustix do
/// not wrap adjtimex, hence libc.
pub fn read() -> io::Result<Timex> {
    // SAFETY: an all-zero `timex` is a valid value (plain integers), and
    // with `modes = 0` adjtimex only writes the struct we own.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: `tx` is a valid, exclusively borrowed timex for the call.
    let rc = unsafe { libc::adjtimex(&mut tx) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(
        clippy::useless_conversion,
        reason = "`c_long` is i32 on armv7 gnueabihf, i64 here"
    )]
    Ok(Timex {
        state: rc,
        status: tx.status,
        esterror_us: i64::from(tx.esterror),
        maxerror_us: i64::from(tx.maxerror),
    })
}
