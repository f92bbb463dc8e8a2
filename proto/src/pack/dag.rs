//! The `after` graph: unknown targets and cycles are errors, and the
//! scheduler gets each instruction's dependents.

use std::collections::{HashMap, HashSet};

use super::error::PackError;
use super::model::{Instruction, Schedule};
use crate::yaml::Pos;

/// Upstream ids of an instruction (empty unless it runs `after` others).
pub fn upstream(ins: &Instruction) -> &[String] {
    match &ins.schedule {
        Schedule::After { upstream, .. } => upstream,
        _ => &[],
    }
}

/// For each instruction index, the indices of the instructions that run
/// `after` it, in pack order.
pub fn dependents(instructions: &[Instruction]) -> Vec<Vec<usize>> {
    let index: HashMap<&str, usize> = instructions
        .iter()
        .enumerate()
        .map(|(i, ins)| (ins.id.as_str(), i))
        .collect();
    let mut out = vec![Vec::new(); instructions.len()];
    for (i, ins) in instructions.iter().enumerate() {
        for up in upstream(ins) {
            if let Some(&u) = index.get(up.as_str()) {
                out[u].push(i);
            }
        }
    }
    out
}

/// Report unknown `after` targets and every cycle (as a path `a -> b -> a`).
///
/// `after_pos[id]` holds the position of each entry of that instruction's
/// `after` list; `all_ids` is every id in the pack, including instructions
/// that failed to decode.
pub(crate) fn check(
    instructions: &[Instruction],
    after_pos: &HashMap<String, Vec<Pos>>,
    all_ids: &HashSet<String>,
    errors: &mut Vec<PackError>,
) {
    let index: HashMap<&str, usize> = instructions
        .iter()
        .enumerate()
        .map(|(i, ins)| (ins.id.as_str(), i))
        .collect();
    let pos_of = |ins: &Instruction, k: usize| {
        after_pos
            .get(&ins.id)
            .and_then(|v| v.get(k).copied())
            .unwrap_or(ins.pos)
    };
    for ins in instructions {
        for (k, up) in upstream(ins).iter().enumerate() {
            if !all_ids.contains(up) {
                errors.push(PackError {
                    pos: pos_of(ins, k),
                    instruction: Some(ins.id.clone()),
                    message: format!(
                        "`after` names `{up}`, which is not an instruction of this pack"
                    ),
                });
            }
        }
    }
    // Iterative DFS with colours; each back edge closes a cycle, reported
    // once at the instruction where the walk entered it.
    #[derive(Clone, Copy, PartialEq)]
    enum Colour {
        White,
        Grey,
        Black,
    }
    let mut colour = vec![Colour::White; instructions.len()];
    let mut reported: HashSet<Vec<usize>> = HashSet::new();
    for start in 0..instructions.len() {
        if colour[start] != Colour::White {
            continue;
        }
        // Stack of (node, next upstream index to visit).
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        colour[start] = Colour::Grey;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            let ups = upstream(&instructions[node]);
            if *next >= ups.len() {
                colour[node] = Colour::Black;
                stack.pop();
                continue;
            }
            let k = *next;
            *next += 1;
            let Some(&up) = index.get(ups[k].as_str()) else {
                continue;
            };
            match colour[up] {
                Colour::White => {
                    colour[up] = Colour::Grey;
                    stack.push((up, 0));
                }
                Colour::Grey => {
                    // The cycle is the stack from `up` to `node`, walking
                    // "depends on" edges; print it in run order instead
                    // (upstream first): reverse.
                    let from = stack.iter().position(|(n, _)| *n == up).unwrap_or(0);
                    let mut cycle: Vec<usize> = stack[from..].iter().map(|(n, _)| *n).collect();
                    cycle.reverse();
                    let mut key = cycle.clone();
                    key.sort_unstable();
                    if reported.insert(key) {
                        let mut path: Vec<&str> =
                            cycle.iter().map(|&i| instructions[i].id.as_str()).collect();
                        path.push(path[0]);
                        let ins = &instructions[node];
                        errors.push(PackError {
                            pos: pos_of(ins, k),
                            instruction: Some(ins.id.clone()),
                            message: format!("`after` forms a cycle: {}", path.join(" -> ")),
                        });
                    }
                }
                Colour::Black => {}
            }
        }
    }
}
