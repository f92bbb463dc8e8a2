//! Pack validation errors: every one carries a position and, where there is
//! one, the instruction it belongs to, so an operator can jump straight to it.

use std::fmt;

use crate::yaml::Pos;

/// One problem in a pack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackError {
    /// Where in the file (1-based line and column).
    pub pos: Pos,
    /// The instruction it concerns, if any.
    pub instruction: Option<String>,
    /// What is wrong, in words an operator can act on.
    pub message: String,
}

impl fmt::Display for PackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.pos)?;
        if let Some(id) = &self.instruction {
            write!(f, "instruction `{id}`: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found in a pack, in file order. Never empty.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct PackErrors(pub Vec<PackError>);

impl PackErrors {
    /// The errors one per line as `FILE:LINE:COL: message`, the format
    /// editors and CI annotators understand.
    pub fn render(&self, file: &str) -> String {
        let mut out = String::new();
        for e in &self.0 {
            out.push_str(file);
            out.push(':');
            out.push_str(&e.to_string());
            out.push('\n');
        }
        out
    }

    pub(crate) fn single(pos: Pos, message: impl Into<String>) -> Self {
        PackErrors(vec![PackError {
            pos,
            instruction: None,
            message: message.into(),
        }])
    }
}

impl fmt::Display for PackErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}
