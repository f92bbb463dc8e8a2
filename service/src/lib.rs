//! baton as a system service: what systemd and journald expect of a
//! daemon, kept out of the agent's and the controller's own code.
//!
//! - [`notify`]: the sd_notify(3) protocol (`READY=1`, `WATCHDOG=1`,
//!   `STOPPING=1`, `STATUS=`), by hand over a non-blocking Unix datagram
//!   socket: a no-op when `NOTIFY_SOCKET` is unset, never blocking.
//! - [`watchdog`]: `WATCHDOG_USEC`/`WATCHDOG_PID` as sd_watchdog_enabled(3)
//!   reads them, and a sans-IO schedule that decides each ping from a
//!   worker thread's [`watchdog::Heartbeat`] (ping only while it makes
//!   progress or waits legitimately).
//! - [`metrics`]: the agent's Prometheus text exposition and the one HTTP
//!   request a scraper makes (a blocking one-at-a-time server for its
//!   metrics thread); lock-free on the counting side, which is why it is
//!   not `prometheus-client` as the controller's is.
//! - [`log`]: the log output: today's text, JSON lines, or plain lines with
//!   a `<N>` syslog priority prefix when stderr is journald.
//!
//! Pure decisions (message text, address parsing, the environment's
//! meaning, the ping verdict, the priority prefix) are plain functions with
//! unit tests; the IO around them is a few lines.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod log;
pub mod metrics;
pub mod notify;
pub mod watchdog;
