//! Batch input JSONL (SPEC BATCH-1): arbitrary bytes are either every item
//! of the file or a list of located problems, never a panic. Items have
//! unique `custom_id`s, increasing lines inside the file, and each re-reads
//! from its own bytes to the request it was validated as (what a worker
//! does when it takes the item). Problems name lines that exist.

use std::collections::HashSet;

use tollgate_batch::input::{parse, request_from_line};
use tollgate_openai::tokens::TokenEstimator;

/// Checks one input; panics on a finding.
pub fn check(data: &[u8]) {
    let lines = data.split(|&b| b == b'\n').count();
    match parse(data, &TokenEstimator::new()) {
        Ok(items) => {
            let mut ids = HashSet::new();
            let mut last = 0;
            for item in &items {
                assert!(ids.insert(item.custom_id.clone()), "duplicate id accepted");
                assert!(item.line > last && item.line <= lines, "line {}", item.line);
                last = item.line;
                let start = usize::try_from(item.offset).expect("offset fits");
                let raw = data
                    .get(start..start + item.len)
                    .expect("an item's bytes lie inside the file");
                // With and without the output cap a worker may add.
                for cap in [None, Some(64)] {
                    request_from_line(item, raw, cap).expect("an item re-reads from its own line");
                }
            }
        }
        Err(errors) => {
            assert!(errors.total >= errors.errors.len());
            assert!(errors.total > 0, "an error list without errors");
            for e in &errors.errors {
                if let Some(line) = e.line {
                    assert!(
                        line >= 1 && line <= lines,
                        "error on line {line} of {lines}"
                    );
                }
                let _ = e.to_string();
            }
        }
    }
}
