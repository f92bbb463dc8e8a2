//! The few things the SQL modules ask of a database connection, so that
//! one text of every statement, and one decoder of every row, serve each
//! engine: run a query and see its rows, run a statement and count what it
//! changed. Parameters and column values are the handful of types the
//! schema uses (BIGINT, DOUBLE, TEXT, NULL); each engine maps them to its
//! own (PostgreSQL's integer widths included).
//!
//! Statements use SQLite's `?N` placeholders; an engine that spells them
//! otherwise rewrites them (see [`numbered_placeholders`]).

use std::fmt;

use baton_store::{StoreError, StoreResult};

/// One bound parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Param<'a> {
    /// SQL NULL.
    Null,
    /// Any integer column.
    Int(i64),
    /// A DOUBLE PRECISION / REAL column.
    Real(f64),
    /// A TEXT column.
    Text(&'a str),
    /// A BLOB (SQLite) or BYTEA (PostgreSQL) column: a release's pieces.
    Blob(&'a [u8]),
}

/// A Rust value bound as a parameter.
pub trait ToParam {
    /// The parameter, borrowing `self`'s text.
    fn param(&self) -> Param<'_>;
}

macro_rules! to_param {
    ($($t:ty => |$v:ident| $e:expr),* $(,)?) => {
        $(impl ToParam for $t {
            fn param(&self) -> Param<'_> {
                let $v = self;
                $e
            }
        })*
    };
}

to_param! {
    i64 => |v| Param::Int(*v),
    i32 => |v| Param::Int(i64::from(*v)),
    u32 => |v| Param::Int(i64::from(*v)),
    f64 => |v| Param::Real(*v),
    bool => |v| Param::Int(i64::from(*v)),
    str => |v| Param::Text(v),
    String => |v| Param::Text(v.as_str()),
    Option<String> => |v| v.as_deref().map_or(Param::Null, Param::Text),
    Option<&str> => |v| v.map_or(Param::Null, Param::Text),
    Option<i64> => |v| v.map_or(Param::Null, Param::Int),
    Option<f64> => |v| v.map_or(Param::Null, Param::Real),
    Param<'_> => |v| *v,
    [u8] => |v| Param::Blob(v),
    Vec<u8> => |v| Param::Blob(v.as_slice()),
}

impl<T: ToParam + ?Sized> ToParam for &T {
    fn param(&self) -> Param<'_> {
        (**self).param()
    }
}

/// `&[Param]` from expressions, each taken by reference (as rusqlite's
/// `params!`).
macro_rules! params {
    ($($p:expr),* $(,)?) => {
        &[$($crate::sql::db::ToParam::param(&$p)),*] as &[$crate::sql::db::Param<'_>]
    };
}
pub(crate) use params;

/// Rows (or ids) one multi-row statement takes at most: a round trip
/// per row would bound a networked engine by its latency.
pub(crate) const ROWS_PER_STATEMENT: usize = 64;

/// How many of `left` rows the next multi-row statement takes:
/// [`ROWS_PER_STATEMENT`], or the largest power of two below (so seven
/// statement shapes serve every count, and stay in the engines' statement
/// caches).
fn chunk_len(left: usize) -> usize {
    if left >= ROWS_PER_STATEMENT {
        ROWS_PER_STATEMENT
    } else {
        1 << left.max(1).ilog2()
    }
}

/// `items` in order, cut into the runs one multi-row statement each takes
/// ([`chunk_len`]); none of an empty slice.
pub(crate) fn chunks<T>(items: &[T]) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (chunk, tail) = rest.split_at(chunk_len(rest.len()));
        rest = tail;
        Some(chunk)
    })
}

/// `(SELECT … )`: the texts of the JSON array placeholder `?N` holds,
/// for `x IN` that list on PostgreSQL: one statement for any number of
/// values, where [`chunks`] make one per 64 (each a round trip).
pub(crate) fn json_array_values(n: usize) -> String {
    format!("(SELECT json_array_elements_text(CAST(?{n} AS TEXT)::json))")
}

/// `values` as the JSON array [`json_array_values`] reads.
pub(crate) fn json_array(values: &[&str]) -> StoreResult<String> {
    serde_json::to_string(values)
        .map_err(|e| baton_store::StoreError::Invalid(format!("values as JSON: {e}")))
}

/// `(?F, ?F+1, …)` for `n` values starting at placeholder `first`: one
/// row of a multi-row `VALUES`, or an `IN` list.
pub(crate) fn placeholders(first: usize, n: usize) -> String {
    let mut s = String::with_capacity(2 + n * 7);
    push_placeholders(&mut s, first, n);
    s
}

/// [`placeholders`] written onto `s` (one buffer for a whole statement,
/// not a string per value).
fn push_placeholders(s: &mut String, first: usize, n: usize) {
    use std::fmt::Write as _;
    s.push('(');
    for i in first..first + n {
        if i > first {
            s.push_str(", ");
        }
        // Writing to a String cannot fail.
        let _ = write!(s, "?{i}");
    }
    s.push(')');
}

/// `(?1, …, ?C), (?C+1, …), …`: `rows` rows of `columns` values each,
/// for a multi-row `VALUES`.
pub(crate) fn values_rows(rows: usize, columns: usize) -> String {
    let mut s = String::with_capacity(rows * (columns * 7 + 4));
    for r in 0..rows {
        if r > 0 {
            s.push_str(", ");
        }
        push_placeholders(&mut s, r * columns + 1, columns);
    }
    s
}

/// A multi-row statement built once per shape and kept: [`chunks`] cuts
/// rows into seven shapes (1, 2, 4 … 64 rows), and building a 64-row
/// insert's text is some 1 500 numbers formatted, which the writer thread
/// paid for every batch (the fleet bench's SQLite ingest spent about a
/// twelfth of the writer's time there).
#[derive(Debug)]
pub(crate) struct ByShape {
    built: [std::sync::OnceLock<String>; 7],
    build: fn(usize) -> String,
}

impl ByShape {
    /// The statements `build(rows)` makes, kept as they are first asked.
    pub const fn new(build: fn(usize) -> String) -> ByShape {
        ByShape {
            built: [const { std::sync::OnceLock::new() }; 7],
            build,
        }
    }

    /// The statement for `rows` rows: kept for a shape [`chunks`] makes,
    /// built afresh for any other count.
    pub fn get(&self, rows: usize) -> std::borrow::Cow<'_, str> {
        let shape = rows.checked_ilog2().map(|l| l as usize);
        match shape.and_then(|l| self.built.get(l)) {
            Some(cell) if rows.is_power_of_two() => {
                std::borrow::Cow::Borrowed(cell.get_or_init(|| (self.build)(rows)).as_str())
            }
            _ => std::borrow::Cow::Owned((self.build)(rows)),
        }
    }
}

/// One column value of a result row.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// Any integer column.
    Int(i64),
    /// A floating-point column.
    Real(f64),
    /// A TEXT column.
    Text(String),
    /// A BLOB / BYTEA column.
    Blob(Vec<u8>),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Int(_) => "an integer",
            Value::Real(_) => "a real",
            Value::Text(_) => "text",
            Value::Blob(_) => "bytes",
        }
    }
}

/// A result row: columns by name.
pub trait Row {
    /// The value of column `name`.
    fn value(&self, name: &str) -> StoreResult<Value>;
}

/// A Rust value read from a column.
pub trait FromValue: Sized {
    /// `Err`: what the column held instead.
    fn from_value(v: Value) -> Result<Self, String>;
}

fn wrong(want: &str, v: &Value) -> String {
    format!("expected {want}, found {}", v.kind())
}

impl FromValue for i64 {
    fn from_value(v: Value) -> Result<i64, String> {
        match v {
            Value::Int(i) => Ok(i),
            other => Err(wrong("an integer", &other)),
        }
    }
}

impl FromValue for i32 {
    fn from_value(v: Value) -> Result<i32, String> {
        let i = i64::from_value(v)?;
        i32::try_from(i).map_err(|_| format!("{i} does not fit a 32-bit integer"))
    }
}

impl FromValue for f64 {
    fn from_value(v: Value) -> Result<f64, String> {
        match v {
            Value::Real(f) => Ok(f),
            // SQLite keeps a whole REAL value as an integer.
            Value::Int(i) => Ok(i as f64),
            other => Err(wrong("a real", &other)),
        }
    }
}

impl FromValue for String {
    fn from_value(v: Value) -> Result<String, String> {
        match v {
            Value::Text(s) => Ok(s),
            other => Err(wrong("text", &other)),
        }
    }
}

impl FromValue for Vec<u8> {
    fn from_value(v: Value) -> Result<Vec<u8>, String> {
        match v {
            Value::Blob(b) => Ok(b),
            other => Err(wrong("bytes", &other)),
        }
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: Value) -> Result<Option<T>, String> {
        match v {
            Value::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// A column by name, a decode failure as a typed error.
pub fn col<T: FromValue>(row: &dyn Row, name: &str) -> StoreResult<T> {
    T::from_value(row.value(name)?).map_err(|e| StoreError::corrupt(format!("column {name}"), e))
}

/// A connection (or a transaction on one) the SQL modules run on.
pub trait Db {
    /// Runs a query, handing each row to `each` (which may stop it with
    /// an error).
    fn query_each(
        &self,
        sql: &str,
        params: &[Param<'_>],
        each: &mut dyn FnMut(&dyn Row) -> StoreResult<()>,
    ) -> StoreResult<()>;
    /// Runs a statement; the rows it changed.
    fn execute(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<u64>;
}

/// Runs a query and decodes every row.
pub fn query_all<T>(
    db: &dyn Db,
    sql: &str,
    params: &[Param<'_>],
    decode: impl Fn(&dyn Row) -> StoreResult<T>,
) -> StoreResult<Vec<T>> {
    let mut out = Vec::new();
    db.query_each(sql, params, &mut |r| {
        out.push(decode(r)?);
        Ok(())
    })?;
    Ok(out)
}

/// The first row of a query, decoded (`None`: no row).
pub fn query_first<T>(
    db: &dyn Db,
    sql: &str,
    params: &[Param<'_>],
    decode: impl Fn(&dyn Row) -> StoreResult<T>,
) -> StoreResult<Option<T>> {
    let mut out = None;
    db.query_each(sql, params, &mut |r| {
        if out.is_none() {
            out = Some(decode(r)?);
        }
        Ok(())
    })?;
    Ok(out)
}

/// A failure of `r` says what it was about (`what`: a row, a command).
pub fn with_row<T>(what: impl fmt::Display, r: StoreResult<T>) -> StoreResult<T> {
    r.map_err(|e| match e {
        StoreError::Corrupt { what: w, detail } => StoreError::Corrupt {
            what: format!("{what}: {w}"),
            detail,
        },
        other => other,
    })
}

/// Runs a statement, a failure saying `what` it was for; the rows it
/// changed.
pub fn run(db: &dyn Db, what: &str, sql: &str, params: &[Param<'_>]) -> StoreResult<u64> {
    with_row(what, db.execute(sql, params))
}

/// A database error with what was being done.
pub fn failed(what: &str, sql: &str, e: impl fmt::Display) -> StoreError {
    // The statement's first words say which one failed without flooding
    // the log with a whole query.
    let head: String = sql.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
    StoreError::unavailable(format!("{what} ({head} …)"), e.to_string())
}

/// `sql` with SQLite's `?N` placeholders spelled `$N`, for engines that
/// number them so (PostgreSQL). A `?` inside a quoted string or a quoted
/// name is left alone.
pub fn numbered_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quote: Option<char> = None;
    for c in sql.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '?' => {
                out.push('$');
                continue;
            }
            None => {}
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_row_statements_are_built_once_per_shape_and_read_as_before() {
        assert_eq!(placeholders(3, 2), "(?3, ?4)");
        assert_eq!(values_rows(2, 3), "(?1, ?2, ?3), (?4, ?5, ?6)");
        assert_eq!(values_rows(0, 3), "");
        static BY: ByShape = ByShape::new(|n| values_rows(n, 2));
        for n in [1, 2, 3, 4, 7, 64, 65, 100] {
            assert_eq!(BY.get(n), values_rows(n, 2), "{n} rows");
        }
        // A chunk's shape is kept: the same text, not built again.
        let (a, b) = (BY.get(64), BY.get(64));
        assert!(matches!(a, std::borrow::Cow::Borrowed(_)));
        assert!(std::ptr::eq(a.as_ptr(), b.as_ptr()));
        assert!(matches!(BY.get(3), std::borrow::Cow::Owned(_)));
    }

    #[test]
    fn placeholders_are_numbered_outside_quotes_only() {
        assert_eq!(
            numbered_placeholders("SELECT a FROM t WHERE b = ?1 AND c = '?2' AND \"d?\" = ?10"),
            "SELECT a FROM t WHERE b = $1 AND c = '?2' AND \"d?\" = $10"
        );
    }

    #[test]
    fn values_decode_to_the_types_asked_and_say_what_they_were() {
        assert_eq!(i64::from_value(Value::Int(-3)), Ok(-3));
        assert_eq!(f64::from_value(Value::Int(2)), Ok(2.0));
        assert_eq!(Option::<String>::from_value(Value::Null), Ok(None));
        assert_eq!(
            i32::from_value(Value::Int(i64::MAX)),
            Err(format!("{} does not fit a 32-bit integer", i64::MAX))
        );
        assert_eq!(
            String::from_value(Value::Int(1)),
            Err("expected text, found an integer".into())
        );
    }

    #[test]
    fn params_take_their_arguments_by_reference() {
        let name = String::from("a1");
        let none: Option<String> = None;
        let p = params![name, 5i64, none, true];
        assert_eq!(
            p,
            [Param::Text("a1"), Param::Int(5), Param::Null, Param::Int(1)]
        );
    }
}
