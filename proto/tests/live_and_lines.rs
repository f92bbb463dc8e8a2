//! `Pack::check_live` (what needs "now") and line ownership
//! (`shared_lines`, `driven_lines`, `line_conflicts`).

use baton_proto::RefTime;
use baton_proto::pack::{Line, LineRef, Pack, parse_pack};
use baton_proto::time::parse_instant_arg;

fn pack(yaml: &str) -> Pack {
    parse_pack(yaml).unwrap_or_else(|e| panic!("{e}"))
}

fn t(s: &str) -> RefTime {
    parse_instant_arg("t", s).expect("instant")
}

fn line(chip: Option<&str>, offset: u32) -> LineRef {
    LineRef {
        chip: chip.map(str::to_string),
        line: Line::Offset(offset),
    }
}

#[test]
fn a_cron_of_past_years_parses_but_is_refused_live() {
    let p = pack(
        "pack: p\nversion: 1\ninstructions:\n  - {id: old, action: noop, cron: \"* * * * * * 2020\"}\n  - {id: gone, action: noop, at: 2021-01-01T00:00:00Z}\n  - id: over\n    action: noop\n    every: 1s\n    until: 2021-01-01T00:00:00Z\n  - {id: ok, action: noop, cron: \"@daily\"}\n",
    );
    assert_eq!(p.check_live(t("2020-12-31T23:59:59Z")), Ok(()));
    let e = p
        .check_live(t("2026-12-01T00:00:00Z"))
        .expect_err("past years");
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(e.0[0].instruction.as_deref(), Some("old"));
    assert_eq!((e.0[0].pos.line, e.0[0].pos.col), (4, 35));
    assert!(
        e.0[0]
            .message
            .contains("cron `* * * * * * 2020` can never fire again"),
        "{e}"
    );
}

#[test]
fn check_live_starts_at_a_later_start_at() {
    let p = pack(
        "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    cron: \"0 0 0 1 1 * 2027-2030\"\n    start_at: 2029-06-01T00:00:00Z\n",
    );
    assert_eq!(p.check_live(t("2026-12-01T00:00:00Z")), Ok(()));
    assert!(p.check_live(t("2030-06-01T00:00:00Z")).is_err());
}

const DRIVER: &str = "pack: p\nversion: 1\nshared_lines: [5, \"gpiochip1:7\"]\nsafe_state:\n  - {action: gpio.write, params: {line: 9, value: 0}}\ninstructions:\n  - {id: a, action: gpio.write, params: {line: 5, value: 1}, every: 1s, on_failure: {action: gpio.write, params: {line: 6, value: 0}}}\n  - {id: b, action: gpio.toggle, params: {line: 7, chip: /dev/gpiochip1}, every: 1s}\n  - {id: c, action: gpio.read, params: {line: 8}, every: 1s}\n";

#[test]
fn driven_lines_are_writes_everywhere_and_normalised() {
    let p = pack(DRIVER);
    let driven: Vec<LineRef> = p.driven_lines().into_iter().collect();
    assert_eq!(
        driven,
        [
            line(None, 5),
            line(None, 6),
            line(None, 9),
            line(Some("gpiochip1"), 7)
        ]
    );
    assert_eq!(p.shared_lines, [line(None, 5), line(Some("gpiochip1"), 7)]);
}

#[test]
fn conflicts_are_driven_lines_not_shared_by_both() {
    let a = pack(DRIVER);
    let b = pack(
        "pack: q\nversion: 1\nshared_lines: [\"gpiochip0:5\"]\ninstructions:\n  - {id: a, action: gpio.pulse, params: {line: 5, chip: gpiochip0, width: 1ms}, every: 1s}\n  - {id: b, action: gpio.write, params: {line: 7, chip: gpiochip1, value: 1}, every: 1s}\n  - {id: c, action: gpio.write, params: {line: 8, value: 1}, every: 1s}\n",
    );
    // On an agent whose default chip is gpiochip0, `5` and `gpiochip0:5`
    // are one line, shared by both; gpiochip1:7 is shared by `p` only; 8 is
    // only read by `p`.
    assert_eq!(
        a.line_conflicts(&b, Some("gpiochip0")),
        [line(Some("gpiochip1"), 7)]
    );
    assert_eq!(
        b.line_conflicts(&a, Some("gpiochip0")),
        [line(Some("gpiochip1"), 7)]
    );
    // Without the default chip, `5` and `gpiochip0:5` cannot be matched.
    assert_eq!(a.line_conflicts(&b, None), [line(Some("gpiochip1"), 7)]);
    assert!(
        a.line_conflicts(&a, None)
            .iter()
            .all(|l| *l != line(None, 5))
    );
}
