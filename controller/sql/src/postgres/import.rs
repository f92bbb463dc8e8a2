//! `baton-controller migrate --from DIR --to URL`: a single-node site's
//! embedded store copied into PostgreSQL, history and all (agents and
//! their labels and tenants, packs and every version, deliveries,
//! rollouts and their cohorts,
//! journals and feedback, clock history, the audit log).
//!
//! One transaction, under the write lock every PostgreSQL controller's
//! batches take, so nothing is half copied and no controller writes in
//! between. Rows keep their keys and ids (`ON CONFLICT DO NOTHING`):
//! running it again copies nothing twice, and after it the id sequences
//! are moved past what was copied.

use std::path::Path;

use rusqlite::types::ValueRef;

use super::conn::{PgConn, detailed};
use super::{Target, WRITE_LOCK, connect, migrate};
use crate::sql::db::{Db, Param, params, run};
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
    // Not `events` (a transport between live replicas) nor `replicas`.
    "revocations",
];

/// The tables whose ids come from a sequence.
const NUMBERED: &[&str] = &["journals", "feedback", "audit"];

/// Rows read from the source and copied (new) per table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    /// (table, rows read, rows new in PostgreSQL).
    pub tables: Vec<(String, u64, u64)>,
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
        run(
            &target,
            "take the write lock",
            "SELECT pg_advisory_xact_lock(?1)",
            params![WRITE_LOCK],
        )?;
        let mut out = Copied::default();
        for table in TABLES {
            let (read, new) = copy_table(&source, &target, table)?;
            out.tables.push(((*table).to_owned(), read, new));
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

/// One table's rows, by its own columns; (read, new).
fn copy_table(
    source: &rusqlite::Connection,
    target: &PgConn,
    table: &str,
) -> StoreResult<(u64, u64)> {
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
    let mut rows = stmt.query([]).map_err(fail)?;
    let (mut read, mut new) = (0u64, 0u64);
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
                ValueRef::Blob(_) => {
                    return Err(StoreError::corrupt(
                        format!("{table}.{name}"),
                        "a blob, which the store never writes",
                    ));
                }
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
                _ => Param::Null,
            })
            .collect();
        read += 1;
        new += target.execute(&insert, &values)?;
    }
    Ok((read, new))
}
