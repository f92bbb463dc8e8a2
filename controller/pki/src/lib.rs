//! baton-pki: the fleet's certificate authority ([`ca`]), who a peer
//! certificate says it is ([`identity`]), and the operator tokens bound to
//! certificates that the dashboard's log-in takes ([`tokens`]).

#![forbid(unsafe_code)]

pub mod ca;
pub mod identity;
pub mod tokens;
