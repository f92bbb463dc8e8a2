//! baton-proto
