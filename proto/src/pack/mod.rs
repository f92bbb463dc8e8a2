//! The pack language: parsing, validation, and the validated model.
//!
//! `parse_pack` is the one entry point both ends use; the agent calls it
//! again on every pack it receives (docs/design.md principle 2).
//!
//! # Errors
//!
//! A refused pack comes back with *every* problem found, in file order,
//! each with its line, column and (inside an instruction) the instruction
//! id as written. The pack-wide checks — duplicate ids, `after` targets and
//! cycles, `shared_lines` — also look at instructions that have other
//! errors, so fixing one batch never uncovers another. Only a YAML syntax
//! error, or a document that is not a mapping, stops at one error.
//!
//! # Rules worth knowing
//!
//! - **`max_lateness`** is at least [`MIN_MAX_LATENESS`] (1ms): every
//!   firing is a little late, so a smaller bound (`0s`!) would skip
//!   firings at random or always.
//! - **Instants** (`at`, `start_at`, `until`) lie in [`crate::RefTime`]'s
//!   range, 1677-09-21 to 2262-04-11 (i64 nanoseconds since 1970); a
//!   date outside it is refused with that range, not as bad syntax.
//! - **Schedules that can never fire** are refused: at parse time a cron
//!   that matches no date, or none between its `start_at` and `until`;
//!   against a clock, with [`Pack::check_live`], a cron with no firing
//!   left at or after `now` (a year field in the past). A one-shot `at` or
//!   an `until` that is merely in the past is *not* refused: it was
//!   missed, and missed firings are reported at runtime.
//! - **`lease`** (pack level, optional, a duration greater than zero): how
//!   long the pack keeps running while the agent has no contact with its
//!   controller. Past it the agent drives the pack's safe state (reason
//!   `lease_lost`) and the pack stays stopped until a higher version
//!   arrives. Without `lease` a pack runs its schedule offline. Only an
//!   agent with a controller configured enforces it.
//! - **`on_clock_loss`** (pack level, optional): `continue` (default) or
//!   `safe_state`. A pack that needs absolute time
//!   ([`Pack::needs_absolute_time`]) is accepted only while the agent's
//!   clock is within its limit; if sync is later lost past the limit,
//!   `continue` keeps firing (each firing's feedback carries its
//!   uncertainty) and `safe_state` drives the safe state (`clock_lost`)
//!   until a higher version arrives.
//! - **`shared_lines`** (pack level, optional): the GPIO lines this pack
//!   agrees to share with other packs on the same agent. Two packs may
//!   drive (`gpio.write`, `gpio.toggle`, `gpio.pulse`; reads do not count)
//!   the same line only if both list it. Each entry must be a line the
//!   pack drives, written as its actions write it (`5`, `RELAY_MAIN`,
//!   `"gpiochip1:7"` or `{line, chip}`), and appear once. See
//!   [`Pack::driven_lines`] and [`Pack::line_conflicts`].

mod dag;
mod decode;
mod error;
mod lines;
mod live;
mod model;
mod occurrence;
pub mod rollout;
#[cfg(feature = "schema")]
pub mod schema;
mod version;

pub use dag::{dependents, upstream};
pub use decode::{
    ACTIONS, DEFAULT_MAX_LATENESS, DEFAULT_TIMEOUT, MAX_ATTEMPTS, MAX_ID_LEN, MAX_INSTRUCTIONS,
    MAX_STAGES, MIN_MAX_LATENESS, MIN_PERIOD, check_ident, is_ident,
};
pub use error::{PackError, PackErrors};
pub use model::*;
pub use version::with_version;

use crate::yaml::{self, Limits, Pos};

/// Largest pack source accepted, in bytes.
pub const MAX_PACK_BYTES: usize = 1024 * 1024;

/// Parse and validate a pack from YAML text.
///
/// Returns every problem found, each with its position; never panics and
/// does bounded work on any input (size, nesting and alias limits). Pure:
/// it reads no clock, so what depends on "now" is left to
/// [`Pack::check_live`], which callers run next with their clock.
pub fn parse_pack(text: &str) -> Result<Pack, PackErrors> {
    if text.len() > MAX_PACK_BYTES {
        return Err(PackErrors::single(
            Pos { line: 1, col: 1 },
            format!(
                "pack is too large: {} bytes (at most {MAX_PACK_BYTES} bytes of YAML)",
                text.len()
            ),
        ));
    }
    let root =
        yaml::parse(text, Limits::default()).map_err(|e| PackErrors::single(e.pos, e.message))?;
    decode::pack(&root)
}

/// Parse and validate an agent update's plan ([`UpdatePlan`]) from YAML
/// text, with the same limits and messages as a pack.
pub fn parse_update_plan(text: &str) -> Result<UpdatePlan, PackErrors> {
    if text.len() > MAX_PACK_BYTES {
        return Err(PackErrors::single(
            Pos { line: 1, col: 1 },
            format!("plan is too large: {} bytes", text.len()),
        ));
    }
    let root =
        yaml::parse(text, Limits::default()).map_err(|e| PackErrors::single(e.pos, e.message))?;
    decode::update_plan(&root)
}

/// Read and validate a pack file: at most [`MAX_PACK_BYTES`] + 1 bytes are
/// read, so a huge file is refused without reading it all. Returns the
/// source text (what gets journalled or pushed) with the pack; errors come
/// back rendered as `FILE:LINE:COL: message` lines, one per problem.
pub fn read_pack_file(path: &std::path::Path) -> Result<(String, Pack), String> {
    use std::io::Read;
    let name = path.display().to_string();
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_PACK_BYTES as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("{name}:1:1: cannot read the file: {e}"))?;
    let pack = parse_pack_bytes(&bytes).map_err(|e| e.render(&name).trim_end().to_string())?;
    let text = String::from_utf8(bytes).expect("parse_pack_bytes accepted it, so it is UTF-8");
    Ok((text, pack))
}

/// Parse a pack from raw bytes (a file or the wire), refusing non-UTF-8.
pub fn parse_pack_bytes(bytes: &[u8]) -> Result<Pack, PackErrors> {
    if bytes.len() > MAX_PACK_BYTES {
        return parse_pack(&" ".repeat(MAX_PACK_BYTES + 1));
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => parse_pack(text),
        Err(e) => {
            let prefix = &bytes[..e.valid_up_to()];
            let line = 1 + prefix.iter().filter(|&&b| b == b'\n').count();
            let col = 1 + prefix.iter().rev().take_while(|&&b| b != b'\n').count();
            Err(PackErrors::single(
                Pos::new(line, col),
                "pack is not valid UTF-8",
            ))
        }
    }
}
