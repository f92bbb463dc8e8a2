//! Actions (`action` + `params`) and the GPIO line references in them.

use std::collections::BTreeMap;

use super::fields::{Ctx, Fields, suggest};
use super::scalar::{plain_scalar, positive_duration, string, string_list, string_map};
use super::{ACTION_KEYS, ACTIONS};
use crate::pack::model::{Action, Line, LineRef};
use crate::yaml::{Node, Value};

/// Highest line offset accepted (exclusive): no chip has more lines.
const MAX_OFFSET: u32 = 10_000;

/// A line as written in a `line` param: plain digits are an offset, any
/// other non-empty text (a quoted number too) is a line name.
pub(super) fn line_text(text: &str, plain: bool) -> Result<Line, String> {
    if plain && !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<u32>() {
            Ok(o) if o < MAX_OFFSET => Ok(Line::Offset(o)),
            _ => Err(format!(
                "line offset `{text}` is out of range (0..{MAX_OFFSET})"
            )),
        };
    }
    if text.trim().is_empty() {
        return Err(
            "line must be an offset (`12`) or a line name (`RELAY_MAIN`), found an empty string"
                .into(),
        );
    }
    Ok(Line::Name(text.to_string()))
}

/// A `shared_lines` entry written as one scalar: `LINE` (as a `line`
/// param) or `CHIP:LINE`, where a LINE of digits is an offset even when
/// the whole entry is quoted (YAML needs quotes around `gpiochip1:7`).
pub(super) fn line_ref_text(text: &str, plain: bool) -> Result<LineRef, String> {
    match text.split_once(':') {
        Some((chip, line)) => {
            if chip.trim().is_empty() {
                return Err(format!("`{text}`: empty chip before `:`"));
            }
            Ok(LineRef {
                chip: Some(chip.to_string()),
                line: line_text(line, true).map_err(|e| format!("`{text}`: {e}"))?,
            })
        }
        None => Ok(LineRef {
            chip: None,
            line: line_text(text, plain)?,
        }),
    }
}

/// `line` (required) and `chip` (optional) from a params-like mapping.
/// Without `chip`, `line` may also be written `CHIP:LINE`, as in
/// `allowed-lines` and `shared_lines` (`"gpiochip0:17"` is the chip's line
/// 17, never a line named so: the same text must mean the same line
/// everywhere in a config and its packs).
pub(super) fn line_ref(cx: &mut Ctx, f: &Fields<'_>, what: &str) -> Option<LineRef> {
    let line_node = f.required(cx, "line", what)?;
    let chip_node = f.get("chip");
    let r = match &line_node.value {
        Value::Scalar { text, .. } if chip_node.is_some() && text.contains(':') => Err(format!(
            "line `{text}` names a chip and `chip` names one too: write `line: {}` with \
             `chip`, or `line: \"{text}\"` alone",
            text.split_once(':').map_or("", |(_, l)| l)
        )),
        Value::Scalar { text, plain } if !line_node.is_null() && text.contains(':') => {
            line_ref_text(text, *plain)
        }
        Value::Scalar { text, plain } if !line_node.is_null() => {
            line_text(text, *plain).map(|line| LineRef { chip: None, line })
        }
        _ => Err(format!(
            "line must be an offset (`12`), a line name (`RELAY_MAIN`) or `CHIP:LINE` \
             (`\"gpiochip0:12\"`), found {}",
            line_node.kind()
        )),
    };
    let mut r = match r {
        Ok(r) => r,
        Err(e) => {
            cx.err(line_node.pos, e);
            return None;
        }
    };
    if let Some(n) = chip_node {
        r.chip = Some(string(cx, n, "chip")?);
    }
    Some(r)
}

fn level(cx: &mut Ctx, node: &Node) -> Option<u8> {
    match plain_scalar(node) {
        Some("0") => Some(0),
        Some("1") => Some(1),
        _ => {
            let found = super::scalar::found(node);
            cx.err(node.pos, format!("value must be 0 or 1, found {found}"));
            None
        }
    }
}

/// The params an action takes, `None` for an unknown action.
pub(super) fn param_keys(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "gpio.write" => &["line", "value", "chip"],
        "gpio.toggle" | "gpio.read" => &["line", "chip"],
        "gpio.pulse" => &["line", "width", "value", "chip"],
        "exec" => &["program", "args", "env"],
        "noop" => &[],
        _ => return None,
    })
}

/// The params an action cannot do without, for the "needs params" message.
fn required_params(name: &str, keys: &[&'static str]) -> Vec<&'static str> {
    keys.iter()
        .copied()
        .filter(|k| {
            !(matches!(*k, "chip" | "args" | "env") || (name == "gpio.pulse" && *k == "value"))
        })
        .collect()
}

/// Decode `action` + `params` (from an instruction, `on_failure` or a
/// `safe_state` entry). A failure marks the pack's driven lines incomplete.
pub(super) fn action(
    cx: &mut Ctx,
    owner: &Node,
    action: &Node,
    params: Option<&Node>,
) -> Option<Action> {
    let decoded = action_inner(cx, owner, action, params);
    if decoded.is_none() {
        cx.actions_incomplete = true;
    }
    decoded
}

fn action_inner(
    cx: &mut Ctx,
    owner: &Node,
    action: &Node,
    params: Option<&Node>,
) -> Option<Action> {
    let name = string(cx, action, "action")?;
    let Some(keys) = param_keys(&name) else {
        let hint = suggest(&name, ACTIONS)
            .map(|s| format!(" (did you mean `{s}`?)"))
            .unwrap_or_default();
        cx.err(
            action.pos,
            format!(
                "unknown action `{name}`{hint}; known: {}",
                ACTIONS.join(", ")
            ),
        );
        return None;
    };
    if keys.is_empty() {
        if let Some(p) = params.filter(|p| !p.is_null() && p.value != Value::Map(vec![])) {
            cx.err(p.pos, format!("action `{name}` takes no params"));
            return None;
        }
        return Some(Action::Noop);
    }
    let Some(params) = params else {
        cx.err(
            owner.pos,
            format!(
                "action `{name}` needs `params` with {}",
                required_params(&name, keys).join(", ")
            ),
        );
        return None;
    };
    let what = format!("params of {name}");
    let f = Fields::new(cx, params, &what, keys)?;
    let before = cx.errors.len();
    let act = if name == "exec" {
        exec(cx, &f, &what)
    } else {
        gpio(cx, &f, &name, &what)
    };
    act.filter(|_| cx.errors.len() == before)
}

/// The four `gpio.*` actions.
fn gpio(cx: &mut Ctx, f: &Fields<'_>, name: &str, what: &str) -> Option<Action> {
    let line = line_ref(cx, f, what);
    match name {
        "gpio.write" => {
            let value = f.required(cx, "value", what).and_then(|n| level(cx, n));
            Some(Action::GpioWrite {
                line: line?,
                value: value?,
            })
        }
        "gpio.toggle" => Some(Action::GpioToggle { line: line? }),
        "gpio.read" => Some(Action::GpioRead { line: line? }),
        _ => {
            let width = f
                .required(cx, "width", what)
                .and_then(|n| positive_duration(cx, n, "width"));
            let value = match f.get("value") {
                Some(n) => level(cx, n),
                None => Some(1),
            };
            Some(Action::GpioPulse {
                line: line?,
                width: width?,
                value: value?,
            })
        }
    }
}

fn exec(cx: &mut Ctx, f: &Fields<'_>, what: &str) -> Option<Action> {
    let program = f
        .required(cx, "program", what)
        .and_then(|n| string(cx, n, "program").map(|p| (p, n.pos)));
    let args = match f.get("args") {
        Some(n) => string_list(cx, n, "args").map(|v| v.into_iter().map(|(s, _)| s).collect()),
        None => Some(Vec::new()),
    };
    let env = match f.get("env") {
        Some(n) => string_map(cx, n, "env"),
        None => Some(BTreeMap::new()),
    };
    let (program, ppos) = program?;
    if !program.starts_with('/') {
        cx.err(
            ppos,
            format!(
                "program `{program}` must be an absolute path (the agent's allowlist names full paths)"
            ),
        );
        return None;
    }
    Some(Action::Exec {
        program,
        args: args?,
        env: env?,
    })
}

/// An `{action, params}` mapping (`on_failure`, `safe_state` entries).
pub(super) fn action_object(cx: &mut Ctx, node: &Node, what: &str) -> Option<Action> {
    let Some(f) = Fields::new(cx, node, what, ACTION_KEYS) else {
        cx.actions_incomplete = true;
        return None;
    };
    let Some(a) = f.required(cx, "action", what) else {
        cx.actions_incomplete = true;
        return None;
    };
    action(cx, node, a, f.get("params"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_text_follows_the_line_param_rules() {
        assert_eq!(line_text("12", true), Ok(Line::Offset(12)));
        assert_eq!(line_text("12", false), Ok(Line::Name("12".into())));
        assert_eq!(line_text("RELAY", true), Ok(Line::Name("RELAY".into())));
        assert!(line_text("10000", true).is_err());
        assert!(line_text(" ", false).is_err());
    }

    #[test]
    fn chip_colon_line() {
        assert_eq!(
            line_ref_text("gpiochip1:7", false),
            Ok(LineRef {
                chip: Some("gpiochip1".into()),
                line: Line::Offset(7)
            })
        );
        assert_eq!(
            line_ref_text("gpiochip1:RELAY", true),
            Ok(LineRef {
                chip: Some("gpiochip1".into()),
                line: Line::Name("RELAY".into())
            })
        );
        assert_eq!(
            line_ref_text("5", true),
            Ok(LineRef {
                chip: None,
                line: Line::Offset(5)
            })
        );
        assert!(line_ref_text(":5", false).is_err());
        assert!(line_ref_text("gpiochip0:", false).is_err());
    }

    #[test]
    fn a_line_param_may_name_its_chip_as_allowed_lines_do() {
        let pack = |params: &str| {
            format!(
                "pack: p\nversion: 1\ninstructions:\n  - {{id: a, action: gpio.write, params: {params}, every: 1s}}\n"
            )
        };
        let p = crate::pack::parse_pack(&pack("{line: \"gpiochip0:17\", value: 1}"))
            .expect("CHIP:LINE is a line reference");
        assert_eq!(
            p.instructions[0].action,
            Action::GpioWrite {
                line: LineRef {
                    chip: Some("gpiochip0".into()),
                    line: Line::Offset(17)
                },
                value: 1
            }
        );
        let e =
            crate::pack::parse_pack(&pack("{line: \"gpiochip0:17\", chip: gpiochip1, value: 1}"))
                .expect_err("two chips");
        let msg = e.to_string();
        assert!(
            msg.contains("names a chip and `chip` names one too"),
            "{msg}"
        );
        assert!(msg.contains("line: 17"), "{msg}");
        let e = crate::pack::parse_pack(&pack("{line: \"gpiochip0:\", value: 1}"))
            .expect_err("no line after the colon");
        assert!(e.to_string().contains("gpiochip0:"), "{e}");
    }

    #[test]
    fn required_params_leave_out_the_optional_ones() {
        let keys = param_keys("gpio.pulse").expect("known");
        assert_eq!(required_params("gpio.pulse", keys), ["line", "width"]);
        assert_eq!(param_keys("gpio.wrte"), None);
    }
}
