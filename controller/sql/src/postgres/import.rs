//! `baton-controller migrate --from DIR --to URL`: a single-node site's
//! embedded store copied into PostgreSQL, history and all (agents and
//! their labels and tenants, packs and every version, deliveries,
//! rollouts and their cohorts, agent releases and updates,
//! journals and feedback, clock history, the audit log).
//!
//! One transaction, every table it writes locked `EXCLUSIVE` first, so
//! nothing is half copied and no controller writes in between (and a
//! database another store already uses is refused before anything is
//! copied). Rows keep their keys and ids (`ON CONFLICT DO NOTHING`):
//! running it again copies nothing twice, and after it the id sequences
//! are moved past what was copied.

use std::path::Path;

use rusqlite::types::ValueRef;

use super::conn::{PgConn, detailed};
use super::{Target, connect, migrate};
use crate::sql::db::{Db, Param, query_first, run};
use crate::sqlite::SqliteStore;
use baton_store::{Binding, StoreError, StoreResult};

/// Every table, parents before the tables that refer to them.
const TABLES: &[&str] = &[
    "agents",
    "agent_own_labels",
    "agent_labels",
    "agent_tenants",
    "clock_reports",
    "packs",
    "pack_versions",
    "deliveries",
    "rollouts",
    "rollout_members",
    "journals",
    "feedback",
    "audit",
    // Not `events` (a transport between live replicas) nor `replicas`;
    // nor dashboard sessions and failed log-ins (operators log in again
    // on the moved site, as after any move of a controller).
    "revocations",
    "releases",
    "release_pieces",
    "agent_updates",
    "release_targets",
];

/// The tables whose ids come from a sequence.
const NUMBERED: &[&str] = &["journals", "feedback", "audit"];

/// Rows read from the source and copied (new) per table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    /// (table, rows read, rows new in PostgreSQL).
    pub tables: Vec<(String, u64, u64)>,
}

/// A table's rows the target holds already, and how many of them hold
/// something else there than in the source (another site's, under the
/// same key).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Copy {
    read: u64,
    new: u64,
    differ: u64,
}

/// Copies `dir/controller.db` into the database `target`. The source is
/// brought to this build's schema first (as `serve` would), the target
/// too. Blocking.
pub fn copy_from_sqlite(dir: &Path, target: &Target) -> StoreResult<Copied> {
    let db = dir.join(crate::sqlite::DB_FILE);
    if !db.exists() {
        return Err(StoreError::Unusable(format!(
            "no embedded store at {}",
            db.display()
        )));
    }
    // Opening migrates the source to this build's schema; closed at once.
    drop(SqliteStore::open(dir, Binding::Tenants)?);
    let source =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| StoreError::unavailable(format!("open {}", db.display()), e))?;
    let target = PgConn::new(connect(target)?);
    super::check_collation(&target)?;
    migrate(&target)?;
    let batch = |sql: &str| {
        target
            .batch(sql)
            .map_err(|e| StoreError::unavailable(sql.to_string(), detailed(&e)))
    };
    batch("BEGIN")?;
    let copied = (|| {
        // Replicas already running on the target write nothing meanwhile
        // (they read on, and their writes wait for the commit).
        batch(&format!(
            "LOCK TABLE {} IN EXCLUSIVE MODE",
            TABLES.join(", ")
        ))?;
        let mut out = Copied::default();
        let mut differ = Vec::new();
        for table in TABLES {
            let c = copy_table(&source, &target, table)?;
            out.tables.push(((*table).to_owned(), c.read, c.new));
            if c.differ > 0 {
                differ.push(format!("{table}: {} of {} rows", c.differ, c.read));
            }
        }
        // A row is copied, or the target holds the very same row (this
        // site migrated before): anything else would lose the source's
        // row, or mix two sites. Nothing is copied then.
        if !differ.is_empty() {
            return Err(StoreError::Unusable(format!(
                "the target database already holds another store's data under the same keys \
                 ({}); nothing was copied: migrate into an empty database",
                differ.join(", ")
            )));
        }
        for table in NUMBERED {
            run(
                &target,
                "move a sequence past the copied ids",
                &format!(
                    "SELECT setval(pg_get_serial_sequence('{table}', 'id'), \
                     COALESCE(MAX(id), 0) + 1, false) FROM {table}"
                ),
                &[],
            )?;
        }
        Ok(out)
    })();
    match copied {
        Ok(out) => {
            batch("COMMIT")?;
            Ok(out)
        }
        Err(e) => {
            let _ = target.batch("ROLLBACK");
            Err(e)
        }
    }
}

/// One table's rows, by its own columns: each inserted, or found as it is
/// in the target already (the same site migrated before), or counted as
/// differing.
fn copy_table(source: &rusqlite::Connection, target: &PgConn, table: &str) -> StoreResult<Copy> {
    let fail = |e: rusqlite::Error| StoreError::unavailable(format!("read {table}"), e);
    let mut stmt = source
        .prepare(&format!("SELECT * FROM {table}"))
        .map_err(fail)?;
    let columns: Vec<String> = stmt
        .column_names()
        .iter()
        .map(|c| (*c).to_owned())
        .collect();
    let insert = format!(
        "INSERT INTO {table} ({}) VALUES ({}) ON CONFLICT DO NOTHING",
        columns.join(", "),
        (1..=columns.len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let same = format!(
        "SELECT 1 AS same FROM {table} WHERE ROW({}) IS NOT DISTINCT FROM ROW({}) LIMIT 1",
        columns.join(", "),
        (1..=columns.len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut rows = stmt.query([]).map_err(fail)?;
    let mut out = Copy::default();
    while let Some(row) = rows.next().map_err(fail)? {
        // Text is borrowed by the parameters: read it all first.
        let mut cells: Vec<(ValueRef<'_>, Option<String>)> = Vec::with_capacity(columns.len());
        for (i, name) in columns.iter().enumerate() {
            let v = row.get_ref(i).map_err(fail)?;
            let text = match v {
                ValueRef::Text(t) => Some(
                    std::str::from_utf8(t)
                        .map_err(|e| StoreError::corrupt(format!("{table}.{name}"), e))?
                        .to_owned(),
                ),
                _ => None,
            };
            cells.push((v, text));
        }
        let values: Vec<Param<'_>> = cells
            .iter()
            .map(|(v, text)| match (v, text) {
                (_, Some(t)) => Param::Text(t),
                (ValueRef::Integer(i), _) => Param::Int(*i),
                (ValueRef::Real(f), _) => Param::Real(*f),
                (ValueRef::Blob(b), _) => Param::Blob(b),
                _ => Param::Null,
            })
            .collect();
        out.read += 1;
        let inserted = target.execute(&insert, &values)?;
        out.new += inserted;
        if inserted == 0 && query_first(target, &same, &values, |_| Ok(()))?.is_none() {
            out.differ += 1;
        }
    }
    Ok(out)
}
