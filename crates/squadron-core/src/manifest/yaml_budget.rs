//! The alias and nesting budget of a YAML manifest, checked before it is deserialized.
//!
//! The parser (`yaml_serde`, a libyaml port) has limits of its own, 128 levels of nesting and at
//! most 100 alias jumps per event, but neither is cheap enough on hostile input:
//!
//! - It loads the whole document before deserializing, and libyaml's scanner pays for every
//!   token in proportion to the flow nesting (`[[[[…`) around it, so a 200 KB document of
//!   nested brackets takes minutes. Nesting is therefore first measured by `saphyr-parser`, a
//!   streaming YAML 1.2 parser that stops at the first level past the limit, having read a few
//!   hundred bytes.
//! - Its alias limit stops a classic "billion laughs" but not a quadratic one: a long anchored
//!   list aliased many times is walked in full at every alias, all within the jump limit. So we
//!   walk the document once as deserialization will, following aliases with yaml_serde itself,
//!   and stop at the first node past a budget; the walk costs at most the budget.
//!
//! Other errors (syntax, several documents) are left to the typed pass, which reports them
//! against the field as before.

use std::cell::Cell;
use std::fmt;

use saphyr_parser::Event;
use serde::de::VariantAccess as _;
use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, Visitor};

use crate::limits::{MANIFEST_YAML_DEPTH_MAX, MANIFEST_YAML_NODES_MIN};

/// Why a document was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Overrun {
    /// Following aliases, the document has more nodes than this.
    Nodes(usize),
    /// It nests deeper than this.
    Depth(usize),
    /// yaml_serde's own alias or recursion limit stopped it first.
    Parser(&'static str),
    /// saphyr-parser could not read it (a YAML 1.1 form, or a syntax error the typed pass will
    /// report), and it has too many brackets to rule deep flow nesting out without reading it.
    Unmeasured(String),
}

impl fmt::Display for Overrun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Overrun::Nodes(max) => write!(
                f,
                "YAML aliases expand the document past {max} nodes; refused as an alias bomb"
            ),
            Overrun::Depth(max) => write!(f, "nests deeper than {max} levels"),
            Overrun::Parser(what) => {
                write!(f, "YAML aliases or nesting exceed the parser's {what}")
            }
            Overrun::Unmeasured(why) => write!(
                f,
                "its nesting cannot be measured ({why}) and it has more than \
                 {MANIFEST_YAML_DEPTH_MAX} '[' and '{{'"
            ),
        }
    }
}

/// `Err` when `text` nests too deep or expands too far.
pub(super) fn check_yaml_budget(text: &str) -> Result<(), Overrun> {
    check_nesting(text)?;
    check_expansion(text)
}

/// Measures nesting with a streaming parser that stops at the first level too deep.
fn check_nesting(text: &str) -> Result<(), Overrun> {
    let mut depth = 0usize;
    for next in saphyr_parser::Parser::new_from_str(text) {
        match next {
            Ok((Event::SequenceStart(..) | Event::MappingStart(..), _)) => {
                depth += 1;
                if depth > MANIFEST_YAML_DEPTH_MAX {
                    return Err(Overrun::Depth(MANIFEST_YAML_DEPTH_MAX));
                }
            }
            Ok((Event::SequenceEnd | Event::MappingEnd, _)) => depth = depth.saturating_sub(1),
            Ok(_) => {}
            // Its own flow limit (255 levels), met while reading ahead.
            Err(e) if e.info() == "recursion limit exceeded" => {
                return Err(Overrun::Depth(MANIFEST_YAML_DEPTH_MAX))
            }
            // Every flow level opens with one of these, so few of them bound the nesting.
            Err(e) => {
                let openers = text.bytes().filter(|b| matches!(b, b'[' | b'{')).count();
                if openers > MANIFEST_YAML_DEPTH_MAX {
                    return Err(Overrun::Unmeasured(e.to_string()));
                }
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Walks `text` with aliases followed, as deserialization will, within the node budget.
fn check_expansion(text: &str) -> Result<(), Overrun> {
    let budget = Budget {
        nodes_left: Cell::new(MANIFEST_YAML_NODES_MIN.max(text.len())),
        nodes_max: MANIFEST_YAML_NODES_MIN.max(text.len()),
        overrun: Cell::new(None),
    };
    let walked = Walk {
        budget: &budget,
        depth: 0,
    }
    .deserialize(yaml_serde::Deserializer::from_str(text));
    if let Some(overrun) = budget.overrun.take() {
        return Err(overrun);
    }
    match walked {
        Err(e) => match parser_limit(&e.to_string()) {
            Some(what) => Err(Overrun::Parser(what)),
            None => Ok(()),
        },
        Ok(()) => Ok(()),
    }
}

/// The parser's own limits, by the messages it reports them with.
fn parser_limit(message: &str) -> Option<&'static str> {
    [
        ("repetition limit exceeded", "alias repetition limit"),
        ("recursion limit exceeded", "recursion limit"),
    ]
    .into_iter()
    .find(|(said, _)| message.starts_with(said))
    .map(|(_, what)| what)
}

struct Budget {
    nodes_left: Cell<usize>,
    nodes_max: usize,
    overrun: Cell<Option<Overrun>>,
}

/// A visitor that accepts any node and counts it against the budget.
#[derive(Clone, Copy)]
struct Walk<'a> {
    budget: &'a Budget,
    depth: usize,
}

impl Walk<'_> {
    fn node<E: de::Error>(self) -> Result<(), E> {
        match self.budget.nodes_left.get().checked_sub(1) {
            Some(left) => {
                self.budget.nodes_left.set(left);
                Ok(())
            }
            None => self.refuse(Overrun::Nodes(self.budget.nodes_max)),
        }
    }

    /// The walk one level down, counting this node.
    fn child<E: de::Error>(self) -> Result<Self, E> {
        self.node()?;
        if self.depth >= MANIFEST_YAML_DEPTH_MAX {
            return self.refuse(Overrun::Depth(MANIFEST_YAML_DEPTH_MAX));
        }
        Ok(Walk {
            depth: self.depth + 1,
            ..self
        })
    }

    fn refuse<T, E: de::Error>(self, overrun: Overrun) -> Result<T, E> {
        let err = E::custom(&overrun);
        self.budget.overrun.set(Some(overrun));
        Err(err)
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.node()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.node()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.node()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.node()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.node()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.node()
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.node()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self.child()?)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self.child()?)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let child = self.child()?;
        while seq.next_element_seed(child)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let child = self.child()?;
        while map.next_key_seed(child)?.is_some() {
            map.next_value_seed(child)?;
        }
        Ok(())
    }

    /// A tagged node (`!name value`).
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        let child = self.child()?;
        let ((), variant) = data.variant_seed(child)?;
        variant.newtype_variant_seed(child)
    }
}
