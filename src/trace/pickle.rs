//! A reader of Python pickles that holds plain data only: what
//! `pickle.dump` writes for dicts, lists, tuples, sets, strings, bytes,
//! numbers, booleans and `None` (protocols 0 to 5), with the memo that
//! shares repeated objects. It imports nothing: an opcode that names a
//! class or calls one (`GLOBAL`, `REDUCE`, `BUILD`, `NEWOBJ`, ...) is an
//! error, except the few constructors of plain data Python itself uses
//! (`collections.OrderedDict`, `builtins.set`, `builtins.frozenset`).
//!
//! Values live in one arena and refer to each other by index, so a value
//! shared through the memo is stored once, a structure that contains itself
//! is no problem, and nothing here recurses: nesting depth costs no stack,
//! and dropping the arena is one flat free. Every opcode adds at most one
//! value and lengths are checked against the input before anything is
//! allocated, so memory stays proportional to the input's size.
//!
//! The opcodes are those of CPython's `Lib/pickletools.py`.

use std::collections::HashMap;

/// Why a pickle could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PickleError {
    /// Byte offset of the opcode at fault.
    pub(crate) offset: usize,
    /// What is wrong.
    pub(crate) message: String,
}

impl std::fmt::Display for PickleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at byte {}: {}", self.offset, self.message)
    }
}

/// Index of a value in the arena.
type Id = u32;

/// One value.
#[derive(Debug, Clone)]
enum Node {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(Box<str>),
    Bytes(Box<[u8]>),
    List(Vec<Id>),
    Tuple(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    Set(Vec<Id>),
    /// A constructor of plain data, waiting for its `REDUCE`.
    Global(PlainConstructor),
}

/// The classes a plain-data pickle may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PlainConstructor {
    OrderedDict,
    Set,
    FrozenSet,
}

impl PlainConstructor {
    fn find(module: &str, name: &str) -> Option<Self> {
        match (module, name) {
            ("collections", "OrderedDict") => Some(Self::OrderedDict),
            ("builtins" | "__builtin__", "set") => Some(Self::Set),
            ("builtins" | "__builtin__", "frozenset") => Some(Self::FrozenSet),
            _ => None,
        }
    }
}

/// A decoded pickle.
#[derive(Debug)]
pub(crate) struct Pickle {
    nodes: Vec<Node>,
    root: Id,
}

/// A value of a decoded pickle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Value<'a> {
    pickle: &'a Pickle,
    id: Id,
}

impl Pickle {
    /// The object the pickle holds.
    pub(crate) fn root(&self) -> Value<'_> {
        Value {
            pickle: self,
            id: self.root,
        }
    }
}

impl<'a> Value<'a> {
    fn node(self) -> &'a Node {
        &self.pickle.nodes[self.id as usize]
    }

    fn at(self, id: Id) -> Value<'a> {
        Value {
            pickle: self.pickle,
            id,
        }
    }

    /// The entry of a dict under the string key `key`.
    pub(crate) fn get(self, key: &str) -> Option<Value<'a>> {
        let Node::Dict(entries) = self.node() else {
            return None;
        };
        entries
            .iter()
            .find(|(k, _)| self.at(*k).as_str() == Some(key))
            .map(|(_, v)| self.at(*v))
    }

    /// A dict's entries, in order.
    pub(crate) fn entries(self) -> Option<impl Iterator<Item = (Value<'a>, Value<'a>)> + 'a> {
        let Node::Dict(entries) = self.node() else {
            return None;
        };
        let (pickle, entries) = (self.pickle, entries.as_slice());
        Some(
            entries
                .iter()
                .map(move |(k, v)| (Value { pickle, id: *k }, Value { pickle, id: *v })),
        )
    }

    /// A list's, tuple's or set's items.
    pub(crate) fn items(self) -> Option<impl ExactSizeIterator<Item = Value<'a>> + 'a> {
        let items = match self.node() {
            Node::List(items) | Node::Tuple(items) | Node::Set(items) => items.as_slice(),
            _ => return None,
        };
        let pickle = self.pickle;
        Some(items.iter().map(move |id| Value { pickle, id: *id }))
    }

    /// Whether it is a dict.
    pub(crate) fn is_dict(self) -> bool {
        matches!(self.node(), Node::Dict(_))
    }

    /// A string's text.
    pub(crate) fn as_str(self) -> Option<&'a str> {
        match self.node() {
            Node::Str(text) => Some(text),
            _ => None,
        }
    }

    /// A non-negative integer (or a whole, non-negative float) that fits.
    pub(crate) fn as_u64(self) -> Option<u64> {
        match *self.node() {
            Node::Int(v) => u64::try_from(v).ok(),
            Node::Bool(v) => Some(u64::from(v)),
            Node::Float(v) if v >= 0.0 && v.fract() == 0.0 && v < u64::MAX as f64 => Some(v as u64),
            _ => None,
        }
    }

    /// An integer that fits in `i64`.
    #[cfg(test)]
    pub(crate) fn as_i64(self) -> Option<i64> {
        match *self.node() {
            Node::Int(v) => i64::try_from(v).ok(),
            Node::Bool(v) => Some(i64::from(v)),
            _ => None,
        }
    }

    /// Plain text for a scalar (settings are shown as they are).
    pub(crate) fn display(self) -> String {
        match self.node() {
            Node::None => "None".into(),
            Node::Bool(v) => if *v { "True" } else { "False" }.into(),
            Node::Int(v) => v.to_string(),
            Node::Float(v) => v.to_string(),
            Node::Str(v) => v.to_string(),
            Node::Bytes(v) => format!("<{} bytes>", v.len()),
            Node::List(v) | Node::Tuple(v) | Node::Set(v) => format!("<{} items>", v.len()),
            Node::Dict(v) => format!("<{} entries>", v.len()),
            Node::Global(_) => "<constructor>".into(),
        }
    }
}

/// Decode `bytes` as a pickle of plain data.
pub(crate) fn parse(bytes: &[u8]) -> Result<Pickle, PickleError> {
    Machine::new(bytes).run()
}

/// The pickle virtual machine's state.
struct Machine<'b> {
    input: &'b [u8],
    pos: usize,
    /// Where the current opcode starts (for errors).
    at: usize,
    nodes: Vec<Node>,
    stack: Vec<Id>,
    /// Stack lengths at each open `MARK`.
    marks: Vec<usize>,
    memo: HashMap<u64, Id>,
}

impl<'b> Machine<'b> {
    fn new(input: &'b [u8]) -> Self {
        Self {
            input,
            pos: 0,
            at: 0,
            nodes: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
        }
    }

    fn fail<T>(&self, message: impl Into<String>) -> Result<T, PickleError> {
        Err(PickleError {
            offset: self.at,
            message: message.into(),
        })
    }

    fn take(&mut self, n: u64) -> Result<&'b [u8], PickleError> {
        let left = self.input.len().saturating_sub(self.pos) as u64;
        if n > left {
            return self.fail(format!(
                "needs {n} bytes, {left} left: the pickle is cut short"
            ));
        }
        let start = self.pos;
        // `n` is at most what is left, so the end lies inside the input.
        self.pos = start.saturating_add(n as usize);
        Ok(&self.input[start..self.pos])
    }

    fn byte(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: u64) -> Result<u64, PickleError> {
        let bytes = self.take(n)?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn line(&mut self) -> Result<&'b str, PickleError> {
        let rest = &self.input[self.pos..];
        let Some(end) = rest.iter().position(|b| *b == b'\n') else {
            return self.fail("a text argument has no end of line");
        };
        self.pos = self.pos.saturating_add(end).saturating_add(1);
        std::str::from_utf8(&rest[..end]).or_else(|_| self.fail("a text argument is not UTF-8"))
    }

    fn push(&mut self, node: Node) {
        self.nodes.push(node);
        self.stack.push(self.nodes.len().saturating_sub(1) as Id);
    }

    fn pop(&mut self) -> Result<Id, PickleError> {
        if self.marks.last() == Some(&self.stack.len()) {
            return self.fail("an opcode takes a value across a MARK");
        }
        match self.stack.pop() {
            Some(id) => Ok(id),
            None => self.fail("an opcode takes a value from an empty stack"),
        }
    }

    fn top(&self) -> Result<Id, PickleError> {
        match self.stack.last() {
            Some(id) => Ok(*id),
            None => self.fail("an opcode needs a value on an empty stack"),
        }
    }

    /// Everything pushed since the last `MARK`, which is closed.
    fn pop_mark(&mut self) -> Result<Vec<Id>, PickleError> {
        let Some(mark) = self.marks.pop() else {
            return self.fail("no MARK to close");
        };
        Ok(self.stack.split_off(mark))
    }

    fn memo_put(&mut self, key: u64) -> Result<(), PickleError> {
        let top = self.top()?;
        self.memo.insert(key, top);
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Result<(), PickleError> {
        match self.memo.get(&key) {
            Some(id) => {
                self.stack.push(*id);
                Ok(())
            }
            None => self.fail(format!("memo entry {key} was never stored")),
        }
    }

    fn text_key(&self, line: &str) -> Result<u64, PickleError> {
        line.trim()
            .parse()
            .or_else(|_| self.fail(format!("bad memo key {line:?}")))
    }

    /// Append `items` to the list (or set) `target`.
    fn extend(&mut self, target: Id, items: Vec<Id>) -> Result<(), PickleError> {
        match &mut self.nodes[target as usize] {
            Node::List(list) | Node::Set(list) => {
                list.extend(items);
                Ok(())
            }
            _ => self.fail("APPEND or ADDITEMS on something that is not a list or set"),
        }
    }

    /// Set `pairs` (key, value, key, value, ...) in the dict `target`.
    fn set_items(&mut self, target: Id, pairs: Vec<Id>) -> Result<(), PickleError> {
        if pairs.len() % 2 != 0 {
            return self.fail("SETITEMS with a key and no value");
        }
        let Node::Dict(_) = &self.nodes[target as usize] else {
            return self.fail("SETITEM on something that is not a dict");
        };
        for pair in pairs.chunks_exact(2) {
            let (key, value) = (pair[0], pair[1]);
            let existing = self.find_key(target, key);
            let Node::Dict(entries) = &mut self.nodes[target as usize] else {
                unreachable!("checked above");
            };
            match existing {
                Some(index) => entries[index].1 = value,
                None => entries.push((key, value)),
            }
        }
        Ok(())
    }

    /// Where a dict already holds `key` (string and integer keys compare
    /// by value, as Python's do; others by identity).
    fn find_key(&self, dict: Id, key: Id) -> Option<usize> {
        let Node::Dict(entries) = &self.nodes[dict as usize] else {
            return None;
        };
        let same = |a: Id, b: Id| {
            a == b
                || match (&self.nodes[a as usize], &self.nodes[b as usize]) {
                    (Node::Str(x), Node::Str(y)) => x == y,
                    (Node::Int(x), Node::Int(y)) => x == y,
                    _ => false,
                }
        };
        entries.iter().position(|(k, _)| same(*k, key))
    }

    fn int(&mut self, bytes: &[u8]) -> Result<Node, PickleError> {
        if bytes.len() > 16 {
            return self.fail(format!("an integer of {} bytes", bytes.len()));
        }
        if bytes.is_empty() {
            return Ok(Node::Int(0));
        }
        let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
        let mut raw = [if negative { 0xFF } else { 0 }; 16];
        raw[..bytes.len()].copy_from_slice(bytes);
        Ok(Node::Int(i128::from_le_bytes(raw)))
    }

    fn text_int(&self, line: &str) -> Result<Node, PickleError> {
        let digits = line.trim().trim_end_matches('L');
        match digits {
            "00" => return Ok(Node::Bool(false)),
            "01" => return Ok(Node::Bool(true)),
            _ => {}
        }
        digits
            .parse()
            .map(Node::Int)
            .or_else(|_| self.fail(format!("bad integer {line:?}")))
    }

    fn string(&self, bytes: &[u8]) -> Result<Node, PickleError> {
        match std::str::from_utf8(bytes) {
            Ok(text) => Ok(Node::Str(text.into())),
            Err(_) => self.fail("a string is not UTF-8"),
        }
    }

    fn refuse_class<T>(&self, what: &str) -> Result<T, PickleError> {
        self.fail(format!(
            "the pickle {what}: only plain data (dicts, lists, strings, numbers) is read, \
             no class is imported"
        ))
    }

    fn reduce(&mut self) -> Result<(), PickleError> {
        let args = self.pop()?;
        let callable = self.pop()?;
        let Node::Global(constructor) = self.nodes[callable as usize] else {
            return self.refuse_class("calls an object (REDUCE)");
        };
        let items = match &self.nodes[args as usize] {
            Node::Tuple(args) if args.is_empty() => Vec::new(),
            Node::Tuple(args) if args.len() == 1 => match &self.nodes[args[0] as usize] {
                Node::List(items) | Node::Tuple(items) | Node::Set(items) => items.clone(),
                _ => return self.fail("a set made from something that is not a sequence"),
            },
            _ => return self.fail("a plain-data constructor with unexpected arguments"),
        };
        match constructor {
            PlainConstructor::OrderedDict if items.is_empty() => self.push(Node::Dict(Vec::new())),
            PlainConstructor::OrderedDict => {
                return self.fail("an OrderedDict built from arguments");
            }
            PlainConstructor::Set | PlainConstructor::FrozenSet => self.push(Node::Set(items)),
        }
        Ok(())
    }

    fn global(&mut self, module: &str, name: &str) -> Result<(), PickleError> {
        match PlainConstructor::find(module, name) {
            Some(constructor) => {
                self.push(Node::Global(constructor));
                Ok(())
            }
            None => self.refuse_class(&format!("names the class {module}.{name}")),
        }
    }

    fn run(mut self) -> Result<Pickle, PickleError> {
        loop {
            self.at = self.pos;
            if self.pos >= self.input.len() {
                return self.fail("the pickle ends without STOP");
            }
            let op = self.byte()?;
            match op {
                0x80 => {
                    let protocol = self.byte()?;
                    if protocol > 5 {
                        return self.fail(format!("pickle protocol {protocol} (at most 5)"));
                    }
                }
                0x95 => {
                    self.take(8)?; // FRAME: a length hint only.
                }
                b'.' => {
                    let root = self.pop()?;
                    return Ok(Pickle {
                        nodes: self.nodes,
                        root,
                    });
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let top = self.top()?;
                    self.stack.push(top);
                }
                b'N' => self.push(Node::None),
                0x88 => self.push(Node::Bool(true)),
                0x89 => self.push(Node::Bool(false)),
                b'I' | b'L' => {
                    let line = self.line()?;
                    let node = self.text_int(line)?;
                    self.push(node);
                }
                b'J' => {
                    let bytes = self.take(4)?;
                    let node = self.int(bytes)?;
                    self.push(node);
                }
                b'K' => {
                    let value = self.byte()?;
                    self.push(Node::Int(i128::from(value)));
                }
                b'M' => {
                    let value = self.le(2)?;
                    self.push(Node::Int(i128::from(value)));
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        u64::from(self.byte()?)
                    } else {
                        self.le(4)?
                    };
                    let bytes = self.take(n)?;
                    let node = self.int(bytes)?;
                    self.push(node);
                }
                b'F' => {
                    let line = self.line()?;
                    let value = line
                        .trim()
                        .parse()
                        .or_else(|_| self.fail(format!("bad float {line:?}")))?;
                    self.push(Node::Float(value));
                }
                b'G' => {
                    let bytes = self.take(8)?;
                    let value = f64::from_be_bytes(bytes.try_into().expect("8 bytes"));
                    self.push(Node::Float(value));
                }
                b'X' | 0x8c | 0x8d | b'T' | b'U' => {
                    let n = match op {
                        0x8c | b'U' => u64::from(self.byte()?),
                        0x8d => self.le(8)?,
                        _ => self.le(4)?,
                    };
                    let bytes = self.take(n)?;
                    let node = self.string(bytes)?;
                    self.push(node);
                }
                b'V' => {
                    // Raw-unicode-escape: plain text unless it escapes.
                    let line = self.line()?;
                    self.push(Node::Str(line.into()));
                }
                b'S' => {
                    let line = self.line()?.trim();
                    let inner = line
                        .strip_prefix('\'')
                        .and_then(|l| l.strip_suffix('\''))
                        .or_else(|| line.strip_prefix('"').and_then(|l| l.strip_suffix('"')))
                        .unwrap_or(line);
                    self.push(Node::Str(inner.into()));
                }
                b'B' | b'C' | 0x8e | 0x96 => {
                    let n = match op {
                        b'C' => u64::from(self.byte()?),
                        b'B' => self.le(4)?,
                        _ => self.le(8)?,
                    };
                    let bytes = self.take(n)?;
                    self.push(Node::Bytes(bytes.into()));
                }
                b']' => self.push(Node::List(Vec::new())),
                b')' => self.push(Node::Tuple(Vec::new())),
                b'}' => self.push(Node::Dict(Vec::new())),
                0x8f => self.push(Node::Set(Vec::new())),
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Node::List(items));
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Node::Tuple(items));
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.push(Node::Set(items));
                }
                0x85..=0x87 => {
                    let n = usize::from(op.saturating_sub(0x84));
                    let floor = self.marks.last().copied().unwrap_or(0);
                    let Some(from) = self.stack.len().checked_sub(n).filter(|f| *f >= floor) else {
                        return self.fail("a TUPLE opcode with too few values");
                    };
                    let items = self.stack.split_off(from);
                    self.push(Node::Tuple(items));
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    self.push(Node::Dict(Vec::new()));
                    let dict = self.top()?;
                    self.set_items(dict, items)?;
                }
                b'a' => {
                    let item = self.pop()?;
                    let list = self.top()?;
                    self.extend(list, vec![item])?;
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark()?;
                    let list = self.top()?;
                    self.extend(list, items)?;
                }
                b's' => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    let dict = self.top()?;
                    self.set_items(dict, vec![key, value])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let dict = self.top()?;
                    self.set_items(dict, items)?;
                }
                b'p' => {
                    let line = self.line()?;
                    let key = self.text_key(line)?;
                    self.memo_put(key)?;
                }
                b'q' => {
                    let key = u64::from(self.byte()?);
                    self.memo_put(key)?;
                }
                b'r' => {
                    let key = self.le(4)?;
                    self.memo_put(key)?;
                }
                0x94 => {
                    let key = self.memo.len() as u64;
                    self.memo_put(key)?;
                }
                b'g' => {
                    let line = self.line()?;
                    let key = self.text_key(line)?;
                    self.memo_get(key)?;
                }
                b'h' => {
                    let key = u64::from(self.byte()?);
                    self.memo_get(key)?;
                }
                b'j' => {
                    let key = self.le(4)?;
                    self.memo_get(key)?;
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.global(module, name)?;
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (Node::Str(module), Node::Str(name)) =
                        (&self.nodes[module as usize], &self.nodes[name as usize])
                    else {
                        return self.fail("STACK_GLOBAL of something that is not two strings");
                    };
                    let (module, name) = (module.clone(), name.clone());
                    self.global(&module, &name)?;
                }
                b'R' => self.reduce()?,
                b'b' => return self.refuse_class("sets an object's state (BUILD)"),
                b'i' | b'o' | 0x81 | 0x92 => return self.refuse_class("builds an object"),
                b'P' | b'Q' => return self.refuse_class("names a persistent object"),
                0x82..=0x84 => return self.refuse_class("names an extension object"),
                0x97 | 0x98 => return self.fail("out-of-band buffers are not read"),
                other => return self.fail(format!("unknown opcode 0x{other:02x}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_shares_one_object() {
        // [x, x] where x = ["a"]: protocol 2, x stored once in the memo.
        let bytes = b"\x80\x02]q\x00(]q\x01X\x01\x00\x00\x00aq\x02ah\x01e.";
        let pickle = parse(bytes).unwrap();
        let items: Vec<_> = pickle.root().items().unwrap().collect();
        assert_eq!(items.len(), 2);
        for item in items {
            let inner: Vec<_> = item.items().unwrap().collect();
            assert_eq!(inner[0].as_str(), Some("a"));
        }
    }

    #[test]
    fn classes_are_refused() {
        let bytes = b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.";
        let err = parse(bytes).unwrap_err();
        assert!(err.message.contains("os.system"), "{err}");
    }

    #[test]
    fn integers_of_every_width() {
        // LONG1 of 8 bytes: 2^63.
        let bytes = b"\x80\x02(K\x05M\x00\x01J\xff\xff\xff\xff\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00t.";
        let pickle = parse(bytes).unwrap();
        let values: Vec<_> = pickle.root().items().unwrap().map(|v| v.as_i64()).collect();
        assert_eq!(values[..3], [Some(5), Some(256), Some(-1)]);
        assert_eq!(
            pickle.root().items().unwrap().nth(3).unwrap().as_u64(),
            Some(1 << 63)
        );
    }

    #[test]
    fn cut_short_is_an_error() {
        assert!(parse(b"\x80\x02X\xff\xff\xff\x7f").is_err());
        assert!(parse(b"\x80\x02]").is_err());
        assert!(parse(b"").is_err());
    }
}
