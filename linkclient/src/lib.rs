//! The client side of baton's gRPC link, in one place for the two programs
//! that dial a controller: the agent (its `Link.Connect` stream) and the
//! operator CLI (`Admin` calls). Before this crate each kept its own copy of
//! the same settings, and a change to one (a keep-alive, a message cap)
//! could silently miss the other.
//!
//! - [`tls`]: the PEM files of an mTLS client ([`TlsFiles`]) and tonic's
//!   configuration read from them, an unreadable file named in the error;
//! - [`policy`]: the endpoint's settings (connect timeout, HTTP/2
//!   keep-alives, message caps), one set of constants, with the one
//!   setting on which the agent and the CLI differ named
//!   ([`policy::EndpointPolicy`]);
//! - [`plaintext`]: the rule that `http://` goes only toward this
//!   machine's loopback unless explicitly allowed;
//! - [`connect`]: an endpoint to one controller address (a resolved
//!   address dialled under the URL's name) and the Link / Admin clients
//!   with the caps.
//!
//! It does no IO beyond reading the PEM files and dialling, and holds no
//! state: each call stands alone.

#![forbid(unsafe_code)]

pub mod connect;
pub mod plaintext;
pub mod policy;
pub mod tls;

pub use connect::{Resolved, admin_client, connect_link, endpoint, link_client};
pub use plaintext::{Plaintext, PlaintextRefused, check_plaintext};
pub use policy::EndpointPolicy;
pub use tls::{TlsFileError, TlsFiles};
