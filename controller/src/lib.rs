//! baton-controller
