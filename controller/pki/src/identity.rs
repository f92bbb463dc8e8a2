//! Who a peer certificate says it is: the one `baton:` SAN URI of a
//! certificate (already verified by TLS against the fleet's CA), read as
//! an [`Identity`] (see [`baton_model::identity`] for the URI forms).

pub use baton_model::identity::*;

/// What the controller knows of a peer certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCert {
    /// Who it is.
    pub identity: Identity,
    /// Its serial number, lowercase hex (what `revoked.txt` lists).
    pub serial: String,
}

/// The identity in a DER certificate (already verified by TLS against the
/// fleet's CA): exactly one `baton:` SAN URI.
pub fn from_cert_der(der: &[u8]) -> Result<PeerCert, IdentityError> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| IdentityError(format!("unreadable certificate: {e}")))?;
    let serial = hex(cert.tbs_certificate.raw_serial());
    let san = cert.subject_alternative_name().map_err(|e| {
        IdentityError(format!(
            "certificate {serial}: bad subject alternative names: {e}"
        ))
    })?;
    let uris: Vec<&str> = san
        .iter()
        .flat_map(|s| s.value.general_names.iter())
        .filter_map(|g| match g {
            GeneralName::URI(u) if u.starts_with("baton:") => Some(*u),
            _ => None,
        })
        .collect();
    match uris.as_slice() {
        [one] => Ok(PeerCert {
            identity: Identity::from_uri(one)?,
            serial,
        }),
        [] => Err(IdentityError(format!(
            "certificate {serial} names no baton identity (no baton: URI)"
        ))),
        _ => Err(IdentityError(format!(
            "certificate {serial} names more than one baton identity"
        ))),
    }
}

/// Lowercase hex, leading zero bytes of a DER integer dropped.
pub fn hex(bytes: &[u8]) -> String {
    let trimmed = match bytes.iter().position(|b| *b != 0) {
        Some(i) => &bytes[i..],
        None => &bytes[bytes.len().saturating_sub(1)..],
    };
    trimmed.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_are_hex_without_leading_zero_bytes() {
        assert_eq!(hex(&[0x00, 0x8f, 0x01]), "8f01");
        assert_eq!(hex(&[0x00]), "00");
        assert_eq!(hex(&[]), "");
    }
}
