//! baton-sql: the controller's store on SQL engines, behind
//! [`baton_store::Store`]: SQLite embedded ([`sqlite::SqliteStore`], one file,
//! WAL) and PostgreSQL for replicas ([`postgres::PgStore`]). The two share
//! their SQL ([`sql`]), their schema and migrations, and their writer
//! thread (one write connection, group commit); ids and sequence numbers
//! come from the database. Both pass `baton_store`'s contract suite.

#![forbid(unsafe_code)]

mod migrations;
pub mod postgres;
pub mod sql;
pub mod sqlite;
mod writer;

// The interface and its records, as the engines' modules name them.
pub(crate) use baton_store::*;
