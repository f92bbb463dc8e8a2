//! baton-agent
