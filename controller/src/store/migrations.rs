//! The store's schema, as an ordered list of migrations.
//!
//! Every backend applies the same list, in order, recording each applied
//! version in `schema_migrations (version BIGINT PRIMARY KEY)`; a database
//! is therefore at one well-defined schema version whatever engine holds
//! it. A migration, once released, is never edited: a change is a new
//! entry at the end.

/// One schema step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Migration {
    /// Its number; strictly increasing along [`MIGRATIONS`].
    pub version: i64,
    /// SQL statements, separated by `;`, run in one transaction. `{ID}`
    /// stands for the engine's auto-numbered key (see [`Dialect`]).
    pub sql: &'static str,
}

/// The few words the engines spell differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// SQLite.
    Sqlite,
}

impl Migration {
    /// The statements as `dialect` spells them.
    pub fn sql_for(&self, dialect: Dialect) -> String {
        let id = match dialect {
            // The rowid, never handed out twice: without AUTOINCREMENT
            // SQLite numbers one past the largest *in use*, so once
            // retention had deleted every row (a quiet week) ids would
            // start again at 1, behind a reader's `after_id` cursor, and
            // the rows stored next would never be read as new.
            Dialect::Sqlite => "INTEGER PRIMARY KEY AUTOINCREMENT",
        };
        self.sql.replace("{ID}", id)
    }
}

/// Creates the bookkeeping table itself (run before anything else, and
/// harmless when it exists).
pub(crate) const CREATE_SCHEMA_MIGRATIONS: &str =
    "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT NOT NULL PRIMARY KEY)";

/// All migrations, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: include_str!("migrations/0001_initial.sql"),
    },
    Migration {
        version: 2,
        sql: include_str!("migrations/0002_audit.sql"),
    },
    // 3 is taken by another branch; the list stays in version order.
    Migration {
        version: 4,
        sql: include_str!("migrations/0004_agent_admin.sql"),
    },
    Migration {
        version: 5,
        sql: include_str!("migrations/0005_desired_state.sql"),
    },
];
