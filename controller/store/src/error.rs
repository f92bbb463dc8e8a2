//! What a store operation can fail with: every case a type of its own,
//! so the application can tell a request to refuse (a version taken, an
//! agent it does not know) from a database to retry (unavailable) or one
//! that needs a look (corrupt).

/// What a store operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// This version is stored already, with other content.
    #[error(
        "{tenant}/{pack} v{version} is already stored with different content; push a higher version"
    )]
    VersionTaken {
        /// Tenant.
        tenant: String,
        /// Pack id.
        pack: String,
        /// The version pushed.
        version: u64,
    },
    /// This release is stored already, with other bytes.
    #[error(
        "release {version} for {arch} is already stored with other bytes; upload it under a new version"
    )]
    ReleaseTaken {
        /// The release's version.
        version: String,
        /// Its architecture.
        arch: String,
    },
    /// A higher version is stored.
    #[error("{tenant}/{pack} v{version} is older than the stored v{latest}")]
    VersionOlder {
        /// Tenant.
        tenant: String,
        /// Pack id.
        pack: String,
        /// The version pushed.
        version: u64,
        /// The newest stored.
        latest: u64,
    },
    /// No such pack.
    #[error("no pack {tenant}/{pack}")]
    NoSuchPack {
        /// Tenant.
        tenant: String,
        /// Pack id.
        pack: String,
    },
    /// No such agent (it never said hello, or was forgotten).
    #[error("no agent {id}")]
    NoSuchAgent {
        /// Agent id.
        id: String,
    },
    /// The write came from a stream that no longer owns the agent: a later
    /// hello (on this replica or another) raised its session generation.
    /// The stream must end; the agent is served by the newer one.
    #[error(
        "agent {agent}: stream generation {session} no longer owns it (generation {current} does)"
    )]
    Fenced {
        /// Agent id.
        agent: String,
        /// The writing stream's generation.
        session: u64,
        /// The agent's generation now.
        current: u64,
    },
    /// The agent's id is connected to another live replica from another
    /// journal: two machines under one identity (as the hub sees within
    /// one replica). Refused until that stream ends.
    #[error(
        "agent id {agent} is connected to replica {replica} from another journal ({holder_journal}): two machines under one identity; this stream (journal {journal}) is refused"
    )]
    IdInUse {
        /// Agent id.
        agent: String,
        /// The refused hello's journal.
        journal: String,
        /// The connected stream's journal.
        holder_journal: String,
        /// The replica holding it.
        replica: String,
    },
    /// This replica's lease ran out (it was paused, or cut off from the
    /// database, for longer than the lease): it may write nothing more.
    #[error("this replica's lease is lost: {0}")]
    LeaseLost(String),
    /// A value the store's columns cannot hold (integers are kept as
    /// signed 64-bit): refused, nothing written.
    #[error("{what} {value} is past what the store keeps (at most {max})", max = i64::MAX)]
    OutOfRange {
        /// What the value is.
        what: &'static str,
        /// The value.
        value: u64,
    },
    /// A request the interface does not take (for example feedback of two
    /// agents in one call): the caller's bug, refused with nothing
    /// written.
    #[error("{0}")]
    Invalid(String),
    /// The database could not do it now (unreachable, disk full, a lock
    /// it gave up on): nothing was written, and the same request may be
    /// tried again.
    #[error("{what}: {source}")]
    Unavailable {
        /// What was being done.
        what: String,
        /// Why it failed, as the database said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The database aborted the transaction for a conflicting one (a
    /// deadlock between decisions' locks, a serialization failure):
    /// nothing of it was written, and it may be run again at once.
    #[error("{0}")]
    Contended(String),
    /// The store cannot be used as it is set up (its URL, its TLS files, a
    /// collation, a schema newer than this build, a filesystem that
    /// refuses WAL): an operator must fix it; trying again will not help.
    #[error("{0}")]
    Unusable(String),
    /// What is stored cannot be read back as a record (an unknown word, a
    /// negative count, JSON that does not decode): trying again will not
    /// help; the store needs a look.
    #[error("stored {what} is corrupt: {detail}")]
    Corrupt {
        /// Which record or column.
        what: String,
        /// How.
        detail: String,
    },
    /// The store's writer has stopped (the controller is shutting down, or
    /// an earlier write failed and the store refuses to go on).
    #[error("store is closed")]
    Closed,
}

/// Shorthand.
pub type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    /// The database failed doing `what`.
    pub fn unavailable(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StoreError {
        StoreError::Unavailable {
            what: what.into(),
            source: source.into(),
        }
    }

    /// Stored `what` does not read back.
    pub fn corrupt(what: impl Into<String>, detail: impl std::fmt::Display) -> StoreError {
        StoreError::Corrupt {
            what: what.into(),
            detail: detail.to_string(),
        }
    }

    /// The same failure again, for another caller of a batch that failed
    /// as a whole (a source error is kept as its words).
    pub fn again(&self) -> StoreError {
        match self {
            StoreError::Unavailable { what, source } => {
                StoreError::unavailable(what.clone(), source.to_string())
            }
            StoreError::LeaseLost(m) => StoreError::LeaseLost(m.clone()),
            StoreError::Corrupt { what, detail } => StoreError::Corrupt {
                what: what.clone(),
                detail: detail.clone(),
            },
            StoreError::Unusable(m) => StoreError::Unusable(m.clone()),
            StoreError::Contended(m) => StoreError::Contended(m.clone()),
            StoreError::Closed => StoreError::Closed,
            other => StoreError::unavailable("write batch", other.to_string()),
        }
    }

    /// Whether the same request may succeed if tried again (the database,
    /// not the request, failed).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable { .. } | StoreError::Closed | StoreError::Contended(_)
        )
    }
}

/// A value as the store keeps it: at most `i64::MAX`.
pub fn fits(value: u64, what: &'static str) -> StoreResult<i64> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { what, value })
}
