//! A rusqlite connection as the shared SQL's [`Db`]: statements from the
//! connection's cache, parameters and values as SQLite's own types.

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ToSql};

use crate::sql::codec::corrupt;
use crate::sql::db::{Db, Param, Row, Value, failed};
use baton_store::StoreResult;

/// `?` with a word on what was being done.
pub(super) trait Context<T> {
    fn ctx(self, what: &str) -> StoreResult<T>;
}

impl<T> Context<T> for rusqlite::Result<T> {
    fn ctx(self, what: &str) -> StoreResult<T> {
        self.map_err(|e| baton_store::StoreError::unavailable(what, e))
    }
}

impl ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Param::Null => ValueRef::Null,
            Param::Int(i) => ValueRef::Integer(i),
            Param::Real(f) => ValueRef::Real(f),
            Param::Text(t) => ValueRef::Text(t.as_bytes()),
            Param::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

impl Row for rusqlite::Row<'_> {
    fn value(&self, name: &str) -> StoreResult<Value> {
        let v = self
            .get_ref(name)
            .map_err(|e| corrupt(&format!("column {name}"), e))?;
        Ok(match v {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(i) => Value::Int(i),
            ValueRef::Real(f) => Value::Real(f),
            ValueRef::Text(t) => Value::Text(
                std::str::from_utf8(t)
                    .map_err(|e| corrupt(&format!("column {name}"), e))?
                    .to_owned(),
            ),
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
        })
    }
}

impl Db for Connection {
    fn query_each(
        &self,
        sql: &str,
        params: &[Param<'_>],
        each: &mut dyn FnMut(&dyn Row) -> StoreResult<()>,
    ) -> StoreResult<()> {
        let mut stmt = self
            .prepare_cached(sql)
            .map_err(|e| failed("prepare a query", sql, e))?;
        let mut rows = stmt
            .query(rusqlite::params_from_iter(params))
            .map_err(|e| failed("run a query", sql, e))?;
        while let Some(row) = rows.next().map_err(|e| failed("read a row", sql, e))? {
            each(row)?;
        }
        Ok(())
    }

    fn execute(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<u64> {
        let n = self
            .prepare_cached(sql)
            .and_then(|mut s| s.execute(rusqlite::params_from_iter(params)))
            .map_err(|e| failed("run a statement", sql, e))?;
        Ok(n as u64)
    }
}
