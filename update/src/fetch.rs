//! When the box asks for the next pieces of a release: at most
//! [`WINDOW`] asked and not yet kept (so a link with a long round trip is
//! not idle between pieces), paced to the configured rate (a piece of
//! `len` bytes asked at `t` lets the next be asked at `t + len / rate`),
//! and asked again from what is held when the oldest gets no answer in
//! time (a lost stream, a controller that dropped it, a piece the worker
//! had no room for). Sans-IO: the caller passes `now` (ns on any monotonic
//! scale) and what the download holds.

use std::collections::VecDeque;

/// The largest piece asked for: well under the link's message cap, and
/// what the worker writes and hashes at once (bounded memory).
pub const CHUNK: u32 = 64 * 1024;

/// The most pieces asked and not yet kept.
pub const WINDOW: usize = 4;

/// A request to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The first byte asked for.
    pub offset: u64,
    /// How many.
    pub len: u32,
}

impl Request {
    fn end(&self) -> u64 {
        self.offset.saturating_add(u64::from(self.len))
    }
}

/// The pacing of one release's download.
#[derive(Clone, Debug)]
pub struct Fetch {
    size: u64,
    held: u64,
    rate: u64,
    /// The requests waiting for their pieces, oldest first, and when each
    /// was sent.
    asked: VecDeque<(Request, u64)>,
    /// Where the next request starts.
    next_offset: u64,
    /// No request before this.
    next_at: u64,
    /// Times the window was asked again with nothing kept since the last.
    stalls: u32,
    /// What was held when the window was last asked again.
    held_at_stall: u64,
}

/// How many times in a row the window is asked again with nothing kept
/// before the download is given up ([`Fetch::stalled`]).
pub const STALLS: u32 = 6;

impl Fetch {
    /// A download of `size` bytes with `held` kept already, at most `rate`
    /// bytes a second (at least 1), starting at `now`.
    pub fn new(size: u64, held: u64, rate: u64, now: u64) -> Fetch {
        let held = held.min(size);
        Fetch {
            size,
            held,
            rate: rate.max(1),
            asked: VecDeque::new(),
            next_offset: held,
            next_at: now,
            stalls: 0,
            held_at_stall: held,
        }
    }

    /// The bytes kept.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Whether every byte is kept.
    pub fn is_complete(&self) -> bool {
        self.held >= self.size
    }

    /// How long a piece of `len` bytes takes at the rate, in ns.
    fn spacing(&self, len: u32) -> u64 {
        u64::from(len).saturating_mul(1_000_000_000) / self.rate
    }

    /// How long the oldest answer may take before the pieces are asked
    /// again: four times the window's spacing, and at least 10 s (a
    /// controller reading its store, a stream reconnecting).
    fn patience(&self) -> u64 {
        self.spacing(CHUNK)
            .saturating_mul(4 * WINDOW as u64)
            .max(10_000_000_000)
    }

    /// The next request to send at `now`, if one is due (call until
    /// `None`): room in the window and the pace allowing; when the oldest
    /// request waited past its patience, the window starts again from
    /// what is held.
    pub fn due(&mut self, now: u64) -> Option<Request> {
        if self.is_complete() {
            return None;
        }
        if let Some((_, at)) = self.asked.front()
            && now >= at.saturating_add(self.patience())
        {
            self.stalls = if self.held == self.held_at_stall {
                self.stalls + 1
            } else {
                1
            };
            self.held_at_stall = self.held;
            if self.stalled() {
                // The last asking had its patience: given up.
                self.asked.clear();
                return None;
            }
            self.ask_again();
        }
        if self.asked.len() >= WINDOW || now < self.next_at || self.next_offset >= self.size {
            return None;
        }
        let left = self.size - self.next_offset;
        let len = u32::try_from(left.min(u64::from(CHUNK))).unwrap_or(CHUNK);
        let r = Request {
            offset: self.next_offset,
            len,
        };
        self.asked.push_back((r, now));
        self.next_offset = r.end();
        self.next_at = now.saturating_add(self.spacing(len));
        Some(r)
    }

    /// When [`Fetch::due`] may next have a request (`None`: complete).
    pub fn wake_at(&self) -> Option<u64> {
        if self.is_complete() {
            return None;
        }
        let give_up = self
            .asked
            .front()
            .map(|(_, at)| at.saturating_add(self.patience()));
        let room = self.asked.len() < WINDOW && self.next_offset < self.size;
        let next = room.then_some(self.next_at);
        [give_up, next].into_iter().flatten().min()
    }

    /// Forgets the requests waiting (a new stream: the old one's answers
    /// will not come) and asks again from what is held.
    pub fn ask_again(&mut self) {
        self.asked.clear();
        self.next_offset = self.held;
    }

    /// A new stream (the release offered again): asked again from what is
    /// held, the silences of the stream before forgotten.
    pub fn new_stream(&mut self) {
        self.ask_again();
        self.stalls = 0;
        self.held_at_stall = self.held;
    }

    /// Whether the window was asked again [`STALLS`] times in a row with
    /// nothing kept: the controller does not answer (or answers wrongly);
    /// the download is given up.
    pub fn stalled(&self) -> bool {
        self.stalls > STALLS
    }

    /// The download now holds `held` bytes: the requests it answered leave
    /// the window. An answer shorter than asked (the oldest request only
    /// partly kept) leaves the rest of the window as gaps: it is asked
    /// again at once from what is held.
    pub fn kept(&mut self, held: u64) {
        self.held = held.min(self.size).max(self.held);
        while self
            .asked
            .front()
            .is_some_and(|(r, _)| r.end() <= self.held)
        {
            self.asked.pop_front();
        }
        if self
            .asked
            .front()
            .is_some_and(|(r, _)| r.offset < self.held)
        {
            self.ask_again();
        }
        self.next_offset = self.next_offset.max(self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const K: u64 = CHUNK as u64;

    #[test]
    fn a_window_of_pieces_at_the_configured_rate() {
        // 10 pieces at a piece a second.
        let mut f = Fetch::new(10 * K, 0, K, 0);
        assert_eq!(
            f.due(0),
            Some(Request {
                offset: 0,
                len: CHUNK
            })
        );
        assert_eq!(f.due(0), None, "the pace");
        assert_eq!(f.wake_at(), Some(S));
        for i in 1..4 {
            assert_eq!(f.due(i * S).map(|r| r.offset), Some(i * K));
        }
        // The window is full: nothing more, however long the pace allows.
        assert_eq!(f.due(5 * S), None);
        // Two answered: room for two more, at the pace.
        f.kept(2 * K);
        assert_eq!(f.due(5 * S).map(|r| r.offset), Some(4 * K));
        assert_eq!(f.due(5 * S), None);
        assert_eq!(f.due(6 * S).map(|r| r.offset), Some(5 * K));
    }

    #[test]
    fn unanswered_pieces_are_asked_again_from_what_is_held() {
        let mut f = Fetch::new(10 * K, 0, 100 * K, 0);
        let asked: Vec<u64> = (0..4)
            .filter_map(|i| f.due(i * S / 10))
            .map(|r| r.offset)
            .collect();
        assert_eq!(asked, vec![0, K, 2 * K, 3 * K]);
        // The first kept; the second lost (the worker had no room), so
        // the rest are gaps and never kept.
        f.kept(K);
        assert_eq!(f.due(S).map(|r| r.offset), Some(4 * K), "room for one");
        assert_eq!(f.due(S), None);
        // The oldest waited past its patience (10 s): again from 1 piece.
        let patience_end = S / 10 + 10 * S;
        assert_eq!(f.wake_at(), Some(patience_end));
        assert_eq!(f.due(patience_end).map(|r| r.offset), Some(K));
    }

    #[test]
    fn a_short_answer_is_asked_again_at_once_and_silence_is_given_up() {
        let mut f = Fetch::new(10 * K, 0, 100 * K, 0);
        for i in 0..4 {
            assert!(f.due(i * S).is_some());
        }
        // Half the first piece came.
        f.kept(K / 2);
        assert_eq!(
            f.due(4 * S).map(|r| r.offset),
            Some(K / 2),
            "the rest, at once"
        );
        // Then nothing, ever: given up after STALLS patiences.
        let mut now = 4 * S;
        for _ in 0..STALLS {
            now += 11 * S;
            assert!(f.due(now).is_some(), "asked again");
            while f.due(now).is_some() {}
            assert!(!f.stalled());
        }
        // The last asking had its patience too: given up, nothing asked.
        now += 11 * S;
        assert_eq!(f.due(now), None);
        assert!(f.stalled());
        // A new stream starts afresh.
        f.new_stream();
        assert!(!f.stalled());
        assert_eq!(f.due(now).map(|r| r.offset), Some(K / 2));
    }

    #[test]
    fn a_resumed_download_asks_from_what_is_held_and_never_goes_back() {
        let mut f = Fetch::new(100_000, 70_000, 1 << 20, 0);
        assert_eq!(
            f.due(0),
            Some(Request {
                offset: 70_000,
                len: 30_000
            })
        );
        assert_eq!(f.due(S), None, "nothing left to ask");
        f.kept(60_000); // a stale report: never back
        assert_eq!(f.held(), 70_000);
        f.kept(200_000); // never past the size
        assert!(f.is_complete());
        assert_eq!((f.due(2 * S), f.wake_at()), (None, None));
    }
}
