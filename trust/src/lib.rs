//! Who may sign what a box runs, and the checks of it (issue 39): Ed25519
//! keys ([`keys`]); a trust list signed by an offline root key, naming per
//! tenant the operator keys whose packs the agent takes and the release
//! keys of agent builds, with a version that only goes up, an expiry and
//! root rotation ([`list`]); and pack signatures over the tenant and the
//! pack's exact bytes ([`pack`]); release signatures over an agent
//! build's manifest ([`release`]).
//!
//! In the spirit of TUF and Uptane, kept small: one root role whose key
//! stays offline and signs the list, and the roles it names. A controller
//! that holds no operator key cannot make a box run anything of a tenant
//! whose list requires signatures; a list older than the one the box holds
//! is refused, so an old key cannot come back by replaying an old list.
//!
//! Pure: no files, no clock (the time comes in as an argument), nothing
//! of the agent or the controller.

#![forbid(unsafe_code)]

pub mod keys;
pub mod list;
pub mod pack;
pub mod release;

pub use keys::{KeyError, KeyId, PublicKey, Signature, SigningKey};
pub use list::{SignedList, TenantTrust, Trust, TrustError, TrustList};
pub use pack::{PackSignature, PackSignatureError, PackVerdict};
pub use release::{ReleaseError, ReleaseManifest, SignedRelease};
