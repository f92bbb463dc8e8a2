//! Time in the controller's records. Instants are [`RefTime`] (the
//! reference scale packs are written on: nanoseconds since the Unix
//! epoch) and spans are [`SignedDuration`] (clock offsets and lateness
//! can be negative), so an instant is never mixed up with a span or
//! subtracted as a bare integer. The store's columns, the stored rollout
//! documents and the wire keep integer nanoseconds: these are the
//! conversions their edges use.

pub use baton_proto::time::RefTime;
pub use jiff::SignedDuration;

/// A span from integer nanoseconds (a column, a wire field).
pub const fn span(ns: i64) -> SignedDuration {
    SignedDuration::from_nanos(ns)
}

/// A span as integer nanoseconds, saturating at the `i64` range (a span
/// made by [`span`] always fits exactly).
pub fn span_ns(d: SignedDuration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(if d.is_negative() { i64::MIN } else { i64::MAX })
}

/// A span's integer nanoseconds, at the edges that keep them (the wire,
/// the columns, JSON output): `d.nanos()` reads as `RefTime::as_nanos`.
pub trait SpanNanos {
    /// As [`span_ns`].
    fn nanos(self) -> i64;
}

impl SpanNanos for SignedDuration {
    fn nanos(self) -> i64 {
        span_ns(self)
    }
}

/// An instant from integer nanoseconds since the epoch.
pub const fn at(ns: i64) -> RefTime {
    RefTime::from_nanos(ns)
}

/// How far `later` is from `earlier`, signed (negative when `later` is
/// before it): what a bare `later_ns - earlier_ns` computed, without its
/// overflow.
pub fn between(earlier: RefTime, later: RefTime) -> SignedDuration {
    SignedDuration::from_nanos_i128(i128::from(later.as_nanos()) - i128::from(earlier.as_nanos()))
}

/// Serde forms of typed time as the integer nanoseconds the stored
/// rollout documents have always held (`#[serde(with = ...)]`), so a
/// document written before the types existed reads back the same.
pub mod ns {
    /// `RefTime` as an integer.
    pub mod instant {
        use super::super::RefTime;
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        /// As its nanoseconds.
        pub fn serialize<S: Serializer>(t: &RefTime, s: S) -> Result<S::Ok, S::Error> {
            t.as_nanos().serialize(s)
        }

        /// From nanoseconds.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RefTime, D::Error> {
            i64::deserialize(d).map(RefTime::from_nanos)
        }
    }

    /// `Option<RefTime>` as an integer or null.
    pub mod opt_instant {
        use super::super::RefTime;
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        /// As its nanoseconds, or null.
        pub fn serialize<S: Serializer>(t: &Option<RefTime>, s: S) -> Result<S::Ok, S::Error> {
            t.map(RefTime::as_nanos).serialize(s)
        }

        /// From nanoseconds, or null.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RefTime>, D::Error> {
            Option::<i64>::deserialize(d).map(|v| v.map(RefTime::from_nanos))
        }
    }

    /// `Option<SignedDuration>` as an integer or null.
    pub mod opt_span {
        use super::super::{SignedDuration, span, span_ns};
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        /// As its nanoseconds, or null.
        pub fn serialize<S: Serializer>(
            d: &Option<SignedDuration>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            d.map(span_ns).serialize(s)
        }

        /// From nanoseconds, or null.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<SignedDuration>, D::Error> {
            Option::<i64>::deserialize(d).map(|v| v.map(span))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_round_trip_through_nanoseconds() {
        for ns in [i64::MIN, -1_500, 0, 2_000_000, i64::MAX] {
            assert_eq!(span_ns(span(ns)), ns);
        }
    }

    #[test]
    fn stored_rollout_documents_keep_their_nanosecond_keys() {
        use crate::gate::GateRow;
        use crate::rollout_rows::CohortFigures;
        let g = GateRow {
            rollout: 2,
            from: Some(1),
            members_hold: true,
            keep_above: None,
            banned: Vec::new(),
            together: true,
            switch_at: Some(at(5)),
            held_back: Vec::new(),
        };
        let json = serde_json::to_value(&g).expect("encodes");
        assert_eq!(json["switch_at_ns"], 5);
        assert_eq!(serde_json::from_value::<GateRow>(json).expect("decodes"), g);
        // A document from before the field existed reads as none.
        let old: GateRow =
            serde_json::from_str(r#"{"rollout":2,"from":1,"members_hold":true}"#).expect("decodes");
        assert_eq!(old.switch_at, None);
        let f: CohortFigures = serde_json::from_str(
            r#"{"agents":1,"settled":2,"failed":0,"unknown":0,"lateness_p99_ns":7,"offset_max_ns":null}"#,
        )
        .expect("decodes");
        assert_eq!((f.lateness_p99, f.offset_max), (Some(span(7)), None));
        let json = serde_json::to_value(&f).expect("encodes");
        assert_eq!(
            (
                json["lateness_p99_ns"].as_i64(),
                json["offset_max_ns"].is_null()
            ),
            (Some(7), true)
        );
    }

    #[test]
    fn between_is_signed_and_does_not_overflow() {
        assert_eq!(between(at(10), at(4)), span(-6));
        assert_eq!(between(at(4), at(10)), span(6));
        assert_eq!(span_ns(between(RefTime::MIN, RefTime::MAX)), i64::MAX);
    }
}
