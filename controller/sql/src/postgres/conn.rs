//! A PostgreSQL client (or a transaction on one) as the shared SQL's
//! [`Db`]: `?N` rewritten to `$N`, statements prepared once per
//! connection, integers narrowed to the column's width when bound and
//! widened when read.

use std::cell::RefCell;
use std::collections::HashMap;
use std::error::Error;

use bytes::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use postgres::{Client, Statement};

use crate::sql::db::{Db, Param, Row, Value, failed, numbered_placeholders};
use baton_store::{StoreError, StoreResult};

impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match *self {
            Param::Null => Ok(IsNull::Yes),
            Param::Int(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(i)?.to_sql(ty, out),
                Type::BOOL => (i != 0).to_sql(ty, out),
                Type::FLOAT8 => (i as f64).to_sql(ty, out),
                _ => Err(format!("an integer bound to a {ty} parameter").into()),
            },
            Param::Real(f) => match *ty {
                Type::FLOAT8 => f.to_sql(ty, out),
                Type::FLOAT4 => (f as f32).to_sql(ty, out),
                _ => Err(format!("a real bound to a {ty} parameter").into()),
            },
            Param::Text(t) => {
                if t.contains('\0') {
                    // PostgreSQL text cannot hold NUL; say so rather than
                    // let the server refuse the whole statement vaguely.
                    return Err("text with a NUL byte cannot be stored in PostgreSQL".into());
                }
                t.to_sql(ty, out)
            }
            Param::Blob(b) => match *ty {
                Type::BYTEA => b.to_sql(ty, out),
                _ => Err(format!("bytes bound to a {ty} parameter").into()),
            },
        }
    }

    fn accepts(_: &Type) -> bool {
        // Which types a value fits is decided per value in `to_sql`.
        true
    }

    to_sql_checked!();
}

impl Row for postgres::Row {
    fn value(&self, name: &str) -> StoreResult<Value> {
        let bad = |e: &dyn std::fmt::Display| StoreError::corrupt(format!("column {name}"), e);
        let i = self
            .columns()
            .iter()
            .position(|c| c.name() == name)
            .ok_or_else(|| bad(&"no such column in the result"))?;
        let ty = self.columns()[i].type_().clone();
        let v = match ty {
            Type::INT8 => self.try_get::<_, Option<i64>>(i).map(|v| v.map(Value::Int)),
            Type::INT4 => self
                .try_get::<_, Option<i32>>(i)
                .map(|v| v.map(|v| Value::Int(v.into()))),
            Type::INT2 => self
                .try_get::<_, Option<i16>>(i)
                .map(|v| v.map(|v| Value::Int(v.into()))),
            Type::BOOL => self
                .try_get::<_, Option<bool>>(i)
                .map(|v| v.map(|v| Value::Int(v.into()))),
            Type::FLOAT8 => self
                .try_get::<_, Option<f64>>(i)
                .map(|v| v.map(Value::Real)),
            Type::FLOAT4 => self
                .try_get::<_, Option<f32>>(i)
                .map(|v| v.map(|v| Value::Real(v.into()))),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => self
                .try_get::<_, Option<String>>(i)
                .map(|v| v.map(Value::Text)),
            Type::BYTEA => self
                .try_get::<_, Option<Vec<u8>>>(i)
                .map(|v| v.map(Value::Blob)),
            other => return Err(bad(&format!("a {other} column is not read by the store"))),
        };
        Ok(v.map_err(|e| bad(&e))?.unwrap_or(Value::Null))
    }
}

/// A connection with the statements prepared on it. Transactions and
/// savepoints are plain SQL on it (as on SQLite), so it is one owned
/// value the writer can hand its commands.
pub(super) struct PgConn {
    client: RefCell<Client>,
    statements: RefCell<HashMap<String, Statement>>,
}

impl PgConn {
    pub fn new(client: Client) -> PgConn {
        PgConn {
            client: RefCell::new(client),
            statements: RefCell::default(),
        }
    }

    /// Whether the connection is gone (the server closed it, or it broke).
    pub fn is_closed(&self) -> bool {
        self.client.borrow().is_closed()
    }

    /// Runs statements without parameters (`BEGIN`, `SAVEPOINT`, a
    /// migration's text).
    pub fn batch(&self, sql: &str) -> Result<(), postgres::Error> {
        self.client.borrow_mut().batch_execute(sql)
    }

    /// Closes the connection.
    pub fn close(self) -> Result<(), postgres::Error> {
        self.client.into_inner().close()
    }

    fn statement(&self, sql: &str) -> StoreResult<Statement> {
        if let Some(s) = self.statements.borrow().get(sql) {
            return Ok(s.clone());
        }
        let s = self
            .client
            .borrow_mut()
            .prepare(&numbered_placeholders(sql))
            .map_err(|e| failed("prepare a statement", sql, detailed(&e)))?;
        self.statements
            .borrow_mut()
            .insert(sql.to_owned(), s.clone());
        Ok(s)
    }
}

/// A failed statement as the store's error: a transaction the server
/// aborted for a conflicting one (deadlock, serialization failure) is
/// [`StoreError::Contended`], to be run again; anything else unavailable.
pub(super) fn pg_failed(what: &str, sql: &str, e: &postgres::Error) -> StoreError {
    use postgres::error::SqlState;
    match e.code() {
        Some(c)
            if *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::T_R_SERIALIZATION_FAILURE =>
        {
            StoreError::Contended(format!("{what}: {}", detailed(e)))
        }
        _ => failed(what, sql, detailed(e)),
    }
}

/// The server's own message when there is one (the driver's `Display`
/// says only "db error").
pub(super) fn detailed(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => {
            // The client's own words ("error connecting to server") say
            // nothing of why: its causes follow.
            let mut s = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                s.push_str(": ");
                s.push_str(&c.to_string());
                cause = c.source();
            }
            s
        }
    }
}

pub(super) fn as_sql<'p>(params: &'p [Param<'_>]) -> Vec<&'p (dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

impl Db for PgConn {
    fn query_each(
        &self,
        sql: &str,
        params: &[Param<'_>],
        each: &mut dyn FnMut(&dyn Row) -> StoreResult<()>,
    ) -> StoreResult<()> {
        let stmt = self.statement(sql)?;
        let rows = self
            .client
            .borrow_mut()
            .query(&stmt, &as_sql(params))
            .map_err(|e| pg_failed("run a query", sql, &e))?;
        for row in &rows {
            each(row)?;
        }
        Ok(())
    }

    fn execute(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<u64> {
        let stmt = self.statement(sql)?;
        self.client
            .borrow_mut()
            .execute(&stmt, &as_sql(params))
            .map_err(|e| pg_failed("run a statement", sql, &e))
    }
}
