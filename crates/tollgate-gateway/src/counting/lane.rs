//! The counting lane: a few permits for large token counts, handed out in
//! weighted fair order between tenants (SPEC GW-17, much as FAIR-3 orders
//! admission).
//!
//! A first-come queue would let one tenant's burst of large prompts make
//! another tenant's single large prompt wait behind all of them. Here the
//! waiting counts are grouped by tenant, FIFO within one tenant. Each
//! tenant has a counter of the work it was granted (the job's size in
//! bytes divided by the tenant's weight), and a freed permit goes to the
//! waiting tenant with the smallest counter (ties: the earliest arrival).
//! This is start-time fair queueing: the lane's virtual time is the
//! counter the last granted tenant had before its grant, and a tenant
//! that starts waiting starts at no less than it, so time spent idle
//! banks no credit, yet a newcomer goes before the next job of a tenant
//! that was just granted one. The counters are forgotten whenever nobody
//! waits. So while two tenants both wait, the work granted to each
//! differs by at most the largest single grant (a request's parse and
//! count, when its permit is [charged](Permit::charge) for both),
//! whatever their numbers of requests.
//!
//! A permit is an owned guard: wherever it is dropped (the count ended,
//! or the permit was handed to a waiter that left meanwhile), it passes to
//! the next waiter or back to the lane. A waiter that leaves before its
//! turn takes its place out of the queue.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tollgate::Flow;

/// A lane of a fixed number of permits.
#[derive(Debug)]
pub(crate) struct Lane {
    state: Mutex<State>,
    /// How many permits it has (tests check they all come back).
    #[cfg(test)]
    permits: usize,
}

#[derive(Debug)]
struct State {
    /// Permits nobody holds. Never more than zero while a count waits: a
    /// freed permit goes straight to the next waiter.
    free: usize,
    /// The tenants that have waited since the lane last had no waiter,
    /// with their counters (usually a handful: a linear scan).
    tenants: Vec<Tenant>,
    /// The counter of the tenant last granted, before its grant: where a
    /// tenant that starts waiting starts, at least.
    vtime: u64,
    /// The next waiter's number (arrival order).
    next: u64,
}

#[derive(Debug)]
struct Tenant {
    tenant: u32,
    /// Work granted (bytes divided by weight) since the lane last had no
    /// waiter, raised to the lane's virtual time when it starts waiting.
    granted: u64,
    queue: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    number: u64,
    cost: u64,
    grant: oneshot::Sender<Permit>,
}

/// A permit of the lane; dropping it passes it on.
#[derive(Debug)]
pub(crate) struct Permit {
    lane: Option<Arc<Lane>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            lane.release();
        }
    }
}

impl State {
    /// Takes the next waiter in fair order and charges its tenant.
    fn next_waiter(&mut self) -> Option<Waiter> {
        let tenant = self
            .tenants
            .iter_mut()
            .filter_map(|t| Some((t.granted, t.queue.front()?.number, t)))
            .min_by_key(|(granted, number, _)| (*granted, *number))
            .map(|(_, _, t)| t)?;
        let waiter = tenant.queue.pop_front()?;
        self.vtime = tenant.granted;
        tenant.granted = tenant.granted.saturating_add(waiter.cost);
        self.left();
        Some(waiter)
    }

    /// A waiter left the queue (granted or gone); the counters are
    /// forgotten when none is left. (A scan of a handful of tenants.)
    fn left(&mut self) {
        if self.tenants.iter().all(|t| t.queue.is_empty()) {
            self.tenants.clear();
            self.vtime = 0;
        }
    }
}

/// `bytes` of `flow`'s work in counter units: divided by its weight, at
/// least one.
fn cost(flow: Flow, bytes: usize) -> u64 {
    u64::try_from(bytes)
        .unwrap_or(u64::MAX)
        .div_ceil(u64::from(flow.weight().max(1)))
        .max(1)
}

impl Permit {
    /// Adds `bytes` of `flow`'s work to its tenant's counter: a job run
    /// under a permit granted for a smaller one (a body parsed, then
    /// counted). Nothing if nobody waits (the counters are forgotten then).
    pub(crate) fn charge(&self, flow: Flow, bytes: usize) {
        let Some(lane) = &self.lane else { return };
        let mut s = lane.state.lock();
        if let Some(t) = s.tenants.iter_mut().find(|t| t.tenant == flow.tenant()) {
            t.granted = t.granted.saturating_add(cost(flow, bytes));
        }
    }
}

/// A waiting count's place, taken out of the queue if the count leaves
/// before its turn.
struct Place<'a> {
    lane: &'a Lane,
    tenant: u32,
    number: u64,
    granted: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        let mut s = self.lane.state.lock();
        let Some(t) = s.tenants.iter_mut().find(|t| t.tenant == self.tenant) else {
            return;
        };
        // Not found: its turn came meanwhile, and the permit it was handed
        // passes on when its receiver is dropped.
        if let Some(i) = t.queue.iter().position(|w| w.number == self.number) {
            t.queue.remove(i);
            s.left();
        }
    }
}

impl Lane {
    /// A lane of `permits` permits (at least one).
    pub(crate) fn new(permits: usize) -> Arc<Lane> {
        let permits = permits.max(1);
        Arc::new(Lane {
            state: Mutex::new(State {
                free: permits,
                tenants: Vec::new(),
                vtime: 0,
                next: 0,
            }),
            #[cfg(test)]
            permits,
        })
    }

    /// A permit for a count of `bytes` (body length times estimators) of
    /// `flow`'s tenant, once its turn comes; `None` only if the lane
    /// failed to hand it one (not expected).
    pub(crate) async fn acquire(self: &Arc<Self>, flow: Flow, bytes: usize) -> Option<Permit> {
        let cost = cost(flow, bytes);
        let (grant, number) = {
            let mut s = self.state.lock();
            if s.free > 0 {
                s.free -= 1;
                return Some(Permit {
                    lane: Some(Arc::clone(self)),
                });
            }
            let floor = s.vtime;
            let number = s.next;
            s.next += 1;
            let (tx, rx) = oneshot::channel();
            let waiter = Waiter {
                number,
                cost,
                grant: tx,
            };
            match s.tenants.iter_mut().find(|t| t.tenant == flow.tenant()) {
                Some(t) => {
                    if t.queue.is_empty() {
                        t.granted = t.granted.max(floor);
                    }
                    t.queue.push_back(waiter);
                }
                None => s.tenants.push(Tenant {
                    tenant: flow.tenant(),
                    granted: floor,
                    queue: VecDeque::from([waiter]),
                }),
            }
            (rx, number)
        };
        let mut place = Place {
            lane: self,
            tenant: flow.tenant(),
            number,
            granted: false,
        };
        let permit = grant.await.ok();
        place.granted = true;
        permit
    }

    /// A permit came back: to the next waiter that still waits, else to
    /// the lane. The hand-off happens outside the lock, so a permit
    /// dropped by a receiver that just left passes on by this same path.
    fn release(self: Arc<Self>) {
        loop {
            let waiter = {
                let mut s = self.state.lock();
                match s.next_waiter() {
                    Some(waiter) => waiter,
                    None => {
                        s.free += 1;
                        return;
                    }
                }
            };
            if self.hand(waiter) {
                return;
            }
        }
    }

    /// Hands a permit to `waiter`; `false` if it left meanwhile (the
    /// permit is then still to be handed on).
    fn hand(self: &Arc<Self>, waiter: Waiter) -> bool {
        let permit = Permit {
            lane: Some(Arc::clone(self)),
        };
        match waiter.grant.send(permit) {
            Ok(()) => true,
            Err(mut returned) => {
                returned.lane = None;
                false
            }
        }
    }

    /// Whether every permit is back and nothing waits or is remembered
    /// (tests).
    #[cfg(test)]
    pub(crate) fn idle(&self) -> bool {
        let s = self.state.lock();
        s.free == self.permits && s.tenants.is_empty()
    }

    /// Permits nobody holds (tests).
    #[cfg(test)]
    pub(crate) fn free(&self) -> usize {
        self.state.lock().free
    }

    /// Jobs waiting (tests).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        let s = self.state.lock();
        s.tenants.iter().map(|t| t.queue.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use parking_lot::Mutex;
    use tokio::sync::oneshot;
    use tollgate::{Flow, Priority};

    use super::Lane;

    type Log = Arc<Mutex<Vec<&'static str>>>;

    fn flow(tenant: u32) -> Flow {
        Flow::new(tenant, Priority::Standard)
    }

    /// A task that waits for a permit of `lane` for `name`'s count of
    /// `bytes`, logs `name` when it gets it and holds it until the
    /// returned sender is used or dropped.
    fn waiter(
        lane: &Arc<Lane>,
        f: Flow,
        bytes: usize,
        name: &'static str,
        log: &Log,
    ) -> oneshot::Sender<()> {
        let (done, hold) = oneshot::channel::<()>();
        let (lane, log) = (Arc::clone(lane), Arc::clone(log));
        tokio::spawn(async move {
            let permit = lane.acquire(f, bytes).await;
            log.lock().push(name);
            let _ = hold.await;
            drop(permit);
        });
        done
    }

    /// Ends the counts of `releases` in turn (a count whose end came before
    /// its grant ends as soon as it is granted, so the lane alone decides
    /// the order), then checks the order of the grants and that the lane
    /// is idle.
    async fn end_in_turn(
        lane: &Lane,
        log: &Log,
        releases: impl IntoIterator<Item = oneshot::Sender<()>>,
        expected: &[&str],
    ) {
        for release in releases {
            drop(release);
            settle().await;
        }
        assert_eq!(*log.lock(), expected);
        assert!(lane.idle());
    }

    /// Lets every spawned task of this single-threaded runtime run until
    /// it waits.
    async fn settle() {
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    /// proves: GW-17 (one tenant's burst of large requests costs its
    /// sender, not other tenants: a second tenant's large request that
    /// arrives after five of the first tenant's waits behind one of them,
    /// not behind all five, as it would in a first-come queue)
    #[tokio::test(flavor = "current_thread")]
    async fn a_burst_does_not_queue_another_tenant_behind_it() {
        let lane = Lane::new(1);
        let log = Log::default();
        let held = lane.acquire(flow(1), 1000).await;
        let mut releases = Vec::new();
        for _ in 0..5 {
            releases.push(waiter(&lane, flow(1), 1000, "a", &log));
        }
        settle().await;
        releases.push(waiter(&lane, flow(2), 1000, "b", &log));
        settle().await;
        assert!(log.lock().is_empty(), "the lane's one permit is held");
        drop(held);
        end_in_turn(&lane, &log, releases, &["a", "b", "a", "a", "a", "a"]).await;
    }

    /// proves: GW-17, FAIR-3 (the lane shares by work over weight: a
    /// tenant of weight 10 gets ten counts of the same size for each one
    /// of a tenant of weight 1 while both wait; ties go to the earlier
    /// arrival)
    #[tokio::test(flavor = "current_thread")]
    async fn shares_follow_size_and_weight() {
        let lane = Lane::new(1);
        let log = Log::default();
        let held = lane.acquire(flow(1), 1000).await;
        let mut releases = Vec::new();
        for _ in 0..4 {
            releases.push(waiter(&lane, flow(1), 1000, "a", &log));
        }
        settle().await;
        for _ in 0..12 {
            releases.push(waiter(&lane, flow(2).with_weight(10), 1000, "b", &log));
        }
        settle().await;
        drop(held);
        let mut expected = vec!["a"];
        expected.extend(["b"; 10]);
        expected.extend(["a", "b", "b", "a", "a"]);
        end_in_turn(&lane, &log, releases, &expected).await;
    }

    /// proves: GW-17, FAIR-3 (time spent not waiting banks no credit: a
    /// tenant that starts waiting while another has been served starts at
    /// the lane's virtual time, so it alternates with the other instead of
    /// taking every next turn until it catches up; as a newcomer it goes
    /// before the other's next job)
    #[tokio::test(flavor = "current_thread")]
    async fn a_newcomer_starts_at_the_lanes_virtual_time() {
        let lane = Lane::new(1);
        let log = Log::default();
        let held = lane.acquire(flow(1), 100).await;
        let mut a: Vec<_> = (0..4)
            .map(|_| waiter(&lane, flow(1), 100, "a", &log))
            .collect();
        settle().await;
        drop(held);
        settle().await;
        drop(a.remove(0));
        settle().await;
        // Two of a's counts were granted; b arrives.
        let mut b: Vec<_> = (0..2)
            .map(|_| waiter(&lane, flow(2), 100, "b", &log))
            .collect();
        settle().await;
        let releases = a.drain(..).chain(b.drain(..));
        end_in_turn(&lane, &log, releases, &["a", "a", "b", "a", "b", "a"]).await;
    }

    /// proves: GW-17 (a count that leaves before its turn takes nothing:
    /// the permit goes to the next waiter, and the lane ends idle)
    #[tokio::test(flavor = "current_thread")]
    async fn a_waiter_that_leaves_takes_nothing() {
        let lane = Lane::new(1);
        let log = Log::default();
        let held = lane.acquire(flow(1), 10).await;
        let leaving = tokio::spawn({
            let lane = Arc::clone(&lane);
            async move { lane.acquire(flow(1), 10).await.map(drop) }
        });
        let release = waiter(&lane, flow(2), 10, "b", &log);
        settle().await;
        assert_eq!(lane.waiting(), 2);
        leaving.abort();
        assert!(leaving.await.is_err_and(|e| e.is_cancelled()));
        assert_eq!(lane.waiting(), 1, "the waiter that left took its place out");
        drop(held);
        settle().await;
        assert_eq!(*log.lock(), ["b"]);
        drop(release);
        settle().await;
        assert!(lane.idle());
    }

    /// proves: GW-17 (a permit handed to a waiter that left between its
    /// turn coming and the hand-off is still the lane's to hand on once,
    /// not counted back twice)
    #[tokio::test(flavor = "current_thread")]
    async fn a_permit_refused_by_a_waiter_that_left_is_not_doubled() {
        let lane = Lane::new(1);
        let held = lane.acquire(flow(1), 10).await;
        let (grant, gone) = oneshot::channel();
        drop(gone);
        let waiter = super::Waiter {
            number: 0,
            cost: 10,
            grant,
        };
        assert!(!lane.hand(waiter), "the waiter left");
        assert_eq!(lane.free(), 0, "the refused permit was not given back");
        drop(held);
        assert_eq!(lane.free(), 1);
        assert!(lane.idle());
    }

    /// proves: GW-17 (under oversubscribed threads, with counts abandoned
    /// at random points, as clients leave, the lane never lets more
    /// counts run than it has permits, loses none, and ends idle)
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn no_permit_is_lost_or_doubled_under_contention() {
        const PERMITS: usize = 2;
        let lane = Lane::new(PERMITS);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..600u32 {
            let (lane, running, most) =
                (Arc::clone(&lane), Arc::clone(&running), Arc::clone(&most));
            let f = flow(i % 3).with_weight(1 + i % 2);
            let patience = Duration::from_micros(u64::from(fastrand::u32(0..400)));
            tasks.push(tokio::spawn(async move {
                let count =
                    super::super::through(&lane, f, 1 + fastrand::usize(0..100_000), move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        for _ in 0..fastrand::u32(0..2_000) {
                            std::hint::black_box(());
                        }
                        running.fetch_sub(1, Ordering::SeqCst);
                    });
                let _ = tokio::time::timeout(patience, count).await;
            }));
            if i % 7 == 0 {
                tokio::task::yield_now().await;
            }
            if i % 11 == 0
                && let Some(t) = tasks.get(fastrand::usize(0..tasks.len()))
            {
                t.abort();
            }
        }
        for t in tasks {
            let _ = t.await;
        }
        // Counts whose waiters left run on; their permits come back when
        // they end.
        tokio::time::timeout(Duration::from_secs(60), async {
            while !lane.idle() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("every permit came back and nothing waits");
        assert!(
            most.load(Ordering::SeqCst) <= PERMITS,
            "more counts ran than permits"
        );
        assert_eq!(running.load(Ordering::SeqCst), 0);
    }
}
