//! Why an exec was refused, on its own: the policy (which the agent's
//! configuration holds) returns it without importing the pool.

/// Why a request was refused (by [`ExecPolicy::check`](super::ExecPolicy::check)
/// or [`ExecPool::submit`](super::ExecPool::submit); nothing was started).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The program may not run on this agent.
    #[error("exec of {program:?} refused: {reason}")]
    NotAllowed {
        /// The program as requested.
        program: String,
        /// Which rule it broke.
        reason: String,
    },
    /// Environment keys the agent's exec allowlist does not allow for the
    /// program.
    #[error("{}", env_not_allowed(.program, .refused, .allowed))]
    EnvNotAllowed {
        /// The program.
        program: String,
        /// The refused keys, sorted.
        refused: Vec<String>,
        /// The keys allowed for the program, sorted.
        allowed: Vec<String>,
    },
    /// An environment entry that can never be passed (malformed, or
    /// `BATON_*`, which the agent sets itself).
    #[error("exec of {program:?} refused: environment variable {key:?} {reason}")]
    BadEnv {
        /// The program.
        program: String,
        /// The variable.
        key: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// An argument with a NUL byte.
    #[error("exec of {program:?} refused: argument {index} contains a NUL byte")]
    BadArg {
        /// The program.
        program: String,
        /// Which argument (0-based).
        index: usize,
    },
    /// All workers busy and the queue full: a schedule fires faster than its
    /// programs finish. Refused rather than queued without bound.
    #[error("exec queue full ({capacity} waiting): programs finish slower than they are scheduled")]
    QueueFull {
        /// Queue capacity.
        capacity: usize,
    },
    /// The pool could not start (no worker thread, no stop pipe) or has stopped.
    #[error("exec pool unavailable: {0}")]
    Unavailable(String),
}

fn env_not_allowed(program: &str, refused: &[String], allowed: &[String]) -> String {
    let (s, are) = if refused.len() == 1 {
        ("", "is")
    } else {
        ("s", "are")
    };
    format!(
        "exec of {program:?} refused: environment variable{s} {} {are} not allowed for this \
         program by the agent's exec-allowlist (allowed: {})",
        refused.join(", "),
        if allowed.is_empty() {
            "none".to_owned()
        } else {
            allowed.join(", ")
        }
    )
}
