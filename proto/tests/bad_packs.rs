//! Table of bad packs: each must be refused with a specific message at a
//! specific position (and instruction, where there is one).

use baton_proto::pack::parse_pack;

struct Case {
    name: &'static str,
    yaml: &'static str,
    /// (line, col, instruction, message fragment) for each expected error.
    expect: &'static [(u32, u32, Option<&'static str>, &'static str)],
}

const HEAD: &str = "pack: p\nversion: 1\ninstructions:\n";

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "not a mapping",
            yaml: "- a\n- b\n",
            expect: &[(1, 1, None, "a pack must be a mapping, found a list")],
        },
        Case {
            name: "empty file",
            yaml: "",
            expect: &[(1, 1, None, "the file is empty")],
        },
        Case {
            name: "yaml syntax",
            yaml: "pack: p\nversion: [1\n",
            expect: &[(3, 1, None, "invalid YAML")],
        },
        Case {
            name: "unknown top-level key with suggestion",
            yaml: "pack: p\nversion: 1\ntimezon: UTC\ninstructions:\n  - {id: a, action: noop, at: 2026-12-01T10:00:00Z}\n",
            expect: &[(
                3,
                1,
                None,
                "unknown key `timezon` in a pack (did you mean `timezone`?)",
            )],
        },
        Case {
            name: "missing pack id",
            yaml: "version: 1\ninstructions:\n  - {id: a, action: noop, at: 2026-12-01T10:00:00Z}\n",
            expect: &[(1, 1, None, "a pack is missing required key `pack`")],
        },
        Case {
            name: "missing version",
            yaml: "pack: p\ninstructions:\n  - {id: a, action: noop, at: 2026-12-01T10:00:00Z}\n",
            expect: &[(1, 1, None, "a pack is missing required key `version`")],
        },
        Case {
            name: "missing instructions",
            yaml: "pack: p\nversion: 1\n",
            expect: &[(1, 1, None, "a pack is missing required key `instructions`")],
        },
        Case {
            name: "version not a number",
            yaml: "pack: p\nversion: seven\ninstructions:\n  - {id: a, action: noop, at: 2026-12-01T10:00:00Z}\n",
            expect: &[(2, 10, None, "version must be a whole number, found `seven`")],
        },
        Case {
            name: "version negative",
            yaml: "pack: p\nversion: -1\ninstructions:\n  - {id: a, action: noop, at: 2026-12-01T10:00:00Z}\n",
            expect: &[(2, 10, None, "version must be a whole number, found `-1`")],
        },
        Case {
            name: "quoted version",
            yaml: "pack: p\nversion: \"1\"\ninstructions:\n  - {id: a, action: noop, at: 2026-12-01T10:00:00Z}\n",
            expect: &[(2, 10, None, "version must be a whole number")],
        },
        Case {
            name: "bad pack id",
            yaml: "pack: Line_3\nversion: 1\ninstructions:\n  - {id: a, action: noop, at: 2026-12-01T10:00:00Z}\n",
            expect: &[(1, 7, None, "invalid pack id `Line_3`")],
        },
        Case {
            name: "unknown timezone",
            yaml: "pack: p\nversion: 1\ntimezone: Mars/Olympus\ninstructions:\n  - {id: a, action: noop, at: 2026-12-01T10:00:00Z}\n",
            expect: &[(3, 11, None, "unknown timezone `Mars/Olympus`")],
        },
        Case {
            name: "instructions not a list",
            yaml: "pack: p\nversion: 1\ninstructions: {a: 1}\n",
            expect: &[(3, 15, None, "instructions must be a list, found a mapping")],
        },
        Case {
            name: "instructions empty",
            yaml: "pack: p\nversion: 1\ninstructions: []\n",
            expect: &[(3, 15, None, "instructions is empty")],
        },
        Case {
            name: "duplicate instruction id",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, at: 2026-12-01T10:00:00Z}\n  - {id: a, action: noop, at: 2026-12-01T11:00:00Z}\n",
            expect: &[(
                5,
                10,
                None,
                "duplicate instruction id `a` (first at line 4)",
            )],
        },
        Case {
            name: "duplicate key",
            yaml: "pack: p\nversion: 1\nversion: 2\ninstructions: []\n",
            expect: &[(3, 1, None, "duplicate key `version` (first at line 2)")],
        },
        Case {
            name: "two schedules",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    at: 2026-12-01T10:00:00Z\n    every: 1s\n",
            expect: &[(7, 5, Some("a"), "more than one schedule (at, every)")],
        },
        Case {
            name: "no schedule",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n",
            expect: &[(4, 5, Some("a"), "no schedule: give exactly one of")],
        },
        Case {
            name: "unknown action with suggestion",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: gpio.wrte\n    params: {line: 1, value: 1}\n    at: 2026-12-01T10:00:00Z\n",
            expect: &[(
                5,
                13,
                Some("a"),
                "unknown action `gpio.wrte` (did you mean `gpio.write`?)",
            )],
        },
        Case {
            name: "missing params",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: gpio.write\n    at: 2026-12-01T10:00:00Z\n",
            expect: &[(
                4,
                5,
                Some("a"),
                "action `gpio.write` needs `params` with line, value",
            )],
        },
        Case {
            name: "missing param value",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: gpio.write\n    params: {line: 1}\n    at: 2026-12-01T10:00:00Z\n",
            expect: &[(
                6,
                13,
                Some("a"),
                "params of gpio.write is missing required key `value`",
            )],
        },
        Case {
            name: "extra param",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: gpio.toggle\n    params: {line: 1, value: 1}\n    at: 2026-12-01T10:00:00Z\n",
            expect: &[(
                6,
                23,
                Some("a"),
                "unknown key `value` in params of gpio.toggle",
            )],
        },
        Case {
            name: "noop with params",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    params: {line: 1}\n    at: 2026-12-01T10:00:00Z\n",
            expect: &[(6, 13, Some("a"), "action `noop` takes no params")],
        },
        Case {
            name: "bad level",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: gpio.write\n    params: {line: 1, value: 2}\n    at: 2026-12-01T10:00:00Z\n",
            expect: &[(6, 30, Some("a"), "value must be 0 or 1, found `2`")],
        },
        Case {
            name: "line wrong type",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: gpio.read\n    params: {line: [1]}\n    at: 2026-12-01T10:00:00Z\n",
            expect: &[(
                6,
                20,
                Some("a"),
                "line must be an offset (`12`), a line name (`RELAY_MAIN`) or `CHIP:LINE`",
            )],
        },
        Case {
            name: "pulse without width",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: gpio.pulse\n    params: {line: 1}\n    at: 2026-12-01T10:00:00Z\n",
            expect: &[(
                6,
                13,
                Some("a"),
                "params of gpio.pulse is missing required key `width`",
            )],
        },
        Case {
            name: "pulse zero width",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: gpio.pulse\n    params: {line: 1, width: 0ms}\n    at: 2026-12-01T10:00:00Z\n",
            expect: &[(6, 30, Some("a"), "width must be greater than zero")],
        },
        Case {
            name: "exec relative program",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: exec\n    params: {program: logrotate}\n    at: 2026-12-01T10:00:00Z\n",
            expect: &[(
                6,
                23,
                Some("a"),
                "program `logrotate` must be an absolute path",
            )],
        },
        Case {
            name: "exec args not a list",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: exec\n    params: {program: /bin/true, args: -v}\n    at: 2026-12-01T10:00:00Z\n",
            expect: &[(6, 40, Some("a"), "args must be a list, found a scalar")],
        },
        Case {
            name: "bad duration unit",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 5 minutes\n",
            expect: &[(6, 12, Some("a"), "invalid duration `5 minutes`")],
        },
        Case {
            name: "zero period",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 0s\n",
            expect: &[(6, 12, Some("a"), "every must be greater than zero")],
        },
        Case {
            name: "period under 1ms",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 10us\n",
            expect: &[(6, 12, Some("a"), "every must be at least 1ms")],
        },
        Case {
            name: "bad instant",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    at: tomorrow\n",
            expect: &[(6, 9, Some("a"), "invalid date-time `tomorrow`")],
        },
        Case {
            name: "until before start_at",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 1s\n    start_at: 2026-12-01T10:00:00Z\n    until: 2026-12-01T09:00:00Z\n",
            expect: &[(8, 12, Some("a"), "`until` is before `start_at`")],
        },
        Case {
            name: "start_at on a one-shot",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    at: 2026-12-01T10:00:00Z\n    start_at: 2026-12-01T09:00:00Z\n",
            expect: &[(
                7,
                5,
                Some("a"),
                "`start_at` only applies to repeating schedules",
            )],
        },
        Case {
            name: "delay without after",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 1s\n    delay: 2s\n",
            expect: &[(7, 5, Some("a"), "`delay` only applies to `after` schedules")],
        },
        Case {
            name: "catch_up on a one-shot",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    at: 2026-12-01T10:00:00Z\n    catch_up: all\n",
            expect: &[(
                7,
                15,
                Some("a"),
                "catch_up only applies to repeating schedules",
            )],
        },
        Case {
            name: "bad catch_up value",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 1s\n    catch_up: some\n",
            expect: &[(
                7,
                15,
                Some("a"),
                "catch_up must be `none` (default), `last` or `all`",
            )],
        },
        Case {
            name: "bad on_give_up",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 1s\n    on_give_up: ignore\n",
            expect: &[(
                7,
                17,
                Some("a"),
                "on_give_up must be `safe_state` (default) or `continue`",
            )],
        },
        Case {
            name: "priority out of range",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 1s\n    priority: 300\n",
            expect: &[(7, 15, Some("a"), "priority must be at most 255, found 300")],
        },
        Case {
            name: "max_attempts zero",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 1s\n    retry: {max_attempts: 0}\n",
            expect: &[(7, 27, Some("a"), "retry.max_attempts must be at least 1")],
        },
        Case {
            name: "factor below one",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 1s\n    retry: {factor: 0.5}\n",
            expect: &[(7, 21, Some("a"), "retry.factor must be at least 1.0")],
        },
        Case {
            name: "jitter above one",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 1s\n    retry: {jitter: 1.5}\n",
            expect: &[(7, 21, Some("a"), "retry.jitter must be between 0 and 1")],
        },
        Case {
            name: "backoff above max_backoff in defaults",
            yaml: "pack: p\nversion: 1\ndefaults:\n  retry: {backoff: 10s, max_backoff: 1s}\ninstructions:\n  - {id: a, action: noop, every: 1s}\n",
            expect: &[(
                4,
                10,
                None,
                "retry.backoff (10s) is larger than retry.max_backoff (1s)",
            )],
        },
        Case {
            name: "override makes backoff exceed the default cap",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 1s\n    retry: {backoff: 1m}\n",
            expect: &[(
                7,
                12,
                Some("a"),
                "retry.backoff (1m) is larger than retry.max_backoff (5s)",
            )],
        },
        Case {
            name: "unknown retry key",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 1s\n    retry: {attempts: 3}\n",
            expect: &[(7, 13, Some("a"), "unknown key `attempts` in retry")],
        },
        Case {
            name: "after unknown target",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, every: 1s}\n  - {id: b, action: noop, after: [a, zz]}\n",
            expect: &[(
                5,
                38,
                Some("b"),
                "`after` names `zz`, which is not an instruction of this pack",
            )],
        },
        Case {
            name: "after empty",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, after: []}\n",
            expect: &[(
                4,
                34,
                Some("a"),
                "`after` needs at least one instruction id",
            )],
        },
        Case {
            name: "self dependency",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, after: [a]}\n",
            expect: &[(4, 35, Some("a"), "`after` forms a cycle: a -> a")],
        },
        Case {
            name: "three-cycle printed as a path",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, after: [c]}\n  - {id: b, action: noop, after: [a]}\n  - {id: c, action: noop, after: [b]}\n",
            expect: &[(5, 35, Some("b"), "`after` forms a cycle: b -> c -> a -> b")],
        },
        Case {
            name: "cron bad field",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    cron: \"0 61 * * * *\"\n",
            expect: &[(6, 14, Some("a"), "cron `0 61 * * * *`")],
        },
        Case {
            name: "cron never fires",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    cron: \"0 0 0 30 2 *\"\n",
            expect: &[(
                6,
                18,
                Some("a"),
                "cron `0 0 0 30 2 *`: the expression can never fire",
            )],
        },
        Case {
            name: "safe_state toggle refused",
            yaml: "pack: p\nversion: 1\nsafe_state:\n  - {action: gpio.toggle, params: {line: 1}}\ninstructions:\n  - {id: a, action: noop, every: 1s}\n",
            expect: &[(4, 5, None, "safe_state cannot use `gpio.toggle`")],
        },
        Case {
            name: "targets both",
            yaml: "pack: p\nversion: 1\ntargets: {agents: [x], labels: {a: b}}\ninstructions:\n  - {id: a, action: noop, every: 1s}\n",
            expect: &[(
                3,
                10,
                None,
                "targets takes either `agents` or `labels`, not both",
            )],
        },
        Case {
            name: "several errors all reported in file order",
            yaml: "pack: p\nversion: x\ninstructions:\n  - {id: a, action: nop, every: 1s}\n  - {id: b, action: noop, every: 1q}\n",
            expect: &[
                (2, 10, None, "version must be a whole number"),
                (
                    4,
                    21,
                    Some("a"),
                    "unknown action `nop` (did you mean `noop`?)",
                ),
                (5, 34, Some("b"), "invalid duration `1q`"),
            ],
        },
        Case {
            name: "lease of zero",
            yaml: "pack: p\nversion: 1\nlease: 0s\ninstructions:\n  - {id: a, action: noop, every: 1s}\n",
            expect: &[(3, 8, None, "lease must be greater than zero")],
        },
        Case {
            name: "lease that is not a duration",
            yaml: "pack: p\nversion: 1\nlease: [5m]\ninstructions:\n  - {id: a, action: noop, every: 1s}\n",
            expect: &[(
                3,
                8,
                None,
                "lease must be a duration like `500ms`, found a list",
            )],
        },
        Case {
            name: "lease with a bad unit",
            yaml: "pack: p\nversion: 1\nlease: 5 minutes\ninstructions:\n  - {id: a, action: noop, every: 1s}\n",
            expect: &[(3, 8, None, "lease: ")],
        },
        Case {
            name: "max_lateness zero in defaults",
            yaml: "pack: p\nversion: 1\ndefaults: {max_lateness: 0s}\ninstructions:\n  - {id: a, action: noop, every: 1s}\n",
            expect: &[(3, 26, None, "max_lateness must be at least 1ms, found 0s")],
        },
        Case {
            name: "max_lateness below the minimum on an instruction",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, every: 1s, max_lateness: 500us}\n",
            expect: &[(
                4,
                52,
                Some("a"),
                "max_lateness must be at least 1ms, found 500us",
            )],
        },
        Case {
            name: "at past the end of the supported range",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, at: 9999-12-31T23:59:59Z}\n",
            expect: &[(
                4,
                31,
                Some("a"),
                "at: `9999-12-31T23:59:59Z` is outside the supported range of instants: 1677-09-21T00:12:43.145224192Z to 2262-04-11T23:47:16.854775807Z",
            )],
        },
        Case {
            name: "start_at and until outside the range",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    every: 1s\n    start_at: 1600-01-01T00:00:00Z\n    until: 2300-01-01T00:00:00\n",
            expect: &[
                (
                    7,
                    15,
                    Some("a"),
                    "start_at: `1600-01-01T00:00:00Z` is outside the supported range",
                ),
                (
                    8,
                    12,
                    Some("a"),
                    "until: `2300-01-01T00:00:00` is outside the supported range",
                ),
            ],
        },
        Case {
            name: "cron with no firing after its start_at",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    cron: \"0 0 0 1 1 * 2027\"\n    start_at: 2028-01-01T00:00:00Z\n",
            expect: &[(
                6,
                11,
                Some("a"),
                "cron `0 0 0 1 1 * 2027` can never fire: it has no firing at or after start_at",
            )],
        },
        Case {
            name: "cron with no firing before its until",
            yaml: "pack: p\nversion: 1\ninstructions:\n  - id: a\n    action: noop\n    cron: \"0 0 0 1 1 * 2030\"\n    until: 2029-01-01T00:00:00Z\n",
            expect: &[(6, 11, Some("a"), "its first firing is 2030-01-01T00:00:00")],
        },
        Case {
            name: "shared_lines: a line the pack only reads, a duplicate, a bad entry",
            yaml: "pack: p\nversion: 1\nshared_lines: [5, RELAY, \"gpiochip1:7\", RELAY, [1], \":3\"]\nsafe_state:\n  - {action: gpio.write, params: {line: RELAY, value: 0}}\ninstructions:\n  - {id: a, action: gpio.read, params: {line: 5}, every: 1s}\n  - {id: b, action: gpio.pulse, params: {line: 7, chip: gpiochip1, width: 1ms}, every: 1s}\n",
            expect: &[
                (
                    3,
                    16,
                    None,
                    "shared_lines names 5, which no gpio.write, gpio.toggle or gpio.pulse of this pack drives (write the line as its actions do); the pack drives: RELAY, gpiochip1:7",
                ),
                (
                    3,
                    41,
                    None,
                    "shared_lines lists RELAY twice (first at line 3)",
                ),
                (3, 48, None, "a shared_lines entry must be a line"),
                (
                    3,
                    53,
                    None,
                    "shared_lines entry: `:3`: empty chip before `:`",
                ),
            ],
        },
        Case {
            name: "shared_lines not a list",
            yaml: "pack: p\nversion: 1\nshared_lines: 5\ninstructions:\n  - {id: a, action: gpio.write, params: {line: 5, value: 1}, every: 1s}\n",
            expect: &[(3, 15, None, "shared_lines must be a list of lines")],
        },
        Case {
            name: "every pass at once: header, actions, schedules, after targets, cycles",
            yaml: "pack: P\nversion: 1\ninstructions:\n  - {id: a, action: noop, after: [c], priority: 300}\n  - {id: b, action: noop, at: tomorrow}\n  - {id: c, action: nop, after: [a, zz]}\n  - {id: d, action: noop, cron: \"0 61 * * * *\", max_lateness: 0s}\n",
            expect: &[
                (1, 7, None, "invalid pack id `P`"),
                (4, 49, Some("a"), "priority must be at most 255, found 300"),
                (5, 31, Some("b"), "invalid date-time `tomorrow`"),
                (6, 21, Some("c"), "unknown action `nop`"),
                (6, 34, Some("c"), "`after` forms a cycle: c -> a -> c"),
                (
                    6,
                    37,
                    Some("c"),
                    "`after` names `zz`, which is not an instruction of this pack",
                ),
                (7, 36, Some("d"), "cron `0 61 * * * *`"),
                (7, 63, Some("d"), "max_lateness must be at least 1ms"),
            ],
        },
        Case {
            name: "every pass at once: a broken instruction still closes a cycle and names unknown targets",
            yaml: "pack: p\nversion: 1\ndefaults: {max_lateness: 0s}\ninstructions:\n  - id: x\n    action: gpio.write\n    params: {line: 1}\n    after: [y, ghost]\n  - id: y\n    action: noop\n    after: [x]\n    retry: {factor: 0.5}\n  - {id: y, action: noop, every: 1s}\n",
            expect: &[
                (3, 26, None, "max_lateness must be at least 1ms"),
                (
                    7,
                    13,
                    Some("x"),
                    "params of gpio.write is missing required key `value`",
                ),
                (8, 16, Some("x"), "`after` names `ghost`"),
                (11, 13, Some("y"), "`after` forms a cycle: y -> x -> y"),
                (12, 21, Some("y"), "retry.factor must be at least 1.0"),
                (
                    13,
                    10,
                    None,
                    "duplicate instruction id `y` (first at line 9)",
                ),
            ],
        },
    ]
}

#[test]
fn every_bad_pack_is_refused_with_its_position_and_message() {
    let cases = cases();
    assert!(cases.len() >= 40, "the table must hold at least 40 cases");
    let mut failures = Vec::new();
    for case in &cases {
        let errs = match parse_pack(case.yaml) {
            Ok(_) => {
                failures.push(format!("{}: accepted", case.name));
                continue;
            }
            Err(e) => e.0,
        };
        if errs.len() != case.expect.len() {
            failures.push(format!(
                "{}: expected {} error(s), got {}:\n  {}",
                case.name,
                case.expect.len(),
                errs.len(),
                errs.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n  ")
            ));
            continue;
        }
        for (e, (line, col, ins, msg)) in errs.iter().zip(case.expect) {
            let ok = e.pos.line == *line
                && e.pos.col == *col
                && e.instruction.as_deref() == *ins
                && e.message.contains(msg);
            if !ok {
                failures.push(format!(
                    "{}: expected {line}:{col} {ins:?} \"{msg}\", got {}:{} {:?} \"{}\"",
                    case.name, e.pos.line, e.pos.col, e.instruction, e.message
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn limits_are_enforced_with_clear_errors() {
    let big = format!(
        "{HEAD}  - {{id: a, action: noop, every: 1s}}\n# {}\n",
        "x".repeat(1 << 20)
    );
    let e = parse_pack(&big).expect_err("too big");
    assert!(e.0[0].message.contains("pack is too large"), "{e}");

    let mut many = String::from(HEAD);
    for i in 0..10_001 {
        many.push_str(&format!("  - {{id: i{i}, action: noop, every: 1s}}\n"));
    }
    let e = parse_pack(&many).expect_err("too many");
    assert!(
        e.0[0].message.contains("too many instructions: 10001"),
        "{e}"
    );
    assert_eq!((e.0[0].pos.line, e.0[0].pos.col), (4, 3));
}
