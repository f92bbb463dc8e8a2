//! Every `unsafe` block of baton: the calls into the kernel and the C
//! library that neither `nix` nor `rustix` offers safely, each behind a safe
//! function with its SAFETY note, so every other crate of the workspace is
//! `#![forbid(unsafe_code)]`. Policy (when to lock, which priority, what a
//! refusal means) stays with the callers; here is only the call and the
//! argument that makes it sound.

pub mod futex;
pub mod heap;
pub mod pages;
pub mod process;
pub mod sched;
pub mod shared;
pub mod timex;

pub use heap::release_free_heap;
