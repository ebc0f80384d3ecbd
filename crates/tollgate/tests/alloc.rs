//! Allocation budgets of the admission path, counted by a global allocator
//! (deterministic byte and call counts, not timings). These are performance
//! properties; only the bounded queue (ADM-5) is a SPEC rule.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::{AdmissionController, Call, Deadline, Flow, Priority, ScopeId, TokenEstimate};

struct Counting;

thread_local! {
    /// Counting is per thread: only the measuring thread's allocations count
    /// (the test harness may allocate on its own threads meanwhile).
    static ENABLED: Cell<bool> = const { Cell::new(false) };
}
static CALLS: AtomicUsize = AtomicUsize::new(0);
static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ENABLED.with(Cell::get) {
            CALLS.fetch_add(1, Ordering::Relaxed);
        }
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn controller() -> AdmissionController {
    AdmissionController::builder()
        .scope(
            ScopeConfig::new("main")
                .requests(1 << 40, MINUTE)
                .tokens(1 << 50, MINUTE),
        )
        .concurrency(64)
        .build()
        .unwrap()
}

fn call() -> Call {
    Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(120, 80))
}

// The two tests share the counters, so they run one after the other.
#[test]
fn allocation_budgets() {
    uncontended_acquire_and_release_do_not_allocate();
    queued_waiters_stay_within_the_memory_budget(0);
    queued_waiters_stay_within_the_memory_budget(10);
    queued_waiters_stay_within_the_memory_budget(1_000);
}

// Not a SPEC rule: a performance budget of the uncontended fast path (an
// admission and its release allocate nothing, in real time so that window
// slots are created and recycled). The admission order itself (ADM-1) is
// proven in tests/admission.rs.
fn uncontended_acquire_and_release_do_not_allocate() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = controller();
        let call = call();
        for _ in 0..1_000 {
            drop(c.acquire(&call, Deadline::NONE).await.unwrap());
        }
        ENABLED.with(|e| e.set(true));
        for _ in 0..100_000 {
            let lease = c.acquire(&call, Deadline::NONE).await.unwrap();
            drop(lease);
        }
        ENABLED.with(|e| e.set(false));
    });
    assert_eq!(CALLS.load(Ordering::SeqCst), 0, "the fast path allocated");
}

// proves: ADM-5 (the queue is physically bounded; each queued waiter costs a
// fixed, small amount of memory: budget 78 MiB per 100,000 waiters, about
// 817 bytes; 815 measured since each call carries the prices it is
// reserved at for budgets (BUD-2: its task crosses one 128-byte step of
// tokio's task cells), 677 before; 677 since each waiter keeps its input
// and output tokens apart for Q-12, 666 before) and FAIR-1 (grouping
// waiters into flows keeps that budget: 687 bytes with one flow, 10 or
// 1,000 tenants, before the prices, as the flows share one store of nodes)
fn queued_waiters_stay_within_the_memory_budget(flows: u32) {
    const WAITERS: usize = 100_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let c = AdmissionController::builder()
            .scope(ScopeConfig::new("main").requests(1, MINUTE))
            .queue_capacity(WAITERS)
            .concurrency(8)
            .build()
            .unwrap();
        let _first = c
            .acquire(&Call::new(ScopeId::FIRST), Deadline::NONE)
            .await
            .unwrap();
        common::settle().await;
        let before = LIVE.load(Ordering::SeqCst);
        let mut tasks = Vec::with_capacity(WAITERS);
        for i in 0..WAITERS {
            let c = c.clone();
            let flow = match flows {
                0 => Flow::DEFAULT,
                n => Flow::new(i as u32 % n, Priority::Standard),
            };
            tasks.push(tokio::spawn(async move {
                let call = Call::new(ScopeId::FIRST).with_flow(flow);
                let _ = c.acquire(&call, Deadline::NONE).await;
            }));
        }
        while c.snapshot().scopes[0].queued < WAITERS {
            tokio::task::yield_now().await;
        }
        let per_waiter = (LIVE.load(Ordering::SeqCst) - before) / WAITERS;
        println!(
            "bytes per queued waiter (task, future, queue node, join handle), {flows} flows: {per_waiter}"
        );
        assert!(
            per_waiter * WAITERS <= 78 << 20,
            "{per_waiter} bytes per waiter"
        );
        for t in &tasks {
            t.abort();
        }
        while c.snapshot().scopes[0].queued > 0 {
            tokio::task::yield_now().await;
        }
    });
}
