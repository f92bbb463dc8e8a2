//! How much feedback may be on the wire, sans IO.
//!
//! Feedback goes out in seq order, in pages, with at most
//! [`MAX_IN_FLIGHT`] entries sent but not yet acknowledged: enough to keep
//! a slow link busy, bounded so that a controller that stops acking does
//! not make the agent read its whole outbox back from disk into the link's
//! buffers. The journal keeps every entry until it is acknowledged; on
//! every (re)connect the window opens again at the outbox front, so
//! whatever was in flight when a stream died is sent again (the controller
//! de-duplicates by seq within the journal id).

/// Entries sent and not yet acknowledged, at most.
pub const MAX_IN_FLIGHT: u64 = 4096;
/// Entries per `FeedbackBatch`.
pub const PAGE: u64 = 256;

/// The send cursor and the in-flight count of one session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SendWindow {
    /// Sending is allowed (the session was welcomed).
    open: bool,
    /// The next seq to send.
    next: u64,
    /// The highest seq acknowledged (or known to be behind the cursor).
    acked: u64,
    /// The highest seq sent this session.
    sent: u64,
}

impl SendWindow {
    /// Open at `front` (the outbox's first seq, or, when it is empty, the
    /// one after the controller's `acked`): everything from there is sent,
    /// whatever an earlier session sent.
    pub fn open(&mut self, front: u64, acked: u64) {
        let floor = front.saturating_sub(1);
        *self = SendWindow {
            open: true,
            next: front,
            acked: acked.max(floor),
            sent: floor,
        };
    }

    /// The session ended: nothing more is sent until the next opens.
    pub fn close(&mut self) {
        self.open = false;
    }

    /// Everything up to `seq` is acknowledged: room for more, and the
    /// cursor skips what the controller already has.
    pub fn acked(&mut self, seq: u64) {
        self.acked = self.acked.max(seq);
        self.next = self.next.max(seq.saturating_add(1));
        self.sent = self.sent.max(seq);
    }

    /// Entries that may be sent now (0 when closed).
    pub fn room(&self) -> u64 {
        if !self.open {
            return 0;
        }
        MAX_IN_FLIGHT.saturating_sub(self.sent.saturating_sub(self.acked))
    }

    /// The next page to read: from which seq (past entries the outbox has
    /// dropped, if its front moved beyond the cursor) and how many.
    pub fn next_page(&self, outbox_front: Option<u64>) -> Option<(u64, u64)> {
        let room = self.room().min(PAGE);
        if room == 0 {
            return None;
        }
        let from = outbox_front.map_or(self.next, |f| f.max(self.next));
        Some((from, room))
    }

    /// Entries through `last` were handed to the link.
    pub fn sent_through(&mut self, last: u64) {
        self.sent = self.sent.max(last);
        self.next = self.next.max(last.saturating_add(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_until_welcomed_then_bounded_by_the_in_flight_limit() {
        let mut w = SendWindow::default();
        assert_eq!(w.room(), 0);
        assert_eq!(w.next_page(Some(1)), None);
        w.open(1, 0);
        assert_eq!(w.next_page(Some(1)), Some((1, PAGE)));
        // Send 16 pages: the window is full.
        for p in 0..16 {
            let (from, n) = w.next_page(Some(1)).expect("room");
            assert_eq!(from, 1 + p * PAGE);
            w.sent_through(from + n - 1);
        }
        assert_eq!(w.room(), 0);
        assert_eq!(w.next_page(Some(1)), None);
        // An ack makes room for as many as it acknowledged.
        w.acked(100);
        assert_eq!(w.room(), 100);
        assert_eq!(w.next_page(Some(101)), Some((4097, 100)));
        w.close();
        assert_eq!(w.room(), 0);
    }

    #[test]
    fn a_reconnect_restarts_at_the_outbox_front() {
        let mut w = SendWindow::default();
        w.open(1, 0);
        w.sent_through(300);
        w.acked(50);
        // The stream dies with 51..=300 in flight; the controller says it
        // stored up to 120; the journal then holds 121.. .
        w.close();
        w.open(121, 120);
        assert_eq!(w.next_page(Some(121)), Some((121, PAGE)));
        assert_eq!(w.room(), MAX_IN_FLIGHT);
    }

    #[test]
    fn the_cursor_skips_what_is_acked_or_dropped() {
        let mut w = SendWindow::default();
        // Empty outbox, controller has up to 40: new entries start at 41.
        w.open(41, 40);
        assert_eq!(w.next_page(None), Some((41, PAGE)));
        // The outbox dropped entries (cap): its front moved past the cursor.
        assert_eq!(w.next_page(Some(90)), Some((90, PAGE)));
        // An ack beyond what this session sent moves the cursor too.
        w.acked(500);
        assert_eq!(w.next_page(Some(501)), Some((501, PAGE)));
        assert_eq!(w.room(), MAX_IN_FLIGHT);
    }
}
