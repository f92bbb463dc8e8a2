//! The bytes of one feedback record in the journal's outbox: the typed
//! [`Record`] of `baton_proto::feedback`, encoded compactly, and read back
//! (on the link thread) whatever agent version wrote it.
//!
//! Two formats, told apart by their first byte:
//!
//! | first byte | format | written by |
//! |---|---|---|
//! | `0xB1` | binary v1: the byte, then a protobuf message ([`Stored`]) | this agent |
//! | `{` | JSON (an object with `event`) | agents before the binary outbox |
//!
//! So an outbox written before an upgrade still drains after it, and a
//! later format takes another first byte. Protobuf (prost, already the
//! wire's codec) keeps a v1 record readable when fields are added: a
//! reader skips what it does not know. What the binary form saves (a
//! firing's record is ~50 bytes instead of ~300 of JSON; the journal is
//! most of what an edge box writes to its flash):
//! - the execution id is not stored: it is rebuilt from its parts;
//! - times are deltas (scheduled from the occurrence, actual from
//!   scheduled, lateness from actual − scheduled), mostly 0 or a few bytes;
//! - words (event, outcome, reason, clock, action) are small numbers,
//!   packed into one varint;
//! - the tenant `default` (the pack language's default) is left out.
//!
//! Nothing is ever dropped: a record [`decode`] cannot read comes back as
//! [`Decoded::Unreadable`] with its text, which the link still sends.

use baton_proto::RefTime;
use baton_proto::feedback::{
    ClockSource, ClockState, Event, Outcome, Reason, Record, parse_execution_id,
};
use prost::Message;

/// First byte of a binary v1 record.
pub const BINARY_V1: u8 = 0xB1;

/// Action names stored as numbers (index + 1); any other name is stored as
/// text.
const ACTIONS: [&str; 6] = [
    "gpio.write",
    "gpio.toggle",
    "gpio.pulse",
    "gpio.read",
    "exec",
    "noop",
];

/// The tenant a pack has without a `tenant` key: stored as nothing (an
/// empty tenant is no valid id, so nothing is ambiguous).
const DEFAULT_TENANT: &str = "default";

/// Bit positions of the small numbers packed into [`Stored::codes`].
const OUTCOME_BITS: u32 = 0;
const EVENT_BITS: u32 = 4;
const SOURCE_BITS: u32 = 8;
const STATE_BITS: u32 = 11;
const ACTION_BITS: u32 = 14;
const REASON_BITS: u32 = 18;

/// Binary v1, field by field (all optional on the wire: zero is left out).
#[derive(Clone, PartialEq, Message)]
struct Stored {
    /// Empty for [`DEFAULT_TENANT`].
    #[prost(string, tag = "1")]
    tenant: String,
    #[prost(string, tag = "2")]
    pack: String,
    #[prost(uint64, tag = "3")]
    version: u64,
    #[prost(string, tag = "4")]
    instruction: String,
    #[prost(uint32, tag = "5")]
    attempt: u32,
    /// The occurrence, ns (absent: none).
    #[prost(sfixed64, optional, tag = "6")]
    occurrence: Option<i64>,
    /// `scheduled − occurrence` (or `scheduled` without an occurrence).
    #[prost(sint64, tag = "7")]
    scheduled: i64,
    /// `actual − scheduled`.
    #[prost(sint64, tag = "8")]
    actual: i64,
    /// `lateness − (actual − scheduled)`.
    #[prost(sint64, tag = "9")]
    lateness: i64,
    #[prost(sint64, tag = "10")]
    uncertainty_ns: i64,
    /// Outcome, event, clock source and state, action (index + 1 into
    /// [`ACTIONS`]; 0: none, or the name in `action_name`) and reason
    /// codes, 0 for none, at the `*_BITS` positions: one varint of 3 bytes.
    #[prost(uint32, tag = "11")]
    codes: u32,
    #[prost(string, tag = "12")]
    detail: String,
    #[prost(uint32, optional, tag = "13")]
    value: Option<u32>,
    #[prost(string, tag = "14")]
    action_name: String,
}

/// The number at `bits` of `codes` (4 bits; 3 for clock, 5 for reasons).
fn field(codes: u32, bits: u32, width: u32) -> i32 {
    ((codes >> bits) & ((1 << width) - 1)) as i32
}

/// Appends `r`'s binary v1 form to `out`.
pub fn encode(r: &Record, out: &mut Vec<u8>) {
    let occ = r.occurrence.map(RefTime::as_nanos);
    let scheduled = r.scheduled.as_nanos();
    let actual = r.actual.as_nanos().wrapping_sub(scheduled);
    let (action, action_name) = match ACTIONS.iter().position(|a| *a == r.action) {
        Some(i) => (i as u32 + 1, String::new()),
        None => (0, r.action.clone()),
    };
    let code = |c: i32| c as u32;
    let codes = code(r.outcome.code()) << OUTCOME_BITS
        | code(r.event.code()) << EVENT_BITS
        | code(r.clock_source.map_or(0, ClockSource::code)) << SOURCE_BITS
        | code(r.clock_state.map_or(0, ClockState::code)) << STATE_BITS
        | action << ACTION_BITS
        | code(r.reason.map_or(0, Reason::code)) << REASON_BITS;
    let tenant = if r.tenant == DEFAULT_TENANT {
        String::new()
    } else {
        r.tenant.clone()
    };
    let s = Stored {
        tenant,
        pack: r.pack.clone(),
        version: r.version,
        instruction: r.instruction.clone(),
        attempt: r.attempt,
        occurrence: occ,
        scheduled: scheduled.wrapping_sub(occ.unwrap_or(0)),
        actual,
        lateness: r.lateness_ns.wrapping_sub(actual),
        uncertainty_ns: r.uncertainty_ns,
        codes,
        detail: r.detail.clone(),
        value: r.value,
        action_name,
    };
    out.reserve(1 + s.encoded_len());
    out.push(BINARY_V1);
    // A Vec grows as needed: encoding into it cannot fail.
    let _ = s.encode(out);
}

/// What an outbox record holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A record, typed.
    Record(Record),
    /// Bytes no format here reads (or a record naming values this build
    /// does not know): the text to send as it is.
    Unreadable(String),
}

/// Reads an outbox record, binary or legacy JSON.
pub fn decode(bytes: &[u8]) -> Decoded {
    let typed = match bytes.first() {
        Some(&BINARY_V1) => decode_binary(&bytes[1..]),
        Some(b'{') => decode_json(bytes),
        _ => None,
    };
    match typed {
        Some(r) => Decoded::Record(r),
        None => Decoded::Unreadable(unreadable_text(bytes)),
    }
}

/// The text sent for an unreadable record: its bytes when they are text,
/// else in hex (a binary record must reach the controller intact).
fn unreadable_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => {
            let mut s = String::with_capacity(4 + bytes.len() * 2);
            s.push_str("hex:");
            for b in bytes {
                s.push_str(&format!("{b:02x}"));
            }
            s
        }
    }
}

fn decode_binary(bytes: &[u8]) -> Option<Record> {
    let s = Stored::decode(bytes).ok()?;
    let event = Event::from_code(field(s.codes, EVENT_BITS, 4))?;
    let outcome = Outcome::from_code(field(s.codes, OUTCOME_BITS, 4))?;
    let occurrence = s.occurrence.map(RefTime::from_nanos);
    let scheduled = s.scheduled.wrapping_add(s.occurrence.unwrap_or(0));
    let actual = scheduled.wrapping_add(s.actual);
    let action = match field(s.codes, ACTION_BITS, 4) {
        0 => s.action_name,
        n => ACTIONS.get(n as usize - 1)?.to_string(),
    };
    let reason = match field(s.codes, REASON_BITS, 5) {
        0 => None,
        // A reason this build does not know reads as none (the wire's rule).
        n => Reason::from_code(n),
    };
    Some(Record {
        tenant: if s.tenant.is_empty() {
            DEFAULT_TENANT.to_string()
        } else {
            s.tenant
        },
        pack: s.pack,
        version: s.version,
        instruction: s.instruction,
        attempt: s.attempt,
        occurrence,
        scheduled: RefTime::from_nanos(scheduled),
        actual: RefTime::from_nanos(actual),
        lateness_ns: s.lateness.wrapping_add(s.actual),
        uncertainty_ns: s.uncertainty_ns,
        clock_source: ClockSource::from_code(field(s.codes, SOURCE_BITS, 3)),
        clock_state: ClockState::from_code(field(s.codes, STATE_BITS, 3)),
        event,
        outcome,
        reason,
        detail: s.detail,
        value: s.value,
        action,
    })
}

/// The JSON records agents wrote before the binary outbox (see the git
/// history of `runtime/feedback.rs`): `executed` records with a `result`
/// word (`late` / `withdrawn` / `stopped` for attempts not run), core events
/// with `t_ns` and `occurrence_ns`.
fn decode_json(bytes: &[u8]) -> Option<Record> {
    use serde_json::Value;
    let v: Value = serde_json::from_slice(bytes).ok()?;
    let v = v.as_object()?;
    let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default();
    let int = |k: &str| v.get(k).and_then(Value::as_i64).unwrap_or_default();
    let event = Event::parse(v.get("event")?.as_str()?)?;
    let (tenant, pack) = text("pack").split_once('/').unwrap_or(("", ""));
    // Side actions carried a descriptive id that is not an execution id
    // (`tenant/pack safe_state (cancel)@ns`): only a real one names one.
    let id = parse_execution_id(text("execution_id"));
    let version = id
        .map(|i| i.version)
        .or_else(|| v.get("version").and_then(Value::as_u64))
        .unwrap_or_default();
    let detail = text("detail").to_string();
    let mut reason = None;
    let mut r = Record {
        tenant: tenant.to_string(),
        pack: pack.to_string(),
        version,
        instruction: text("instruction").to_string(),
        attempt: id.map_or(0, |i| i.attempt),
        uncertainty_ns: int("uncertainty_ns"),
        event,
        action: text("action").to_string(),
        value: v
            .get("value")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok()),
        ..Record::default()
    };
    if event == Event::Executed {
        r.outcome = match text("result") {
            "ok" => Outcome::Ok,
            "failed" => Outcome::Failed,
            word => {
                reason = Some(match word {
                    "late" => Reason::Late,
                    "withdrawn" => Reason::Withdrawn,
                    // The dispatcher stopped first: the agent was stopping.
                    "stopped" => Reason::Shutdown,
                    _ => return None,
                });
                Outcome::Skipped
            }
        };
        r.occurrence = id.map(|i| i.occurrence);
        r.scheduled = RefTime::from_nanos(int("scheduled_ns"));
        r.actual = RefTime::from_nanos(int("actual_ns"));
        r.lateness_ns = int("lateness_ns");
    } else {
        r.outcome = event.outcome()?;
        let occ = v.get("occurrence_ns").and_then(Value::as_i64);
        r.occurrence = occ
            .or(id.map(|i| i.occurrence.as_nanos()))
            .map(RefTime::from_nanos);
        // A core event: when it was decided, about which occurrence.
        r.scheduled = RefTime::from_nanos(occ.unwrap_or_default());
        r.actual = RefTime::from_nanos(int("t_ns"));
        reason = match event {
            Event::OutcomeUnknown => Some(Reason::Crash),
            Event::SafeState => detail
                .strip_prefix("safe state (")
                .and_then(|d| d.strip_suffix(')'))
                .and_then(safe_reason_word),
            _ => None,
        };
    }
    r.reason = reason;
    r.detail = detail;
    Some(r)
}

/// The reason of a safe state's word as agents logged it (`SafeReason::as_str`).
fn safe_reason_word(w: &str) -> Option<Reason> {
    Some(match w {
        "give_up" => Reason::GiveUp,
        "cancel" => Reason::Cancel,
        "lease_lost" => Reason::Lease,
        "clock_lost" => Reason::Clock,
        "shutdown" => Reason::Shutdown,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            tenant: "plant-a".into(),
            pack: "press".into(),
            version: 7,
            instruction: "stamp".into(),
            attempt: 2,
            occurrence: Some(RefTime::from_nanos(1_796_000_000_000_000_000)),
            scheduled: RefTime::from_nanos(1_796_000_000_100_000_000),
            actual: RefTime::from_nanos(1_796_000_000_100_120_000),
            lateness_ns: 120_000,
            uncertainty_ns: 2_500,
            clock_source: Some(ClockSource::Ntp),
            clock_state: Some(ClockState::Locked),
            event: Event::Executed,
            outcome: Outcome::Ok,
            reason: None,
            detail: String::new(),
            value: Some(1),
            action: "gpio.read".into(),
        }
    }

    #[test]
    fn binary_round_trips_every_field_and_is_small() {
        let mut cases = vec![sample()];
        let mut r = sample();
        r.event = Event::Skip;
        r.outcome = Outcome::Skipped;
        r.reason = Some(Reason::UpstreamUnknown);
        r.detail = "upstream `x`: outcome unknown".into();
        r.value = None;
        r.action = "custom.action".into();
        r.clock_state = None;
        r.lateness_ns = -3;
        cases.push(r);
        let mut r = sample();
        r.occurrence = None;
        r.attempt = 0;
        r.scheduled = RefTime::from_nanos(i64::MIN);
        r.actual = RefTime::from_nanos(i64::MAX);
        r.clock_source = None;
        r.clock_state = None;
        cases.push(r);
        for r in cases {
            let mut buf = Vec::new();
            encode(&r, &mut buf);
            assert_eq!(buf[0], BINARY_V1);
            assert_eq!(decode(&buf), Decoded::Record(r.clone()), "{r:?}");
        }
        let mut buf = Vec::new();
        encode(&sample(), &mut buf);
        assert!(buf.len() <= 60, "a firing's record is {} bytes", buf.len());
        // The default tenant costs nothing and comes back.
        let mut r = sample();
        r.tenant = "default".into();
        let mut small = Vec::new();
        encode(&r, &mut small);
        assert_eq!(
            small.len() + 2 + "plant-a".len(),
            buf.len(),
            "tag, length, text"
        );
        assert_eq!(decode(&small), Decoded::Record(r));
    }

    #[test]
    fn anything_else_is_unreadable_with_its_text() {
        for raw in [
            &b"not json"[..],
            b"[1, 2]",
            b"{\"no_event\": 1}",
            b"{\"event\": \"dance\"}",
        ] {
            assert_eq!(
                decode(raw),
                Decoded::Unreadable(String::from_utf8_lossy(raw).into_owned())
            );
        }
        assert_eq!(decode(b""), Decoded::Unreadable(String::new()));
        // A binary record cut inside a field (the journal's checksum is what
        // catches a torn record; this is the codec's own refusal), or naming
        // an event this build does not know.
        let mut buf = Vec::new();
        encode(&sample(), &mut buf);
        let cut = &buf[..4];
        let Decoded::Unreadable(t) = decode(cut) else {
            panic!("a cut record read");
        };
        assert!(t.starts_with("hex:b1"), "{t}");
        let unknown = [BINARY_V1, 11 << 3, 0x7f];
        // (event 7, outcome 15: no outcome has that code)
        assert!(matches!(decode(&unknown), Decoded::Unreadable(_)));
    }
}
