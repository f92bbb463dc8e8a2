//! baton-cron
