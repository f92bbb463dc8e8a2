//! Clock reports and last-seen marks of a drain, whatever the number of
//! agents: the history (one `INSERT … SELECT FROM unnest`), each agent's
//! latest report (one `UPDATE … FROM unnest`, only over an older one),
//! and each agent's connection state and last-seen instant (one more).

use std::collections::HashMap;

use postgres::{Statement, Transaction};

use super::fail;
use baton_model::SeenRow;
use baton_model::time::span_ns;
use baton_store::{ClockRow, StoreResult, fits};

/// This part's statements, prepared once per connection.
pub(super) struct Statements {
    history: Statement,
    latest: Statement,
    seen: Statement,
}

impl Statements {
    pub(super) fn prepare(c: &mut postgres::Client) -> Result<Statements, postgres::Error> {
        Ok(Statements {
            history: c.prepare(HISTORY_SQL)?,
            latest: c.prepare(LATEST_SQL)?,
            seen: c.prepare(SEEN_SQL)?,
        })
    }
}

/// One clock report of an agent's stream.
pub(super) struct Clock {
    pub agent: String,
    pub clock: ClockRow,
}

/// One last-seen mark of an agent's stream.
pub(super) struct Seen {
    pub agent: String,
    pub row: SeenRow,
}

/// Stores the clock reports the fence let through (`ok`), in two
/// statements.
pub(super) fn write_clocks(
    tx: &mut Transaction<'_>,
    st: &Statements,
    clocks: &[&Clock],
    count: &dyn Fn(u64),
) -> StoreResult<()> {
    if clocks.is_empty() {
        return Ok(());
    }
    let mut h = ClockColumns::default();
    for c in clocks {
        h.push(c);
    }
    tx.execute(&st.history, &h.params())
        .map_err(fail("store clock history"))?;
    // Each agent's newest of the drain: an UPDATE … FROM takes one row
    // per agent.
    let mut newest: HashMap<&str, &Clock> = HashMap::new();
    for c in clocks {
        let e = newest.entry(c.agent.as_str()).or_insert(c);
        if c.clock.at > e.clock.at {
            *e = c;
        }
    }
    let mut l = ClockColumns::default();
    for c in newest.values() {
        l.push(c);
    }
    tx.execute(&st.latest, &l.params())
        .map_err(fail("store the agents' latest clocks"))?;
    count(2);
    Ok(())
}

/// Stores the last-seen marks the fence let through, in one statement:
/// each agent's last of the drain (one stream's marks come in the order
/// it sent them).
pub(super) fn write_seen(
    tx: &mut Transaction<'_>,
    st: &Statements,
    seen: &[&Seen],
    count: &dyn Fn(u64),
) -> StoreResult<()> {
    if seen.is_empty() {
        return Ok(());
    }
    let mut last: HashMap<&str, &Seen> = HashMap::new();
    for s in seen {
        last.insert(s.agent.as_str(), s);
    }
    let mut c = SeenColumns::default();
    for s in last.values() {
        c.push(s)?;
    }
    tx.execute(&st.seen, &c.params())
        .map_err(fail("store when agents were seen"))?;
    count(1);
    Ok(())
}

#[derive(Default)]
struct ClockColumns<'a> {
    agent: Vec<&'a str>,
    at: Vec<i64>,
    source: Vec<&'a str>,
    state: Vec<&'a str>,
    offset: Vec<i64>,
    jitter: Vec<i64>,
    uncertainty: Vec<i64>,
    ppm: Vec<f64>,
}

impl<'a> ClockColumns<'a> {
    fn push(&mut self, c: &'a Clock) {
        self.agent.push(&c.agent);
        self.at.push(c.clock.at.as_nanos());
        self.source.push(&c.clock.source);
        self.state.push(&c.clock.state);
        self.offset.push(span_ns(c.clock.offset));
        self.jitter.push(span_ns(c.clock.jitter));
        self.uncertainty.push(span_ns(c.clock.uncertainty));
        self.ppm.push(c.clock.frequency_ppm);
    }

    fn params(&self) -> [&(dyn postgres::types::ToSql + Sync); 8] {
        [
            &self.agent,
            &self.at,
            &self.source,
            &self.state,
            &self.offset,
            &self.jitter,
            &self.uncertainty,
            &self.ppm,
        ]
    }
}

/// The reports as rows (a literal, for `concat!`).
macro_rules! clock_unnest {
    () => {
        "unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], \
         $7::bigint[], $8::float8[]) \
         AS u(agent_id, at_ns, source, state, offset_ns, jitter_ns, uncertainty_ns, frequency_ppm)"
    };
}

/// Every report, each stored once (its key is the agent and the instant
/// it was measured: a re-sent report changes nothing).
const HISTORY_SQL: &str = concat!(
    "INSERT INTO clock_reports (agent_id, at_ns, source, state, offset_ns, jitter_ns, \
     uncertainty_ns, frequency_ppm) SELECT * FROM ",
    clock_unnest!(),
    " ON CONFLICT DO NOTHING"
);

/// Each agent's latest report, over an older one only.
const LATEST_SQL: &str = concat!(
    "UPDATE agents a SET clock_source = u.source, clock_state = u.state, \
     clock_offset_ns = u.offset_ns, clock_jitter_ns = u.jitter_ns, \
     clock_uncertainty_ns = u.uncertainty_ns, clock_frequency_ppm = u.frequency_ppm, \
     clock_at_ns = u.at_ns FROM ",
    clock_unnest!(),
    " WHERE a.id = u.agent_id AND (a.clock_at_ns IS NULL OR a.clock_at_ns < u.at_ns)"
);

/// Each agent's connection state and last-seen instant (its lateness
/// p99 where the stream measured one).
const SEEN_SQL: &str = "UPDATE agents a SET connected = u.connected, last_seen_ns = u.at_ns, \
    lateness_p99_ns = COALESCE(u.p99, a.lateness_p99_ns), \
    outbox_entries = COALESCE(u.outbox, a.outbox_entries), \
    outbox_growing = COALESCE(u.growing, a.outbox_growing), \
    late_recently = COALESCE(u.late, a.late_recently) \
    FROM unnest($1::text[], $2::int4[], $3::bigint[], $4::bigint[], $5::bigint[], $6::int4[], $7::int4[]) \
    AS u(id, connected, at_ns, p99, outbox, growing, late) \
    WHERE a.id = u.id";

/// [`SEEN_SQL`]'s arrays, one element per agent.
#[derive(Default)]
struct SeenColumns<'a> {
    id: Vec<&'a str>,
    connected: Vec<i32>,
    at: Vec<i64>,
    p99: Vec<Option<i64>>,
    outbox: Vec<Option<i64>>,
    growing: Vec<Option<i32>>,
    late: Vec<Option<i32>>,
}

impl<'a> SeenColumns<'a> {
    fn push(&mut self, s: &'a Seen) -> StoreResult<()> {
        let (r, h) = (&s.row, s.row.health);
        self.id.push(&s.agent);
        self.connected.push(i32::from(r.connected));
        self.at.push(r.at.as_nanos());
        self.p99.push(r.lateness_p99.map(span_ns));
        self.outbox.push(
            h.map(|h| fits(h.outbox_entries, "outbox entries"))
                .transpose()?,
        );
        self.growing.push(h.map(|h| i32::from(h.outbox_growing)));
        self.late.push(h.map(|h| i32::from(h.late_recently)));
        Ok(())
    }

    fn params(&self) -> [&(dyn postgres::types::ToSql + Sync); 7] {
        [
            &self.id,
            &self.connected,
            &self.at,
            &self.p99,
            &self.outbox,
            &self.growing,
            &self.late,
        ]
    }
}
