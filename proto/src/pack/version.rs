//! A pack's text at another version: what a rollback pushes (the previous
//! version's content, numbered above the latest, since agents refuse
//! lower versions).
//!
//! The number is replaced where the parsed document says the top-level
//! `version` scalar is, and every other byte is kept: comments, layout,
//! flow or block style. The result is parsed again and must be the same
//! pack at the new version.

use super::{PackErrors, parse_pack};
use crate::yaml::{self, Limits, Pos, Value};

/// `text` (a valid pack) with its `version` set to `version`.
pub fn with_version(text: &str, version: u64) -> Result<String, PackErrors> {
    let pack = parse_pack(text)?;
    let root =
        yaml::parse(text, Limits::default()).map_err(|e| PackErrors::single(e.pos, e.message))?;
    let fail = |pos: Pos, m: &str| PackErrors::single(pos, m.to_string());
    let Value::Map(entries) = &root.value else {
        return Err(fail(root.pos, "a pack is a mapping"));
    };
    let value = entries
        .iter()
        .find(|(k, _)| k.as_scalar() == Some("version"))
        .map(|(_, v)| v)
        .ok_or_else(|| fail(root.pos, "no top-level `version`"))?;
    let Value::Scalar {
        text: old,
        plain: true,
    } = &value.value
    else {
        return Err(fail(value.pos, "`version` is not a plain number"));
    };
    let start = byte_offset(text, value.pos)
        .filter(|&i| text[i..].starts_with(old.as_str()))
        .ok_or_else(|| fail(value.pos, "`version` is not where the parser saw it"))?;
    let mut out = String::with_capacity(text.len() + 8);
    out.push_str(&text[..start]);
    out.push_str(&version.to_string());
    out.push_str(&text[start + old.len()..]);
    let again = parse_pack(&out)?;
    if again.version != version || again.id != pack.id || again.tenant != pack.tenant {
        return Err(fail(
            value.pos,
            "the pack did not read back at the new version",
        ));
    }
    Ok(out)
}

/// The byte offset of a 1-based line and column (in characters).
fn byte_offset(text: &str, pos: Pos) -> Option<usize> {
    let line = usize::try_from(pos.line).ok()?.checked_sub(1)?;
    let col = usize::try_from(pos.col).ok()?.checked_sub(1)?;
    let line_start = if line == 0 {
        0
    } else {
        text.match_indices('\n').nth(line - 1)?.0 + 1
    };
    let rest = &text[line_start..];
    let within = rest.char_indices().nth(col).map_or(rest.len(), |(i, _)| i);
    Some(line_start + within)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: &str =
        "pack: p\nversion: 3 # third\ninstructions:\n  - {id: a, action: noop, every: 1s}\n";

    #[test]
    fn only_the_version_changes_whatever_the_style() {
        assert_eq!(
            with_version(BLOCK, 12).expect("block"),
            "pack: p\nversion: 12 # third\ninstructions:\n  - {id: a, action: noop, every: 1s}\n"
        );
        let flow = "{pack: p, version: 3, instructions: [{id: a, action: noop, every: 1s}]}";
        assert_eq!(
            with_version(flow, 4).expect("flow"),
            "{pack: p, version: 4, instructions: [{id: a, action: noop, every: 1s}]}"
        );
        // A `version:` key deeper in the document is not the pack's.
        let nested =
            "pack: p\ninstructions:\n  - {id: version, action: noop, every: 1s}\nversion: 2\n";
        let out = with_version(nested, 9).expect("nested");
        assert!(
            out.ends_with("version: 9\n") && out.contains("{id: version,"),
            "{out}"
        );
        // Non-ASCII before the number: columns are characters.
        let wide = "pack: p\ndescription: \"Pressé\"\nversion:    7\ninstructions:\n  - {id: a, action: noop, every: 1s}\n";
        assert!(
            with_version(wide, 70)
                .expect("wide")
                .contains("version:    70\n")
        );
    }

    #[test]
    fn a_text_that_is_not_a_pack_is_refused() {
        assert!(with_version("pack: p\n", 2).is_err());
        assert!(with_version("{{", 2).is_err());
    }
}
