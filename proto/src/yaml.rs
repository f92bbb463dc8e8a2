//! A position-carrying YAML tree, built from `saphyr-parser` events.
//!
//! Why not `serde` + a YAML deserializer: serde stops at the first error and
//! forgets positions once a value is decoded, but an operator fixing a pack
//! wants *every* error, each with its line and column, including semantic
//! ones found long after parsing (an unknown `after` target, a cycle). So we
//! keep the tree with positions and decode it by hand (see `pack::decode`).
//!
//! Why `saphyr-parser`: it is the maintained successor of `yaml-rust`
//! (`serde_yaml` is deprecated and its forks are thinly maintained), it is
//! pure Rust, and its event API lets us enforce limits *while* parsing: a
//! nesting bomb or an alias bomb (billion laughs) is refused after a bounded
//! amount of work, never by running out of memory.

use std::collections::HashMap;
use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

/// A 1-based line and column in the source text, as editors show them.
/// `u32`, not `usize`: every parsed instruction keeps two (for messages),
/// and a pack is at most a few MiB, so this halves them for nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    /// 1-based line.
    pub line: u32,
    /// 1-based column (in characters).
    pub col: u32,
}

impl Pos {
    /// From 1-based counts as the parsers give them (`usize`), saturating
    /// (a pack is far smaller than `u32::MAX` lines or columns).
    pub fn new(line: usize, col: usize) -> Self {
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Pos {
            line: clamp(line),
            col: clamp(col),
        }
    }

    fn from_span(span: &Span) -> Self {
        Pos::new(span.start.line(), span.start.col().saturating_add(1))
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// Bounds that keep parsing cheap whatever the input.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Deepest nesting of sequences and mappings.
    pub max_depth: usize,
    /// Nodes in the tree after alias expansion (alias bombs hit this).
    pub max_nodes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // A real pack nests about 5 deep; 10 000 instructions of ~15 nodes
        // each is 150 000 nodes, so 400 000 leaves room for long params.
        Limits {
            max_depth: 32,
            max_nodes: 400_000,
        }
    }
}

/// One node of the tree.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Where the node starts.
    pub pos: Pos,
    /// What it holds.
    pub value: Value,
}

/// The content of a node. Scalars keep their text and whether they were
/// quoted: `line: 12` is an offset, `line: "12"` is a line *name*.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A scalar and whether it was written plain (unquoted, not a block).
    Scalar { text: String, plain: bool },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in source order, keys unique.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// Short name of the node's kind, for "expected X, found Y" messages.
    pub fn kind(&self) -> &'static str {
        match &self.value {
            Value::Scalar { plain: true, text } if is_null(text) => "null",
            Value::Scalar { .. } => "a scalar",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    /// The scalar text, if this is a scalar.
    pub fn as_scalar(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// True for a plain `~`, `null`, `Null`, `NULL` or an empty plain scalar.
    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, plain: true } if is_null(text))
    }
}

fn is_null(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

/// Why a text is not a usable YAML document.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{pos}: {message}")]
pub struct YamlError {
    /// Where the problem is.
    pub pos: Pos,
    /// What is wrong.
    pub message: String,
}

/// Parse exactly one YAML document into a tree, enforcing `limits`.
pub fn parse(text: &str, limits: Limits) -> Result<Node, YamlError> {
    Builder {
        parser: Parser::new_from_str(text),
        anchors: HashMap::new(),
        nodes: 0,
        limits,
    }
    .document()
}

struct Builder<'a> {
    parser: Parser<'a, saphyr_parser::StrInput<'a>>,
    anchors: HashMap<usize, Node>,
    nodes: usize,
    limits: Limits,
}

/// A partially built collection on the explicit stack (no recursion, so a
/// nesting bomb cannot overflow the thread's stack).
enum Frame {
    Seq {
        pos: Pos,
        anchor: usize,
        items: Vec<Node>,
    },
    Map {
        pos: Pos,
        anchor: usize,
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
    },
}

impl Frame {
    fn seq(pos: Pos, anchor: usize) -> Frame {
        Frame::Seq {
            pos,
            anchor,
            items: Vec::new(),
        }
    }

    fn map(pos: Pos, anchor: usize) -> Frame {
        Frame::Map {
            pos,
            anchor,
            entries: Vec::new(),
            key: None,
        }
    }

    /// Adds a finished node: an item of a sequence, or a mapping's key
    /// (which must be a scalar) or the value of the key before it (refused
    /// if that key was seen already).
    fn add(&mut self, done: Node) -> Result<(), YamlError> {
        match self {
            Frame::Seq { items, .. } => items.push(done),
            Frame::Map { entries, key, .. } => match key.take() {
                None => {
                    if !matches!(done.value, Value::Scalar { .. }) {
                        return Err(YamlError {
                            pos: done.pos,
                            message: format!("mapping keys must be scalars, found {}", done.kind()),
                        });
                    }
                    *key = Some(done);
                }
                Some(k) => {
                    if let Some((first, _)) =
                        entries.iter().find(|(e, _)| e.as_scalar() == k.as_scalar())
                    {
                        return Err(YamlError {
                            pos: k.pos,
                            message: format!(
                                "duplicate key `{}` (first at line {})",
                                k.as_scalar().unwrap_or_default(),
                                first.pos.line
                            ),
                        });
                    }
                    entries.push((k, done));
                }
            },
        }
        Ok(())
    }
}

impl<'a> Builder<'a> {
    fn next(&mut self) -> Result<(Event<'a>, Span), YamlError> {
        match self.parser.next_event() {
            Some(Ok(ev)) => Ok(ev),
            Some(Err(e)) => Err(YamlError {
                pos: Pos::new(e.marker().line(), e.marker().col().saturating_add(1)),
                message: format!("invalid YAML: {}", e.info()),
            }),
            None => Err(YamlError {
                pos: Pos::default(),
                message: "invalid YAML: unexpected end of input".into(),
            }),
        }
    }

    fn document(mut self) -> Result<Node, YamlError> {
        let mut root = None;
        loop {
            let (ev, span) = self.next()?;
            match ev {
                Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
                Event::DocumentStart(_) => {
                    if root.is_some() {
                        return Err(YamlError {
                            pos: Pos::from_span(&span),
                            message:
                                "a pack file holds exactly one YAML document; found a second `---`"
                                    .into(),
                        });
                    }
                    root = Some(self.node()?);
                }
                Event::StreamEnd => break,
                _ => {
                    return Err(YamlError {
                        pos: Pos::from_span(&span),
                        message: "invalid YAML: unexpected content after the document".into(),
                    });
                }
            }
        }
        root.ok_or(YamlError {
            pos: Pos { line: 1, col: 1 },
            message: "the file is empty: expected a pack (a mapping with `pack:`, `version:`, `instructions:`)".into(),
        })
    }

    fn count(&mut self, n: usize, pos: Pos) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > self.limits.max_nodes {
            return Err(YamlError {
                pos,
                message: format!(
                    "document too large: more than {} nodes after expanding aliases (alias bomb?)",
                    self.limits.max_nodes
                ),
            });
        }
        Ok(())
    }

    /// Read one complete node (scalar, alias or collection).
    fn node(&mut self) -> Result<Node, YamlError> {
        let mut stack: Vec<Frame> = Vec::new();
        loop {
            let (ev, span) = self.next()?;
            let pos = Pos::from_span(&span);
            let done: Node = match ev {
                Event::Scalar(text, style, anchor, _tag) => {
                    self.count(1, pos)?;
                    let node = Node {
                        pos,
                        value: Value::Scalar {
                            text: text.into_owned(),
                            plain: style == ScalarStyle::Plain,
                        },
                    };
                    self.remember(anchor, &node);
                    node
                }
                Event::Alias(id) => self.alias(id, pos)?,
                Event::SequenceStart(anchor, _) => {
                    self.open(&mut stack, Frame::seq(pos, anchor), pos)?;
                    continue;
                }
                Event::MappingStart(anchor, _) => {
                    self.open(&mut stack, Frame::map(pos, anchor), pos)?;
                    continue;
                }
                Event::SequenceEnd | Event::MappingEnd => self.close(&mut stack, pos)?,
                Event::StreamStart
                | Event::StreamEnd
                | Event::DocumentStart(_)
                | Event::DocumentEnd
                | Event::Nothing => {
                    return Err(YamlError {
                        pos,
                        message: "invalid YAML: unexpected end of document".into(),
                    });
                }
            };
            match stack.last_mut() {
                None => return Ok(done),
                Some(frame) => frame.add(done)?,
            }
        }
    }

    /// Keeps `node` under `anchor` (0: none) for later aliases.
    fn remember(&mut self, anchor: usize, node: &Node) {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
    }

    /// A copy of the node anchored as `id`, counted whole against the
    /// node limit (so aliases cannot multiply a small text into a huge
    /// tree), placed at `pos`.
    fn alias(&mut self, id: usize, pos: Pos) -> Result<Node, YamlError> {
        let Some(target) = self.anchors.get(&id) else {
            return Err(YamlError {
                pos,
                message: "alias refers to an unknown anchor".into(),
            });
        };
        let mut node = target.clone();
        let size = tree_size(&node);
        self.count(size, pos)?;
        node.pos = pos;
        Ok(node)
    }

    /// A collection starts at `pos`: counted, and refused past the depth
    /// limit.
    fn open(&mut self, stack: &mut Vec<Frame>, frame: Frame, pos: Pos) -> Result<(), YamlError> {
        self.count(1, pos)?;
        if stack.len() >= self.limits.max_depth {
            return Err(YamlError {
                pos,
                message: format!("nesting deeper than {} levels", self.limits.max_depth),
            });
        }
        stack.push(frame);
        Ok(())
    }

    /// The innermost collection ends (at `pos`): its node.
    fn close(&mut self, stack: &mut Vec<Frame>, pos: Pos) -> Result<Node, YamlError> {
        let (node, anchor) = match stack.pop() {
            Some(Frame::Seq { pos, anchor, items }) => (
                Node {
                    pos,
                    value: Value::Seq(items),
                },
                anchor,
            ),
            Some(Frame::Map {
                pos,
                anchor,
                entries,
                ..
            }) => (
                Node {
                    pos,
                    value: Value::Map(entries),
                },
                anchor,
            ),
            None => {
                return Err(YamlError {
                    pos,
                    message: "invalid YAML: unbalanced collection end".into(),
                });
            }
        };
        self.remember(anchor, &node);
        Ok(node)
    }
}

/// Number of nodes in a tree: what an alias to it costs once expanded.
fn tree_size(node: &Node) -> usize {
    match &node.value {
        Value::Scalar { .. } => 1,
        Value::Seq(items) => 1 + items.iter().map(tree_size).sum::<usize>(),
        Value::Map(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| tree_size(k) + tree_size(v))
                .sum::<usize>()
        }
    }
}

/// The tree as JSON, for decoding small documents (the agent's config) with
/// serde. Plain scalars that read as integers, floats, booleans or null
/// become those; everything else stays a string.
pub fn to_json(node: &Node) -> serde_json::Value {
    use serde_json::Value as J;
    match &node.value {
        Value::Scalar { text, plain: false } => J::String(text.clone()),
        Value::Scalar { text, plain: true } => {
            if is_null(text) {
                J::Null
            } else if let Ok(i) = text.parse::<i64>() {
                J::from(i)
            } else if let Ok(b) = text.parse::<bool>() {
                J::Bool(b)
            } else if let Some(f) = text.parse::<f64>().ok().filter(|f| f.is_finite()) {
                J::from(f)
            } else {
                J::String(text.clone())
            }
        }
        Value::Seq(items) => J::Array(items.iter().map(to_json).collect()),
        Value::Map(entries) => J::Object(
            entries
                .iter()
                .map(|(k, v)| (k.as_scalar().unwrap_or_default().to_string(), to_json(v)))
                .collect(),
        ),
    }
}

/// Position of the first mapping key named `key` anywhere in the tree: to
/// place serde's "unknown field" errors, which carry no position.
pub fn find_key(node: &Node, key: &str) -> Option<Pos> {
    match &node.value {
        Value::Scalar { .. } => None,
        Value::Seq(items) => items.iter().find_map(|n| find_key(n, key)),
        Value::Map(entries) => entries.iter().find_map(|(k, v)| {
            if k.as_scalar() == Some(key) {
                Some(k.pos)
            } else {
                find_key(v, key)
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Node, YamlError> {
        parse(text, Limits::default())
    }

    #[test]
    fn positions_are_one_based() {
        let n = p("a: 1\nb:\n  - x\n").expect("valid");
        let Value::Map(entries) = &n.value else {
            panic!("expected a map, got {n:?}")
        };
        assert_eq!(entries[1].0.pos, Pos { line: 2, col: 1 });
        let Value::Seq(items) = &entries[1].1.value else {
            panic!("expected a seq")
        };
        assert_eq!(items[0].pos, Pos { line: 3, col: 5 });
        assert_eq!(items[0].as_scalar(), Some("x"));
    }

    #[test]
    fn quoting_is_remembered() {
        let n = p("a: 12\nb: \"12\"\n").expect("valid");
        let Value::Map(e) = n.value else { panic!() };
        assert!(matches!(e[0].1.value, Value::Scalar { plain: true, .. }));
        assert!(matches!(e[1].1.value, Value::Scalar { plain: false, .. }));
    }

    #[test]
    fn duplicate_keys_are_refused() {
        let e = p("a: 1\nb: 2\na: 3\n").expect_err("duplicate");
        assert_eq!(e.pos, Pos { line: 3, col: 1 });
        assert!(
            e.message.contains("duplicate key `a` (first at line 1)"),
            "{e}"
        );
    }

    #[test]
    fn aliases_expand() {
        let n = p("a: &x {k: 1}\nb: *x\n").expect("valid");
        let Value::Map(e) = n.value else { panic!() };
        assert_eq!(e[0].1.value, e[1].1.value);
        assert_eq!(e[1].1.pos.line, 2);
    }

    #[test]
    fn alias_bomb_is_refused_quickly() {
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let prev = format!("*a{}", i - 1);
            doc.push_str(&format!("a{i}: &a{i} [{}]\n", vec![prev; 10].join(", ")));
        }
        let e = p(&doc).expect_err("bomb");
        assert!(e.message.contains("alias bomb"), "{e}");
    }

    #[test]
    fn nesting_bomb_is_refused() {
        // Just past our limit: our own message.
        let e = p(&"[".repeat(40)).expect_err("deep");
        assert!(e.message.contains("nesting deeper than 32"), "{e}");
        // Far past it: the parser's own recursion guard answers first,
        // still as an error, never a stack overflow.
        let e = p(&"[".repeat(100_000)).expect_err("deeper");
        assert!(e.message.contains("recursion limit"), "{e}");
    }

    #[test]
    fn syntax_errors_have_positions() {
        let e = p("a: [1, 2\nb: 3\n").expect_err("unclosed");
        assert!(e.message.starts_with("invalid YAML"), "{e}");
        assert!(e.pos.line >= 1);
    }

    #[test]
    fn empty_and_multi_document_files_are_refused() {
        assert!(p("").expect_err("empty").message.contains("empty"));
        assert!(
            p("a: 1\n---\nb: 2\n")
                .expect_err("two")
                .message
                .contains("exactly one")
        );
    }

    #[test]
    fn complex_keys_are_refused() {
        let e = p("? [a, b]\n: 1\n").expect_err("complex key");
        assert!(e.message.contains("mapping keys must be scalars"), "{e}");
    }
}
