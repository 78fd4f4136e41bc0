//! A reader of Python pickles that holds plain data only: what
//! `pickle.dump` writes for dicts, lists, tuples, sets, strings, bytes,
//! numbers, booleans and `None` (protocols 0 to 5), with the memo that
//! shares repeated objects. It imports nothing: an opcode that names a
//! class or calls one (`GLOBAL`, `REDUCE`, `BUILD`, `NEWOBJ`, ...) is an
//! error, except the few constructors of plain data Python itself uses
//! (`collections.OrderedDict`, `builtins.set`, `builtins.frozenset`).
//!
//! The long form: `docs/modules.md`, "`src/trace/pickle/mod.rs`".

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
pub(super) type Id = u32;

/// One value.
#[derive(Debug, Clone)]
pub(super) enum Node {
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
pub(super) enum PlainConstructor {
    OrderedDict,
    Set,
    FrozenSet,
}

impl PlainConstructor {
    pub(super) fn find(module: &str, name: &str) -> Option<Self> {
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
    pub(super) nodes: Vec<Node>,
    pub(super) root: Id,
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

mod machine;

/// Decode `bytes` as a pickle of plain data.
pub(crate) fn parse(bytes: &[u8]) -> Result<Pickle, PickleError> {
    machine::Machine::new(bytes).run()
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
