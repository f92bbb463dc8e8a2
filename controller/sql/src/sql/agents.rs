//! Agents: their records, own labels, operator labels, tenants and clock.

use std::collections::{BTreeSet, HashMap};

use super::codec::{
    CLOCK_COLUMNS, decode_clock, from_json, instant_col, span_col, to_json, u64_from_db, with_row,
};
use super::db::{
    Db, Param, Row, chunks, col, json_array, json_array_values, params, placeholders, query_all,
    query_first, run,
};
use baton_model::time::{self, span_ns};
use baton_store::{
    AgentFilter, AgentRow, Binding, ClockRow, FleetCounts, FleetState, HelloRow, LabelMatch,
    LabelOverrides, MAX_PAGE, StoreError, StoreResult, StreamHealth, TrustRow, UpdateRow, page,
};

/// Now on the clock leases are measured with, in microseconds since the
/// epoch (see `Engine::lease_clock`).
pub type LeaseClock = fn(&dyn Db) -> StoreResult<i64>;

const AGENT_COLUMNS: &str = "id, labels, agent_version, journal_id, connected, last_seen_ns, \
     session_gen, owner, lateness_p99_ns, clock_source, clock_state, clock_offset_ns, clock_jitter_ns, clock_uncertainty_ns, \
     clock_frequency_ppm, clock_at_ns, outbox_entries, outbox_growing, late_recently, trust, arch, agent_update";

fn decode_agent(row: &dyn Row) -> StoreResult<AgentRow> {
    let id: String = col(row, "id")?;
    let r = (|| {
        let labels: String = col(row, "labels")?;
        let clock = match col::<Option<i64>>(row, "clock_at_ns")? {
            None => None,
            Some(at_ns) => Some(ClockRow {
                source: col(row, "clock_source")?,
                state: col(row, "clock_state")?,
                offset: span_col(row, "clock_offset_ns")?,
                jitter: span_col(row, "clock_jitter_ns")?,
                uncertainty: span_col(row, "clock_uncertainty_ns")?,
                frequency_ppm: col(row, "clock_frequency_ppm")?,
                at: time::at(at_ns),
            }),
        };
        let mut a = AgentRow::new(id.clone(), col::<String>(row, "journal_id")?);
        a.labels = from_json(&labels, "labels")?;
        a.agent_version = col(row, "agent_version")?;
        a.connected = col::<i64>(row, "connected")? != 0;
        a.last_seen = instant_col(row, "last_seen_ns")?;
        a.session_gen = u64_from_db(col(row, "session_gen")?, "session_gen")?;
        a.owner = col(row, "owner")?;
        a.lateness_p99 = span_col(row, "lateness_p99_ns")?;
        a.health = StreamHealth {
            outbox_entries: u64_from_db(col(row, "outbox_entries")?, "outbox entries")?,
            outbox_growing: col::<i64>(row, "outbox_growing")? != 0,
            late_recently: col::<i64>(row, "late_recently")? != 0,
        };
        a.clock = clock;
        a.trust = col::<Option<String>>(row, "trust")?
            .map(|t| from_json(&t, "trust"))
            .transpose()?;
        a.arch = col(row, "arch")?;
        a.update = col::<Option<String>>(row, "agent_update")?
            .map(|u| from_json(&u, "agent_update"))
            .transpose()?;
        Ok(a)
    })();
    with_row(format_args!("agent {id}"), r)
}

/// Operator labels and tenants of the agents with ids in `[first, last]`
/// (one page, in the database's order), attached to `agents`. `tenant`: the page
/// holds only agents serving it, so only theirs are read (a sparse page's
/// range may span many other tenants' agents).
fn attach(conn: &dyn Db, agents: &mut [AgentRow], tenant: Option<&str>) -> StoreResult<()> {
    let (Some(first), Some(last)) = (agents.first(), agents.last()) else {
        return Ok(());
    };
    let (first, last) = (first.id.clone(), last.id.clone());
    attach_where(
        conn,
        agents,
        "x.agent_id >= ?1 AND x.agent_id <= ?2 \
         AND (CAST(?3 AS TEXT) IS NULL OR EXISTS (SELECT 1 FROM agent_tenants t \
         WHERE t.agent_id = x.agent_id AND t.tenant = ?3))",
        params![first, last, tenant],
    )
}

/// Operator labels and tenants of the agents `which` (a condition on
/// `agent_id`, of the table named `x`, with its parameters) selects, attached to `agents` (in any
/// order: the database's collation may sort ids otherwise than Rust).
fn attach_where(
    conn: &dyn Db,
    agents: &mut [AgentRow],
    which: &str,
    p: &[Param<'_>],
) -> StoreResult<()> {
    let labels = query_all(
        conn,
        &format!(
            "SELECT agent_id, tenant, key, value FROM agent_labels x WHERE {which} \
             ORDER BY agent_id, tenant, key"
        ),
        p,
        |r| {
            Ok((
                col::<String>(r, "agent_id")?,
                col::<String>(r, "tenant")?,
                col::<String>(r, "key")?,
                col::<Option<String>>(r, "value")?,
            ))
        },
    )?;
    let at: HashMap<String, usize> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| (a.id.clone(), i))
        .collect();
    for (agent, tenant, key, value) in labels {
        if let Some(&i) = at.get(&agent) {
            agents[i]
                .overrides
                .entry(tenant)
                .or_default()
                .insert(key, value);
        }
    }
    let tenants = query_all(
        conn,
        &format!("SELECT agent_id, tenant FROM agent_tenants x WHERE {which}"),
        p,
        |r| Ok((col::<String>(r, "agent_id")?, col::<String>(r, "tenant")?)),
    )?;
    for (agent, tenant) in tenants {
        if let Some(&i) = at.get(&agent) {
            agents[i].tenants.insert(tenant);
        }
    }
    Ok(())
}

/// The agents with these ids (unknown ids skipped), in id order: three
/// statements per run of ids ([`chunks`]), where [`load_agent`] one by
/// one is three per agent (a push to thousands of agents is planned in one
/// transaction; on a networked engine each statement is a round trip).
pub(crate) fn load_agents(conn: &dyn Db, ids: &[&str]) -> StoreResult<Vec<AgentRow>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in chunks(ids) {
        let list = placeholders(1, chunk.len());
        let p: Vec<Param<'_>> = chunk.iter().map(|id| Param::Text(id)).collect();
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id IN {list}");
        let mut rows = query_all(conn, &sql, &p, decode_agent)?;
        attach_where(conn, &mut rows, &format!("agent_id IN {list}"), &p)?;
        out.extend(rows);
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// [`load_agents`] on PostgreSQL: three statements for any number of
/// ids, passed as one JSON array (the fleet bench's replicas spent
/// 50–70 ms of server time a push round to 3 000 agents reading their
/// records 64 at a time).
pub(crate) fn load_agents_as_array(conn: &dyn Db, ids: &[&str]) -> StoreResult<Vec<AgentRow>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let list = json_array(ids)?;
    let p = [Param::Text(&list)];
    let ids = json_array_values(1);
    let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id IN {ids}");
    let mut rows = query_all(conn, &sql, &p, decode_agent)?;
    attach_where(conn, &mut rows, &format!("agent_id IN {ids}"), &p)?;
    rows.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(rows)
}

pub(crate) fn load_agent(conn: &dyn Db, id: &str) -> StoreResult<Option<AgentRow>> {
    let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1");
    let mut rows = query_all(conn, &sql, params![id], decode_agent)?;
    attach(conn, &mut rows, None)?;
    Ok(rows.pop())
}

/// One page of agents. Without a label, state or text the page is a run
/// of ids (its labels and tenants read by range); with one, its agents
/// may lie anywhere in the fleet, and theirs are read by id. With a
/// label, each of its two sources ([`Source`]) gives its first page, and
/// the page is the first of both (they are disjoint, each in id order).
pub(crate) fn agents_page(
    conn: &dyn Db,
    f: &AgentFilter,
    binding: Binding,
) -> StoreResult<Vec<AgentRow>> {
    let limit = page(f.limit, MAX_PAGE);
    let visible = visible_to(f, binding);
    let pattern = f.text.as_deref().map(like_pattern);
    let mut rows = Vec::new();
    for source in Source::of(f) {
        let mut p = Vec::new();
        let (from, mut conds, order) = source.sql(f.labels_of(), &mut p);
        conds.extend(conditions(
            visible,
            f.labels_of(),
            pattern.as_deref(),
            &mut p,
        ));
        conds.push(state_condition(f.state, f.tenant.as_deref(), &mut p));
        if let Some(after) = &f.after_id {
            conds.push(format!("{order} > {}", arg(&mut p, Param::Text(after))));
        }
        let sql = format!(
            "SELECT {} FROM {from} WHERE {} ORDER BY {order} LIMIT {}",
            agent_columns_of_a(),
            conds.join(" AND "),
            arg(&mut p, Param::Int(i64::from(limit)))
        );
        rows.extend(query_all(conn, &sql, &p, decode_agent)?);
    }
    // Each source's page is in id order (bytes, as Rust compares them).
    rows.sort_by(|a, b| a.id.cmp(&b.id));
    rows.truncate(limit as usize);
    if f.label.is_none() && f.state.is_none() && f.text.is_none() {
        attach(conn, &mut rows, visible)?;
    } else {
        attach_by_id(conn, &mut rows)?;
    }
    Ok(rows)
}

/// The agents `f` matches (tenant, label, text), counted by state in one
/// pass per source: at 100 000 agents a scan of the table, or of the rows
/// a label finds through its index.
pub(crate) fn agent_counts(
    conn: &dyn Db,
    f: &AgentFilter,
    binding: Binding,
) -> StoreResult<FleetCounts> {
    let visible = visible_to(f, binding);
    let pattern = f.text.as_deref().map(like_pattern);
    let mut total = FleetCounts::default();
    for source in Source::of(f) {
        let mut p = Vec::new();
        let (from, mut conds, _) = source.sql(f.labels_of(), &mut p);
        conds.extend(conditions(
            visible,
            f.labels_of(),
            pattern.as_deref(),
            &mut p,
        ));
        let sql = format!(
            "SELECT COUNT(*) AS total, \
             COALESCE(SUM(CASE WHEN a.connected <> 0 THEN 1 ELSE 0 END), 0) AS connected, \
             COALESCE(SUM(CASE WHEN {NOT_LOCKED} THEN 1 ELSE 0 END), 0) AS not_locked \
             FROM {from} WHERE {}",
            conds.join(" AND ")
        );
        let counts = query_first(conn, &sql, &p, |r| {
            let total = u64_from_db(col(r, "total")?, "agent count")?;
            let connected = u64_from_db(col(r, "connected")?, "agent count")?;
            Ok(FleetCounts {
                total,
                connected,
                offline: total.saturating_sub(connected),
                clock_not_locked: u64_from_db(col(r, "not_locked")?, "agent count")?,
            })
        })?
        .unwrap_or_default();
        total.total += counts.total;
        total.connected += counts.connected;
        total.offline += counts.offline;
        total.clock_not_locked += counts.clock_not_locked;
    }
    Ok(total)
}

/// [`AGENT_COLUMNS`] of the agents table named `a` (a query that joins
/// it to a label table).
fn agent_columns_of_a() -> String {
    AGENT_COLUMNS
        .split(',')
        .map(|c| format!("a.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An agent (`a`) whose clock is not locked: offline (its last report
/// says nothing of now), no report, a stale one (older than
/// [`baton_model::CLOCK_STALE_NS`] before it was last seen), or another
/// state.
const NOT_LOCKED: &str = "(a.connected = 0 OR a.clock_at_ns IS NULL OR a.clock_state <> 'locked' \
     OR a.clock_at_ns < a.last_seen_ns - 30000000000)";

/// An agent (`a`) whose stream measured something to look at: an outbox
/// that only grows, or a firing skipped as late within the last minute
/// ([`baton_model::StreamHealth`]).
const STREAM_UNHEALTHY: &str = "(a.outbox_growing <> 0 OR a.late_recently <> 0)";

/// The tenant whose agents alone `f` sees under `binding` (`None`: all).
fn visible_to(f: &AgentFilter, binding: Binding) -> Option<&str> {
    match binding {
        Binding::Tenants => f.tenant.as_deref(),
        Binding::Open => None,
    }
}

/// Where a query's agents come from. Without a label, every agent. With
/// one, two disjoint sources, each read in id order through an index
/// that leads with the label (so a label few agents carry costs a few
/// rows, and one most carry costs a page, whatever the fleet's size):
/// the agents whose own label matches and which the tenant's operator
/// labels leave alone (no operator label of that key), and the agents
/// whose operator label of the tenant matches (an operator label wins
/// over the agent's own; a `NULL` one hides it). Another tenant's
/// operator labels are never read.
#[derive(Clone, Copy)]
enum Source<'a> {
    All,
    Own(&'a LabelMatch),
    Operator(&'a LabelMatch),
}

impl<'a> Source<'a> {
    fn of(f: &'a AgentFilter) -> Vec<Source<'a>> {
        match &f.label {
            None => vec![Source::All],
            Some(m) => vec![Source::Own(m), Source::Operator(m)],
        }
    }

    /// `FROM …` (with the agent as `a`), the source's own conditions (its
    /// parameters pushed on `p`) and the column its ids are read in order
    /// of.
    fn sql(
        self,
        labels_of: &'a str,
        p: &mut Vec<Param<'a>>,
    ) -> (&'static str, Vec<String>, &'static str) {
        match self {
            Source::All => ("agents a", Vec::new(), "a.id"),
            Source::Own(m) => {
                let key = arg(p, Param::Text(&m.key));
                let tenant = arg(p, Param::Text(labels_of));
                let mut conds = vec![format!("l.key = {key}")];
                if let Some(v) = &m.value {
                    conds.push(format!("l.value = {}", arg(p, Param::Text(v))));
                }
                conds.push(format!(
                    "NOT EXISTS (SELECT 1 FROM agent_labels o WHERE o.agent_id = l.agent_id \
                     AND o.tenant = {tenant} AND o.key = {key})"
                ));
                (
                    "agent_own_labels l JOIN agents a ON a.id = l.agent_id",
                    conds,
                    "l.agent_id",
                )
            }
            Source::Operator(m) => {
                let tenant = arg(p, Param::Text(labels_of));
                let key = arg(p, Param::Text(&m.key));
                let value = match &m.value {
                    Some(v) => format!("ol.value = {}", arg(p, Param::Text(v))),
                    None => "ol.value IS NOT NULL".to_string(),
                };
                (
                    "agent_labels ol JOIN agents a ON a.id = ol.agent_id",
                    vec![
                        format!("ol.tenant = {tenant}"),
                        format!("ol.key = {key}"),
                        value,
                    ],
                    "ol.agent_id",
                )
            }
        }
    }
}

/// `v` as the next numbered parameter: its placeholder.
fn arg<'a>(p: &mut Vec<Param<'a>>, v: Param<'a>) -> String {
    p.push(v);
    format!("?{}", p.len())
}

/// `text` as a `LIKE` pattern matching it anywhere, taken as written
/// (`\`, `%` and `_` escaped with `\`), its ASCII letters in lower case
/// (the column side is `LOWER`ed too).
fn like_pattern(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('%');
    for c in text.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c.to_ascii_lowercase());
    }
    out.push('%');
    out
}

/// The SQL of a state condition on `a` (`1 = 1`: any); a refusal counts
/// only of `tenant`'s deliveries (another tenant's are not its to see).
fn state_condition<'a>(
    state: Option<FleetState>,
    tenant: Option<&'a str>,
    p: &mut Vec<Param<'a>>,
) -> String {
    match state {
        None => "1 = 1".into(),
        Some(FleetState::Connected) => "a.connected <> 0".into(),
        Some(FleetState::Offline) => "a.connected = 0".into(),
        Some(FleetState::ClockNotLocked) => NOT_LOCKED.into(),
        Some(FleetState::Unhealthy) => {
            let tenant = match tenant {
                Some(t) => format!(" AND d.tenant = {}", arg(p, Param::Text(t))),
                None => String::new(),
            };
            format!(
                "({NOT_LOCKED} OR {STREAM_UNHEALTHY} OR EXISTS (SELECT 1 FROM deliveries d \
                 WHERE d.agent_id = a.id AND d.state = 'nacked'{tenant}))"
            )
        }
    }
}

/// The tenant (`visible`: whose agents alone are seen, if any) and text
/// conditions on `a`, their parameters pushed on `p`; `pattern` is the
/// text's ([`like_pattern`]), matched against the id and the label values
/// as tenant `labels_of` sees them. No index serves a piece of text: it
/// costs a look at every agent the other conditions leave.
fn conditions<'a>(
    visible: Option<&'a str>,
    labels_of: &'a str,
    pattern: Option<&'a str>,
    p: &mut Vec<Param<'a>>,
) -> Vec<String> {
    let mut conds = vec!["1 = 1".to_string()];
    if let Some(t) = visible {
        // Correlated, not `IN (SELECT …)`: a page walks the agents by id
        // and looks each up in the tenant index, where the list of a
        // tenant's every agent would be built first (15–40 ms at 100 000).
        let t = arg(p, Param::Text(t));
        conds.push(format!(
            "EXISTS (SELECT 1 FROM agent_tenants t WHERE t.agent_id = a.id AND t.tenant = {t})"
        ));
    }
    if let Some(pattern) = pattern {
        let tenant = arg(p, Param::Text(labels_of));
        let like = arg(p, Param::Text(pattern));
        conds.push(format!(
            "(LOWER(a.id) LIKE {like} ESCAPE '\\' \
             OR EXISTS (SELECT 1 FROM agent_own_labels tl WHERE tl.agent_id = a.id \
             AND LOWER(tl.value) LIKE {like} ESCAPE '\\' \
             AND NOT EXISTS (SELECT 1 FROM agent_labels tx WHERE tx.agent_id = tl.agent_id \
             AND tx.tenant = {tenant} AND tx.key = tl.key)) \
             OR EXISTS (SELECT 1 FROM agent_labels tv WHERE tv.agent_id = a.id \
             AND tv.tenant = {tenant} AND tv.value IS NOT NULL \
             AND LOWER(tv.value) LIKE {like} ESCAPE '\\'))"
        ));
    }
    conds
}

/// Operator labels and tenants of `agents` (a page whose ids may lie
/// anywhere), read by id, a run of ids per statement.
fn attach_by_id(conn: &dyn Db, agents: &mut [AgentRow]) -> StoreResult<()> {
    let ids: Vec<String> = agents.iter().map(|a| a.id.clone()).collect();
    for chunk in chunks(&ids) {
        let p: Vec<Param<'_>> = chunk.iter().map(|id| Param::Text(id)).collect();
        let which = format!("agent_id IN {}", placeholders(1, chunk.len()));
        attach_where(conn, agents, &which, &p)?;
    }
    Ok(())
}

pub(crate) fn agent_exists(conn: &dyn Db, id: &str) -> StoreResult<bool> {
    Ok(query_first(
        conn,
        "SELECT 1 AS found FROM agents WHERE id = ?1",
        params![id],
        |_| Ok(()),
    )?
    .is_some())
}

pub(crate) fn unknown_agent(id: &str) -> StoreError {
    StoreError::NoSuchAgent { id: id.to_owned() }
}

/// The replica a store writes as: its id and its lease's epoch (a single
/// controller: empty and 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// The replica's id.
    pub replica: String,
    /// Its lease's epoch.
    pub epoch: i64,
}

/// Two machines under one identity across replicas: the agent is
/// connected, from another journal, to another replica whose lease is live
/// (within one replica the hub refuses this before the store is asked).
/// A machine whose disk was wiped (a new journal) is let in once its old
/// stream is gone: its replica's lease ran out, or it was marked
/// disconnected.
pub(crate) fn refuse_a_second_machine(
    conn: &dyn Db,
    h: &HelloRow,
    me: &Owner,
    lease_now_us: LeaseClock,
) -> StoreResult<()> {
    let holder = query_first(
        conn,
        "SELECT journal_id, owner FROM agents a WHERE id = ?1 AND connected <> 0 \
         AND owner <> ?2 AND journal_id <> ?3 AND EXISTS (SELECT 1 FROM replicas r \
         WHERE r.id = a.owner AND r.epoch = a.owner_epoch AND r.expires_us > ?4)",
        params![h.id, me.replica, h.journal_id, lease_now_us(conn)?],
        |r| Ok((col::<String>(r, "journal_id")?, col::<String>(r, "owner")?)),
    )?;
    match holder {
        None => Ok(()),
        Some((holder_journal, replica)) => Err(StoreError::IdInUse {
            agent: h.id.clone(),
            journal: h.journal_id.clone(),
            holder_journal,
            replica,
        }),
    }
}

/// The agent record, now owned by `owner` under a new session generation
/// (above the stored one and the one the agent has seen), its own labels
/// (one row each, for targeting) and its certificate's tenants.
pub(crate) fn write_hello(conn: &dyn Db, h: &HelloRow, owner: &Owner) -> StoreResult<()> {
    let labels = to_json(&h.labels, "labels")?;
    let trust = h.trust.as_ref().map(|t| to_json(t, "trust")).transpose()?;
    let update = h
        .update
        .as_ref()
        .map(|u| to_json(u, "agent_update"))
        .transpose()?;
    let seen = baton_store::fits(h.session_gen_seen, "session generation")?;
    // `CASE` rather than MAX/GREATEST: the engines spell those otherwise.
    run(
        conn,
        "store an agent",
        "INSERT INTO agents (id, labels, agent_version, journal_id, connected, last_seen_ns, \
         session_gen, owner, owner_epoch, trust, arch, agent_update) \
         VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6 + 1, ?7, ?8, ?9, ?10, ?11) \
         ON CONFLICT (id) DO UPDATE SET labels = excluded.labels, \
         agent_version = excluded.agent_version, journal_id = excluded.journal_id, \
         trust = excluded.trust, arch = excluded.arch, \
         agent_update = COALESCE(excluded.agent_update, agents.agent_update), \
         connected = excluded.connected, last_seen_ns = excluded.last_seen_ns, \
         session_gen = CASE WHEN agents.session_gen > ?6 THEN agents.session_gen ELSE ?6 END + 1, \
         owner = excluded.owner, owner_epoch = excluded.owner_epoch",
        params![
            h.id,
            labels,
            h.agent_version,
            h.journal_id,
            h.at.as_nanos(),
            seen,
            owner.replica,
            owner.epoch,
            trust,
            h.arch,
            update
        ],
    )?;
    run(
        conn,
        "replace an agent's labels",
        "DELETE FROM agent_own_labels WHERE agent_id = ?1",
        params![h.id],
    )?;
    for (k, v) in &h.labels {
        run(
            conn,
            "store an agent's label",
            "INSERT INTO agent_own_labels (agent_id, key, value) VALUES (?1, ?2, ?3)",
            params![h.id, k, v],
        )?;
    }
    if let Some(tenants) = &h.cert_tenants {
        run(
            conn,
            "replace an agent's certificate tenants",
            "DELETE FROM agent_tenants WHERE agent_id = ?1 AND source = 'certificate'",
            params![h.id],
        )?;
        for t in tenants.iter().collect::<BTreeSet<_>>() {
            run(
                conn,
                "store an agent's tenant",
                "INSERT INTO agent_tenants (agent_id, tenant, source, at_ns) \
                 VALUES (?1, ?2, 'certificate', ?3)",
                params![h.id, t, h.at.as_nanos()],
            )?;
        }
    }
    Ok(())
}

/// The agent's session generation (`None`: not stored), read in the
/// write's own transaction (the writer's serialisation point, so no hello
/// can come between the fence's check and the write).
pub(crate) fn session_gen(conn: &dyn Db, id: &str) -> StoreResult<Option<u64>> {
    let current: Option<i64> = query_first(
        conn,
        "SELECT session_gen FROM agents WHERE id = ?1",
        params![id],
        |r| col(r, "session_gen"),
    )?;
    current.map(|c| u64_from_db(c, "session_gen")).transpose()
}

/// Marks disconnected the agents whose stream no replica holds: none whose
/// lease (at the epoch it took the hello under) is live at `now_us`, or
/// the replica `starting` (which holds no stream yet). On a single
/// controller, which has no lease rows, every agent. How many.
pub(crate) fn disconnect_unowned(
    conn: &dyn Db,
    now_us: i64,
    starting: Option<&str>,
) -> StoreResult<u64> {
    run(
        conn,
        "mark agents disconnected",
        "UPDATE agents SET connected = 0 WHERE connected <> 0 AND (owner = ?2 OR NOT EXISTS \
         (SELECT 1 FROM replicas r WHERE r.id = agents.owner \
          AND r.epoch = agents.owner_epoch AND r.expires_us > ?1))",
        params![now_us, starting],
    )
}

/// Runs an `UPDATE agents ... WHERE id = ?1`; an unknown agent is an error
/// (the server only updates agents that said hello).
pub(crate) fn update_agent(
    conn: &dyn Db,
    id: &str,
    sql: &str,
    params: &[Param<'_>],
) -> StoreResult<()> {
    let n = run(conn, "update an agent", sql, params)?;
    if n == 0 {
        return Err(unknown_agent(id));
    }
    Ok(())
}

pub(crate) fn write_labels(
    conn: &dyn Db,
    id: &str,
    tenant: &str,
    set: &LabelOverrides,
    reset: &[String],
) -> StoreResult<()> {
    if !agent_exists(conn, id)? {
        return Err(StoreError::NoSuchAgent { id: id.to_string() });
    }
    for (k, v) in set {
        run(
            conn,
            "store an agent label",
            "INSERT INTO agent_labels (agent_id, tenant, key, value) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (agent_id, tenant, key) DO UPDATE SET value = excluded.value",
            params![id, tenant, k, v],
        )?;
    }
    for k in reset {
        run(
            conn,
            "reset an agent label",
            "DELETE FROM agent_labels WHERE agent_id = ?1 AND tenant = ?2 AND key = ?3",
            params![id, tenant, k],
        )?;
    }
    Ok(())
}

pub(crate) fn write_grant(
    conn: &dyn Db,
    id: &str,
    tenant: &str,
    granted: bool,
    at_ns: i64,
) -> StoreResult<()> {
    if granted {
        run(
            conn,
            "store a grant",
            "INSERT INTO agent_tenants (agent_id, tenant, source, at_ns) \
             VALUES (?1, ?2, 'grant', ?3) ON CONFLICT (agent_id, tenant, source) DO NOTHING",
            params![id, tenant, at_ns],
        )?;
    } else {
        run(
            conn,
            "take back a grant",
            "DELETE FROM agent_tenants WHERE agent_id = ?1 AND tenant = ?2 AND source = 'grant'",
            params![id, tenant],
        )?;
    }
    Ok(())
}

pub(crate) fn write_forget(conn: &dyn Db, id: &str, tenant: Option<&str>) -> StoreResult<bool> {
    let existed = agent_exists(conn, id)?;
    let statements: &[(&str, &str)] = match tenant {
        Some(_) => &[
            (
                "DELETE FROM agent_labels WHERE agent_id = ?1 AND tenant = ?2",
                "forget an agent's labels",
            ),
            (
                "DELETE FROM deliveries WHERE agent_id = ?1 AND tenant = ?2",
                "forget an agent's deliveries",
            ),
            (
                "DELETE FROM agent_tenants WHERE agent_id = ?1 AND tenant = ?2 AND source = 'grant'",
                "forget an agent's grant",
            ),
        ],
        None => &[
            (
                "DELETE FROM agent_labels WHERE agent_id = ?1",
                "forget an agent's labels",
            ),
            (
                "DELETE FROM deliveries WHERE agent_id = ?1",
                "forget an agent's deliveries",
            ),
            (
                "DELETE FROM agent_tenants WHERE agent_id = ?1",
                "forget an agent's tenants",
            ),
            (
                "DELETE FROM agent_own_labels WHERE agent_id = ?1",
                "forget an agent's own labels",
            ),
            (
                "DELETE FROM clock_reports WHERE agent_id = ?1",
                "forget an agent's clock history",
            ),
            (
                "DELETE FROM release_targets WHERE agent_id = ?1",
                "forget the release an agent is offered",
            ),
            ("DELETE FROM agents WHERE id = ?1", "forget an agent"),
        ],
    };
    for (sql, what) in statements {
        match tenant {
            Some(t) => run(conn, what, sql, params![id, t])?,
            None => run(conn, what, sql, params![id])?,
        };
    }
    Ok(existed)
}

/// What a stored agent checks packs against, as it now says.
pub(crate) fn write_trust(conn: &dyn Db, id: &str, trust: &TrustRow) -> StoreResult<()> {
    let trust = to_json(trust, "trust")?;
    update_agent(
        conn,
        id,
        "UPDATE agents SET trust = ?2 WHERE id = ?1",
        params![id, trust],
    )
}

/// What a stored agent last said of an update.
pub(crate) fn write_update(conn: &dyn Db, id: &str, update: &UpdateRow) -> StoreResult<()> {
    baton_store::fits(update.held_bytes, "held bytes")?;
    baton_store::fits(update.size, "release size")?;
    let update = to_json(update, "agent_update")?;
    update_agent(
        conn,
        id,
        "UPDATE agents SET agent_update = ?2 WHERE id = ?1",
        params![id, update],
    )
}

/// The latest-clock columns and the history row; a report not newer than
/// the stored latest goes to history only (a re-sent one not even there).
pub(crate) fn write_clock(conn: &dyn Db, id: &str, c: &ClockRow) -> StoreResult<()> {
    if !agent_exists(conn, id)? {
        return Err(unknown_agent(id));
    }
    run(
        conn,
        "store a clock report",
        "INSERT INTO clock_reports \
         (agent_id, at_ns, source, state, offset_ns, jitter_ns, uncertainty_ns, frequency_ppm) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
         ON CONFLICT (agent_id, at_ns) DO NOTHING",
        params![
            id,
            c.at.as_nanos(),
            c.source,
            c.state,
            span_ns(c.offset),
            span_ns(c.jitter),
            span_ns(c.uncertainty),
            c.frequency_ppm
        ],
    )?;
    run(
        conn,
        "store an agent's latest clock",
        "UPDATE agents SET clock_source = ?2, clock_state = ?3, clock_offset_ns = ?4, \
         clock_jitter_ns = ?5, clock_uncertainty_ns = ?6, clock_frequency_ppm = ?7, \
         clock_at_ns = ?8 \
         WHERE id = ?1 AND (clock_at_ns IS NULL OR clock_at_ns < ?8)",
        params![
            id,
            c.source,
            c.state,
            span_ns(c.offset),
            span_ns(c.jitter),
            span_ns(c.uncertainty),
            c.frequency_ppm,
            c.at.as_nanos()
        ],
    )?;
    Ok(())
}

/// The newest `limit` reports at or after `since_ns`, oldest first.
pub(crate) fn clock_history(
    conn: &dyn Db,
    id: &str,
    since_ns: i64,
    limit: u32,
) -> StoreResult<Vec<ClockRow>> {
    let sql = format!(
        "SELECT {CLOCK_COLUMNS} FROM (SELECT {CLOCK_COLUMNS} FROM clock_reports \
         WHERE agent_id = ?1 AND at_ns >= ?2 ORDER BY at_ns DESC LIMIT ?3) AS newest \
         ORDER BY at_ns"
    );
    query_all(
        conn,
        &sql,
        params![id, since_ns, i64::from(page(limit, MAX_PAGE * 10))],
        |row| with_row(format_args!("clock report of {id}"), decode_clock(row)),
    )
}

#[cfg(test)]
mod tests {
    /// The SQL's stale bound is the model's (the memory store's rule).
    #[test]
    fn not_locked_uses_the_models_stale_bound() {
        let bound = format!("a.last_seen_ns - {}", baton_model::CLOCK_STALE_NS);
        assert!(super::NOT_LOCKED.contains(&bound), "{}", super::NOT_LOCKED);
    }
}
