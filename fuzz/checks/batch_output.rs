//! An existing batch output file, read on resume (SPEC BATCH-3): arbitrary
//! bytes (a torn last line after a crash, a corrupted or foreign file) are
//! either the results it holds or a located error, never a panic. The
//! valid part ends at a line break and the torn rest is what follows it.

use std::path::Path;

use tollgate_batch::output::parse_existing;

/// Checks one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Ok(existing) = parse_existing(data, Path::new("out.jsonl")) else {
        return;
    };
    let valid = usize::try_from(existing.valid_len).expect("fits");
    assert_eq!(valid as u64 + existing.torn_bytes, data.len() as u64);
    assert!(
        valid == 0 || data[valid - 1] == b'\n',
        "valid part ends a line"
    );
    assert!(
        !data[valid..].contains(&b'\n'),
        "torn part is one partial line"
    );
    let lines = data[..valid].split(|&b| b == b'\n').count();
    for record in existing.records.values() {
        assert!(record.line >= 1 && record.line <= lines);
    }
}
