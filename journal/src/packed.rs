//! Stored packs as the journal keeps them in memory: deflated.
//!
//! The journal must hold every accepted pack to rewrite it at compaction,
//! but a large pack's YAML is most of the agent's memory if kept as text
//! (~90 bytes per instruction, highly repetitive). Deflated it is a few
//! bytes per instruction; it is inflated only at start-up and compaction.

use super::{StopReason, StoredPack};

/// A stored pack with its YAML deflated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PackedPack {
    pub(crate) tenant: String,
    pub(crate) pack: String,
    pub(crate) version: u64,
    pub(crate) accepted_ns: i64,
    /// Why this version stopped for good, if it did.
    pub(crate) stopped: Option<StopReason>,
    yaml_deflated: Box<[u8]>,
    yaml_len: usize,
}

impl PackedPack {
    pub(crate) fn new(
        tenant: &str,
        pack: &str,
        version: u64,
        accepted_ns: i64,
        yaml: &str,
    ) -> Self {
        PackedPack {
            tenant: tenant.to_owned(),
            pack: pack.to_owned(),
            version,
            accepted_ns,
            stopped: None,
            yaml_deflated: miniz_oxide::deflate::compress_to_vec(yaml.as_bytes(), 6)
                .into_boxed_slice(),
            yaml_len: yaml.len(),
        }
    }

    /// The YAML text again.
    pub(crate) fn yaml(&self) -> String {
        let bytes =
            miniz_oxide::inflate::decompress_to_vec_with_limit(&self.yaml_deflated, self.yaml_len)
                .expect("deflated by `new` from exactly `yaml_len` bytes in this process");
        String::from_utf8(bytes).expect("deflated from a `str`")
    }

    pub(crate) fn to_stored(&self) -> StoredPack {
        StoredPack {
            tenant: self.tenant.clone(),
            pack: self.pack.clone(),
            version: self.version,
            yaml: self.yaml(),
            accepted_ns: self.accepted_ns,
            stopped: self.stopped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_is_smaller() {
        let yaml: String = (0..1000)
            .map(|i| format!("  - {{id: i{i}, action: gpio.write, params: {{line: 1, value: 1}}, every: 1h}}\n"))
            .collect();
        let p = PackedPack::new("t", "p", 3, 7, &yaml);
        assert_eq!(p.yaml(), yaml);
        assert!(
            p.yaml_deflated.len() * 10 < yaml.len(),
            "{} bytes",
            p.yaml_deflated.len()
        );
        let s = p.to_stored();
        assert_eq!(
            (s.tenant.as_str(), s.pack.as_str(), s.version, s.accepted_ns),
            ("t", "p", 3, 7)
        );
    }
}
