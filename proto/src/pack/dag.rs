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

/// An instruction as the `after` graph sees it: built from the tree, so
/// instructions with other errors take part too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GraphNode {
    /// The id as written.
    pub(crate) id: String,
    /// Where the instruction starts.
    pub(crate) pos: Pos,
    /// Each `after` entry with its position.
    pub(crate) upstream: Vec<(String, Pos)>,
}

/// Unknown `after` targets and every cycle (as a path `a -> b -> a`).
///
/// An `after` target counts as known if any instruction carries that id, so
/// one bad instruction does not cascade into "unknown target" errors; with
/// duplicate ids, the first instruction carrying one stands for it.
pub(crate) fn check(nodes: &[GraphNode]) -> Vec<PackError> {
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        index.entry(n.id.as_str()).or_insert(i);
    }
    let mut errors = Vec::new();
    for n in nodes {
        for (up, pos) in &n.upstream {
            if !index.contains_key(up.as_str()) {
                errors.push(PackError {
                    pos: *pos,
                    instruction: Some(n.id.clone()),
                    message: format!(
                        "`after` names `{up}`, which is not an instruction of this pack"
                    ),
                });
            }
        }
    }
    cycles(nodes, &index, &mut errors);
    errors
}

/// Iterative DFS with colours; each back edge closes a cycle, reported once
/// at the instruction where the walk entered it.
fn cycles(nodes: &[GraphNode], index: &HashMap<&str, usize>, errors: &mut Vec<PackError>) {
    #[derive(Clone, Copy, PartialEq)]
    enum Colour {
        White,
        Grey,
        Black,
    }
    let mut colour = vec![Colour::White; nodes.len()];
    let mut reported: HashSet<Vec<usize>> = HashSet::new();
    for start in 0..nodes.len() {
        if colour[start] != Colour::White {
            continue;
        }
        // Stack of (node, next upstream index to visit).
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        colour[start] = Colour::Grey;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            let ups = &nodes[node].upstream;
            if *next >= ups.len() {
                colour[node] = Colour::Black;
                stack.pop();
                continue;
            }
            let k = *next;
            *next += 1;
            let Some(&up) = index.get(ups[k].0.as_str()) else {
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
                            cycle.iter().map(|&i| nodes[i].id.as_str()).collect();
                        path.push(path[0]);
                        errors.push(PackError {
                            pos: ups[k].1,
                            instruction: Some(nodes[node].id.clone()),
                            message: format!("`after` forms a cycle: {}", path.join(" -> ")),
                        });
                    }
                }
                Colour::Black => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, ups: &[&str]) -> GraphNode {
        let pos = Pos { line: 1, col: 1 };
        GraphNode {
            id: id.into(),
            pos,
            upstream: ups.iter().map(|u| (u.to_string(), pos)).collect(),
        }
    }

    #[test]
    fn unknown_targets_and_cycles() {
        let e = check(&[
            node("a", &["c"]),
            node("b", &["a", "zz"]),
            node("c", &["b"]),
        ]);
        let m: Vec<&str> = e.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(m[0].contains("`zz`"));
        assert!(m[1].contains("cycle: b -> c -> a -> b"), "{m:?}");
        assert!(check(&[node("a", &[]), node("b", &["a"])]).is_empty());
    }
}
