//! The pickle virtual machine: one opcode at a time onto a stack of arena
//! indices, with the memo and the marks (CPython's `Lib/pickletools.py`
//! documents each opcode).

use super::{Id, Node, Pickle, PickleError, PlainConstructor};
use std::collections::HashMap;

/// The pickle virtual machine's state.
pub(super) struct Machine<'b> {
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
    pub(super) fn new(input: &'b [u8]) -> Self {
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

    pub(super) fn run(mut self) -> Result<Pickle, PickleError> {
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
