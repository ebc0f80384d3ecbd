//! Between byte positions and setting paths, using the spans the `toml`
//! parser records: a serde error's span names its setting, and a rule broken
//! at a setting gets the line and column where that setting is written.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::error::{FieldPath, Segment};

/// The smallest key or value covering `offset` so far, with its path.
type Best = Option<(usize, FieldPath)>;

/// The path of the deepest key or value whose text covers byte `offset`.
pub(super) fn path_at(root: &DeTable<'_>, offset: usize) -> Option<FieldPath> {
    let mut best = None;
    walk_table(root, &FieldPath::default(), offset, &mut best);
    best.map(|(_, path)| path)
        .filter(|path| !path.segments().is_empty())
}

fn consider(span: Range<usize>, path: &FieldPath, offset: usize, best: &mut Best) {
    let covers = span.contains(&offset) || (span.is_empty() && span.start == offset);
    if !covers {
        return;
    }
    let len = span.len();
    let better = best.as_ref().is_none_or(|(best_len, best_path)| {
        len < *best_len || (len == *best_len && path.segments().len() > best_path.segments().len())
    });
    if better {
        *best = Some((len, path.clone()));
    }
}

fn walk_table(table: &DeTable<'_>, at: &FieldPath, offset: usize, best: &mut Best) {
    for (key, value) in table.iter() {
        let path = at.key(key.get_ref());
        consider(key.span(), &path, offset, best);
        walk_value(value, &path, offset, best);
    }
}

fn walk_value(value: &Spanned<DeValue<'_>>, at: &FieldPath, offset: usize, best: &mut Best) {
    consider(value.span(), at, offset, best);
    match value.get_ref() {
        DeValue::Table(table) => walk_table(table, at, offset, best),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk_value(item, &at.index(i), offset, best);
            }
        }
        _ => {}
    }
}

fn entry<'t, 'i>(table: &'t DeTable<'i>, key: &str) -> Option<&'t Spanned<DeValue<'i>>> {
    table
        .iter()
        .find(|(k, _)| k.get_ref().as_ref() == key)
        .map(|(_, v)| v)
}

/// Where the value at `path` is written, if it is written at all.
pub(super) fn span_of(root: &DeTable<'_>, path: &FieldPath) -> Option<Range<usize>> {
    let (first, rest) = path.segments().split_first()?;
    let Segment::Key(first) = first else {
        return None;
    };
    let mut value = entry(root, first)?;
    for segment in rest {
        value = match (segment, value.get_ref()) {
            (Segment::Key(key), DeValue::Table(table)) => entry(table, key)?,
            (Segment::Index(i), DeValue::Array(items)) => items.get(*i)?,
            _ => return None,
        };
    }
    Some(value.span())
}
