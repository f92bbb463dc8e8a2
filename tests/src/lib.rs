//! Helpers for end-to-end tests live in the test files.
