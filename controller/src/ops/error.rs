//! What an operator command fails with.

/// A failure of an operator command: message, exit code.
#[derive(Debug)]
pub struct OpError {
    /// What went wrong, for stderr.
    pub message: String,
    /// Exit code (1: refused / failed, 2: usage, 3: still pending).
    pub code: u8,
}

impl OpError {
    /// Code 1.
    pub fn fail(message: impl Into<String>) -> OpError {
        OpError {
            message: message.into(),
            code: 1,
        }
    }

    /// Code 2: the command line is wrong.
    pub fn usage(message: impl Into<String>) -> OpError {
        OpError {
            message: message.into(),
            code: 2,
        }
    }
}
