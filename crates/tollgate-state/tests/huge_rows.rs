//! A state file whose sliding-window entries hold huge amounts (a damaged
//! or hand-edited file) neither panics the restore nor wraps around to
//! "nothing counted" (SPEC DQ-8).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tollgate::clock::AnchoredClock;
use tollgate::config::{ControllerConfig, ScopeConfig};
use tollgate::{AdmissionController, Call, Deadline, ScopeId, TokenEstimate};
use tollgate_state::{FILE_NAME, OnUnreadable, StateFile};

fn dir(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("tollgate-state-huge-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_835_474_400)
}

fn process(utc: SystemTime) -> AdmissionController {
    let scope = ScopeConfig::new("day").tokens(1_000_000, Duration::from_secs(86_400));
    AdmissionController::builder()
        .config(ControllerConfig {
            scopes: vec![scope],
            ..ControllerConfig::default()
        })
        .clock(Arc::new(AnchoredClock::new(utc)))
        .build()
        .unwrap()
}

// proves: DQ-8 (two saved entries of 2⁶³ tokens each are restored
// without overflow and keep the day's limit spent)
#[tokio::test(start_paused = true)]
async fn huge_saved_amounts_do_not_panic_the_restore() {
    let d = dir("huge");
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    drop(file);
    let conn = rusqlite::Connection::open(d.join(FILE_NAME)).unwrap();
    let until = (start() + Duration::from_secs(3_600))
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let half = 1u64 << 63;
    conn.execute(
        "INSERT INTO counted (owner, scope, dimension, amount, window_ns, period, zone, counted)
         VALUES ('upstream', 'day', 'tokens', 1000000, 86400000000000, NULL, NULL, ?1)",
        [format!(
            "{{\"until\": [[{until}, {half}], [{until}, {half}]]}}"
        )],
    )
    .unwrap();
    drop(conn);
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    let controller = process(start());
    assert_eq!(file.restore("upstream", &controller), 1);
    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(1, 0));
    let deadline = Deadline::at(tokio::time::Instant::now() + Duration::from_secs(1));
    let got = controller.acquire(&call, deadline).await;
    assert!(
        got.is_err(),
        "the restored entries counted nothing: {got:?}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
