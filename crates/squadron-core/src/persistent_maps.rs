//! The persistent ordered maps and sets of the state's large parts, and how they are decoded
//! from a snapshot.
//!
//! A copy of a [`PMap`] is constant-time: its nodes are shared until one side changes (the
//! changed path is copied then). The parts of the state that grow with tasks and profiles use
//! it, so a snapshot's, a digest's or a scrape's copy of the state — taken under the lock
//! apply waits for — does not clone a million entries (a `BTreeMap` copy held the lock ~0.3 s
//! there). It iterates in key order and serializes as a `BTreeMap` does, so encodings and
//! digests are unchanged. Large values sit behind an `Arc` in it (a change to a shared leaf
//! copies the leaf's sixteen values).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

pub type PMap<K, V> = imbl::OrdMap<K, V>;
/// The set of [`PMap`]'s kind.
pub type PSet<T> = imbl::OrdSet<T>;

/// Decodes a [`PMap`] entry by entry. imbl's own decoder reserves room for the count the
/// input states before reading any entry, so a forged snapshot stating a huge count would
/// abort the node on allocation instead of being refused; this reserves nothing.
pub fn deserialize_map<'de, D, K, V>(d: D) -> Result<PMap<K, V>, D::Error>
where
    D: Deserializer<'de>,
    K: Deserialize<'de> + Ord + Clone,
    V: Deserialize<'de> + Clone,
{
    struct Entries<K, V>(PhantomData<(K, V)>);
    impl<'de, K, V> Visitor<'de> for Entries<K, V>
    where
        K: Deserialize<'de> + Ord + Clone,
        V: Deserialize<'de> + Clone,
    {
        type Value = PMap<K, V>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
            let mut map = PMap::new();
            while let Some((k, v)) = access.next_entry()? {
                map.insert(k, v);
            }
            Ok(map)
        }
    }
    d.deserialize_map(Entries(PhantomData))
}

/// Decodes a [`PSet`] element by element (see [`deserialize_map`]).
pub fn deserialize_set<'de, D, T>(d: D) -> Result<PSet<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Ord + Clone,
{
    struct Elements<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de> + Ord + Clone> Visitor<'de> for Elements<T> {
        type Value = PSet<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a set")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
            let mut set = PSet::new();
            while let Some(v) = access.next_element()? {
                set.insert(v);
            }
            Ok(set)
        }
    }
    d.deserialize_seq(Elements(PhantomData))
}
