//! The plaintext rule: `http://` toward a controller only when the user
//! says so (`--insecure`), and only toward this machine's loopback unless
//! they say so again (`--insecure-any`): a name that is not `localhost`
//! may resolve anywhere, and anyone on the path could then act as either
//! end. The agent's configuration and the operator CLI apply this one
//! check; each words the consequence for its own user.

pub use baton_proto::wire::is_loopback_host;

/// What the user allowed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plaintext {
    /// `--insecure`: plaintext toward loopback.
    pub insecure: bool,
    /// `--insecure-any`: plaintext toward any address (with `insecure`).
    pub insecure_any: bool,
}

/// Why a plaintext URL is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlaintextRefused {
    /// No `--insecure`.
    #[error("plaintext link needs --insecure")]
    NotAllowed,
    /// Not loopback, and no `--insecure-any`.
    #[error("{NOT_LOOPBACK}")]
    NotLoopback,
}

/// The words for [`PlaintextRefused::NotLoopback`], as both programs start
/// their message.
pub const NOT_LOOPBACK: &str = "plaintext toward a non-loopback controller";

/// What to do instead, as both programs end their message.
pub const NOT_LOOPBACK_REMEDY: &str =
    "use https:// with --cert, --key and --ca, or add --insecure-any on a network you trust";

/// Whether plaintext may go to `host` (a URL's host; `None` or empty: a
/// URL without one, never loopback).
pub fn check_plaintext(host: Option<&str>, allowed: Plaintext) -> Result<(), PlaintextRefused> {
    if !allowed.insecure {
        return Err(PlaintextRefused::NotAllowed);
    }
    if !allowed.insecure_any && !host.is_some_and(is_loopback_host) {
        return Err(PlaintextRefused::NotLoopback);
    }
    Ok(())
}

/// The host of `url`, if it parses as a URI with one.
pub fn url_host(url: &str) -> Option<String> {
    url.parse::<tonic::transport::Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOPBACK: Plaintext = Plaintext {
        insecure: true,
        insecure_any: false,
    };
    const ANY: Plaintext = Plaintext {
        insecure: true,
        insecure_any: true,
    };

    #[test]
    fn plaintext_needs_insecure_even_toward_loopback() {
        assert_eq!(
            check_plaintext(Some("127.0.0.1"), Plaintext::default()),
            Err(PlaintextRefused::NotAllowed)
        );
        // --insecure-any alone is not --insecure.
        let any_only = Plaintext {
            insecure: false,
            insecure_any: true,
        };
        assert_eq!(
            check_plaintext(Some("10.0.0.5"), any_only),
            Err(PlaintextRefused::NotAllowed)
        );
    }

    #[test]
    fn insecure_allows_loopback_only() {
        for h in ["127.0.0.1", "localhost", "[::1]"] {
            assert_eq!(check_plaintext(Some(h), LOOPBACK), Ok(()), "{h}");
        }
        for h in ["10.0.0.5", "ctl.example", "localhost.evil", ""] {
            assert_eq!(
                check_plaintext(Some(h), LOOPBACK),
                Err(PlaintextRefused::NotLoopback),
                "{h}"
            );
        }
        assert_eq!(
            check_plaintext(None, LOOPBACK),
            Err(PlaintextRefused::NotLoopback)
        );
    }

    #[test]
    fn insecure_any_allows_any_host() {
        for h in [Some("10.0.0.5"), Some("ctl.example"), None] {
            assert_eq!(check_plaintext(h, ANY), Ok(()), "{h:?}");
        }
    }

    #[test]
    fn hosts_of_urls() {
        assert_eq!(
            url_host("http://127.0.0.1:7411").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(url_host("http://[::1]:7411").as_deref(), Some("[::1]"));
        assert_eq!(
            url_host("http://ctl.example").as_deref(),
            Some("ctl.example")
        );
        assert_eq!(url_host("not a url"), None);
        assert_eq!(url_host("/just/a/path"), None);
    }

    #[test]
    fn the_refusal_says_what_and_the_remedy_is_shared() {
        assert_eq!(
            PlaintextRefused::NotLoopback.to_string(),
            "plaintext toward a non-loopback controller"
        );
        assert!(NOT_LOOPBACK_REMEDY.contains("--insecure-any"));
    }
}
