//! The parser + validator on hostile input: arbitrary bytes and mutated
//! valid packs. Never a panic, never more than a second per input, and a
//! refusal always carries at least one positioned error.

use std::time::{Duration, Instant};

use baton_proto::pack::{parse_pack, parse_pack_bytes};
use proptest::prelude::*;

const EXAMPLES: [&str; 4] = [
    include_str!("../../examples/packs/blink.yaml"),
    include_str!("../../examples/packs/press-sequence.yaml"),
    include_str!("../../examples/packs/nightly-cron.yaml"),
    include_str!("../../examples/packs/maintenance-exec.yaml"),
];

/// Fragments that are likely to hit interesting paths when spliced in.
const FRAGMENTS: [&str; 16] = [
    ": ",
    "- ",
    "{",
    "}",
    "[",
    "]",
    "&a ",
    "*a",
    "\n  ",
    "\"",
    "'",
    "after: [",
    "cron: \"0 0 0 L * *\"",
    "every: 0s",
    "at: 2026-03-29T02:30:00",
    "<<: *a",
];

fn check(bytes: &[u8]) {
    let start = Instant::now();
    let result = parse_pack_bytes(bytes);
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "took {took:?} on {:?}",
        String::from_utf8_lossy(bytes)
    );
    if let Err(e) = result {
        assert!(!e.0.is_empty(), "a refusal must name at least one error");
        for err in &e.0 {
            assert!(
                err.pos.line >= 1 && err.pos.col >= 1,
                "unpositioned error: {err}"
            );
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Delete(usize, usize),
    Insert(usize, usize),
    Duplicate(usize, usize),
    Flip(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0usize..40).prop_map(|(a, n)| Mutation::Delete(a, n)),
        (any::<usize>(), 0usize..FRAGMENTS.len()).prop_map(|(a, f)| Mutation::Insert(a, f)),
        (any::<usize>(), 0usize..200).prop_map(|(a, n)| Mutation::Duplicate(a, n)),
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Flip(a, b)),
    ]
}

fn apply(text: &str, muts: &[Mutation]) -> Vec<u8> {
    let mut b = text.as_bytes().to_vec();
    for m in muts {
        let len = b.len().max(1);
        match *m {
            Mutation::Delete(a, n) => {
                let a = a % len;
                let e = (a + n).min(b.len());
                if a < e {
                    b.drain(a..e);
                }
            }
            Mutation::Insert(a, f) => {
                let a = a % (b.len() + 1);
                b.splice(a..a, FRAGMENTS[f].bytes());
            }
            Mutation::Duplicate(a, n) => {
                let a = a % len;
                let e = (a + n).min(b.len());
                if a < e {
                    let chunk = b[a..e].to_vec();
                    b.splice(e..e, chunk);
                }
            }
            Mutation::Flip(a, x) => {
                if !b.is_empty() {
                    let a = a % b.len();
                    b[a] ^= x;
                }
            }
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        check(&bytes);
    }

    #[test]
    fn mutated_examples_never_panic(which in 0usize..EXAMPLES.len(), muts in prop::collection::vec(mutation(), 1..8)) {
        check(&apply(EXAMPLES[which], &muts));
    }
}

#[test]
fn examples_are_valid() {
    for e in EXAMPLES {
        parse_pack(e).unwrap_or_else(|err| panic!("{err}"));
    }
}

#[test]
fn a_wide_alias_fan_out_is_refused_quickly() {
    // 9 levels of 9-way aliases would expand to 387 420 489 nodes.
    let mut doc = String::from("pack: p\nversion: 1\nl0: &l0 [x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        doc.push_str(&format!(
            "l{i}: &l{i} [{}]\n",
            vec![format!("*l{}", i - 1); 9].join(", ")
        ));
    }
    doc.push_str("instructions: []\n");
    check(doc.as_bytes());
    let e = parse_pack(&doc).expect_err("bomb");
    assert!(e.to_string().contains("alias bomb"), "{e}");
}
