//! The fuzz targets' checks (`fuzz/checks/`), run by every test run: on
//! each committed seed (`fuzz/seeds/<target>/`) and on mutations of the
//! seeds that proptest draws (bytes flipped, inserted, removed; a cut; two
//! seeds spliced). libFuzzer explores far more (`scripts/fuzz-smoke.sh`);
//! this keeps the checks compiling with the workspace and turns every seed
//! (and every finding saved as one) into a regression test.
//!
//! Each parser is one of outside input, so each check proves that its
//! rule's input never panics and keeps the invariants the check names.

#[path = "../../../fuzz/checks/mod.rs"]
mod checks;

use std::path::{Path, PathBuf};

use proptest::prelude::*;

/// The seeds of `target`, sorted by name; at least one.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    paths.sort();
    let seeds: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    assert!(!seeds.is_empty(), "{} holds no seed", dir.display());
    seeds
}

/// One change to an input.
#[derive(Debug, Clone)]
enum Edit {
    /// The byte at this position (modulo the length) set.
    Set(usize, u8),
    /// A byte inserted here.
    Insert(usize, u8),
    /// The byte here removed.
    Remove(usize),
    /// Everything from here on cut.
    Cut(usize),
    /// This much of another seed appended.
    Splice(usize, usize),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        3 => any::<usize>().prop_map(Edit::Remove),
        1 => any::<usize>().prop_map(Edit::Cut),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(s, n)| Edit::Splice(s, n)),
    ];
    proptest::collection::vec(edit, 0..6)
}

/// `seeds[pick]` with `edits` applied.
fn mutated(seeds: &[Vec<u8>], pick: usize, edits: &[Edit]) -> Vec<u8> {
    let mut data = seeds[pick % seeds.len()].clone();
    for edit in edits {
        let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
        match *edit {
            Edit::Set(i, b) => {
                if !data.is_empty() {
                    let i = at(i, data.len());
                    data[i] = b;
                }
            }
            Edit::Insert(i, b) => data.insert(at(i, data.len() + 1), b),
            Edit::Remove(i) => {
                if !data.is_empty() {
                    data.remove(at(i, data.len()));
                }
            }
            Edit::Cut(i) => data.truncate(at(i, data.len() + 1)),
            Edit::Splice(s, n) => {
                let other = &seeds[s % seeds.len()];
                data.extend_from_slice(&other[..at(n, other.len() + 1)]);
            }
        }
    }
    data
}

/// A test per check: every seed as it is, then mutated ones.
macro_rules! replay {
    ($($target:ident: $rule:literal),* $(,)?) => {$(
        #[doc = concat!("proves: ", $rule, " (this parser of outside input keeps its check's invariants)")]
        mod $target {
            use super::*;

            // proves: the rule above, on every committed seed
            #[test]
            fn seeds_pass() {
                for seed in seeds(stringify!($target)) {
                    checks::$target::check(&seed);
                }
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(256))]

                // proves: the rule above, on mutated seeds
                #[test]
                fn mutations_pass(pick in any::<usize>(), edits in edits()) {
                    let seeds = seeds(stringify!($target));
                    checks::$target::check(&mutated(&seeds, pick, &edits));
                }
            }
        }
    )*};
}

replay! {
    batch_input: "BATCH-1",
    batch_output: "BATCH-3",
    chat_request: "GW-1, GW-5, Q-7",
    gateway_config: "GW-9, CFG-3",
    gateway_headers: "GW-2, GW-3",
    messages_request: "WIRE-3",
    rate_limit_headers: "RT-3",
    responses_request: "WIRE-1",
    sse_decoder: "GW-7",
    stream_dialects: "LC-3, WIRE-1, WIRE-3",
}
