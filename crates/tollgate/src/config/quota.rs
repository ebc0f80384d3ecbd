//! Quota scope settings (SPEC Q-1, Q-2, Q-10).

use std::time::Duration;

use super::calendar::Calendar;
use super::error::{ConfigError, non_zero, positive};
use crate::quota::Dimension;

/// One minute, the usual provider window.
pub const MINUTE: Duration = Duration::from_secs(60);
/// One day.
pub const DAY: Duration = Duration::from_secs(86_400);

/// How a scope counts its limits (SPEC Q-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// In every interval of one window the admitted amount never exceeds the
    /// limit. Cannot draw a 429 from a provider enforcing the same limit over
    /// the same window, whatever its own algorithm. The default.
    #[default]
    SlidingWindow,
    /// Continuous refill at `limit / window`, capacity
    /// `max(1, limit * burst / window)`; `burst` defaults to the window.
    TokenBucket {
        /// The burst length; `None` means one window.
        burst: Option<Duration>,
    },
    /// Counters reset to the limit at each window boundary.
    FixedWindow,
}

impl Algorithm {
    /// The configuration name: `sliding_window`, `token_bucket`, `fixed_window`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
        }
    }
}

/// One (dimension, amount, window) limit (SPEC Q-1).
///
/// The window is rolling (`window` long, counted by the scope's
/// algorithm), or a period of the calendar (SPEC BUD-3): then `window` is
/// the period's nominal length, and the limit is a fixed window whose
/// boundaries are the period's, whatever the scope's algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Requests, tokens, input tokens or output tokens (SPEC Q-12).
    pub dimension: Dimension,
    /// How many per window; must be positive.
    pub amount: u64,
    /// The window; must be longer than zero. For a calendar window, the
    /// period's nominal length ([`Period::nominal`](super::Period::nominal)).
    pub window: Duration,
    /// The calendar period, for a calendar window; `None` for a rolling
    /// window.
    pub calendar: Option<Calendar>,
}

impl Limit {
    /// `amount` of `dimension` per rolling `window`.
    pub const fn new(dimension: Dimension, amount: u64, window: Duration) -> Self {
        Limit {
            dimension,
            amount,
            window,
            calendar: None,
        }
    }

    /// `amount` of `dimension` per period of `calendar` (SPEC BUD-3).
    ///
    /// ```
    /// use tollgate::config::{Calendar, Limit, Period, ScopeConfig};
    /// use tollgate::Dimension;
    /// let scope = ScopeConfig::new("team-a")
    ///     .limit(Limit::per(Dimension::Tokens, 2_000_000, Calendar::new(Period::Day)));
    /// assert!(scope.limits()[0].calendar.is_some());
    /// ```
    pub const fn per(dimension: Dimension, amount: u64, calendar: Calendar) -> Self {
        Limit {
            dimension,
            amount,
            window: calendar.period.nominal(),
            calendar: Some(calendar),
        }
    }

    /// The arithmetic this limit is counted with in a scope counted by
    /// `scope`: a calendar window is a fixed window whatever the scope's
    /// algorithm (SPEC BUD-3), and a rolling budget (a cost limit) is a
    /// sliding window whatever the scope's algorithm, so that it admits
    /// at most its amount in any of its windows (SPEC BUD-2, BUD-3: a
    /// bucket would refill it as it is spent, and a fixed window would
    /// admit it again at each window's start, both up to twice the amount
    /// in one window).
    pub fn algorithm_in(&self, scope: Algorithm) -> Algorithm {
        match self.calendar {
            Some(_) => Algorithm::FixedWindow,
            None if self.dimension.is_cost() => Algorithm::SlidingWindow,
            None => scope,
        }
    }

    /// How a store that keeps no calendar (the shared store) counts this
    /// limit in a scope counted by `scope`: a calendar window as a sliding
    /// window of its longest period (so no period admits more than its
    /// amount), any other window as [`algorithm_in`](Self::algorithm_in)
    /// says. Two limits of one scope with the same dimension and the same
    /// answer share one count there.
    pub fn without_calendar(&self, scope: Algorithm) -> (Algorithm, Duration) {
        match self.calendar {
            Some(c) => (Algorithm::SlidingWindow, c.longest()),
            None => (self.algorithm_in(scope), self.window),
        }
    }

    /// The window as configured: `1m`-style for a rolling one, `day
    /// (Europe/Paris)`-style for a calendar one.
    pub fn window_label(&self) -> String {
        match &self.calendar {
            Some(c) => c.to_string(),
            None => format_duration(self.window),
        }
    }
}

/// `d` in the configuration's style: `90s` as `1m 30s`, `1d`, `500ms`.
fn format_duration(d: Duration) -> String {
    const UNITS: [(u64, &str); 4] = [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")];
    let mut secs = d.as_secs();
    let mut parts = Vec::new();
    for (size, unit) in UNITS {
        if secs >= size {
            parts.push(format!("{}{unit}", secs / size));
            secs %= size;
        }
    }
    let ms = d.subsec_millis();
    if ms > 0 || parts.is_empty() {
        parts.push(format!("{ms}ms"));
    }
    parts.join(" ")
}

/// A named quota scope: the calls that spend one budget (SPEC Q-10).
///
/// ```
/// use tollgate::config::{Algorithm, ScopeConfig, DAY, MINUTE};
/// let scope = ScopeConfig::new("openai-main")
///     .requests(500, MINUTE)
///     .requests(10_000, DAY)
///     .tokens(200_000, MINUTE)
///     .algorithm(Algorithm::SlidingWindow);
/// assert_eq!(scope.limits().len(), 3);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeConfig {
    pub(crate) name: String,
    pub(crate) limits: Vec<Limit>,
    pub(crate) algorithm: Algorithm,
    pub(crate) queue_capacity: Option<usize>,
    pub(crate) learn: Option<Duration>,
    /// Percent of the admitted cost each class is owed (SPEC FAIR-2).
    pub(crate) min_share: [u8; 3],
}

/// `min_share` of each class below the top by default (SPEC FAIR-2).
pub const DEFAULT_MIN_SHARE: u8 = 5;

/// The longest window `min_share` is measured over, when a scope has
/// one that short ([`ScopeConfig::share_window`]): the providers' minute.
pub const SHARE_HORIZON: Duration = Duration::from_secs(60);

impl ScopeConfig {
    /// A scope without limits.
    pub fn new(name: impl Into<String>) -> Self {
        ScopeConfig {
            name: name.into(),
            limits: Vec::new(),
            algorithm: Algorithm::default(),
            queue_capacity: None,
            learn: None,
            min_share: [0, DEFAULT_MIN_SHARE, DEFAULT_MIN_SHARE],
        }
    }

    /// Adds a request limit of `amount` per `window`.
    pub fn requests(self, amount: u64, window: Duration) -> Self {
        self.limit(Limit::new(Dimension::Requests, amount, window))
    }

    /// Adds a token limit of `amount` per `window`.
    pub fn tokens(self, amount: u64, window: Duration) -> Self {
        self.limit(Limit::new(Dimension::Tokens, amount, window))
    }

    /// Adds an input-token limit of `amount` per `window` (SPEC Q-12): it
    /// takes each attempt's input estimate and is settled from the
    /// reported input tokens.
    pub fn input_tokens(self, amount: u64, window: Duration) -> Self {
        self.limit(Limit::new(Dimension::InputTokens, amount, window))
    }

    /// Adds an output-token limit of `amount` per `window` (SPEC Q-12): it
    /// takes each attempt's output allowance and is settled from the
    /// reported output tokens.
    pub fn output_tokens(self, amount: u64, window: Duration) -> Self {
        self.limit(Limit::new(Dimension::OutputTokens, amount, window))
    }

    /// Adds a cost limit (a budget, SPEC BUD-2) of `micros` micro-dollars
    /// per `window`: it takes each attempt's worst-case cost at its price
    /// and is settled from the priced usage. Every call of the scope then
    /// needs a price ([`Call::with_price`](crate::Call::with_price)) and a
    /// token estimate.
    pub fn cost(self, micros: u64, window: Duration) -> Self {
        self.limit(Limit::new(Dimension::Cost, micros, window))
    }

    /// Adds a limit.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// Chooses the algorithm for every limit of this scope.
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Overrides the controller's queue capacity for this scope.
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.queue_capacity = Some(capacity);
        self
    }

    /// Learns the limits this configuration leaves out from the provider's
    /// advertised `x-ratelimit-limit-*`, over `window` (SPEC Q-14). Until
    /// the first report, a scope without a request limit admits one request
    /// per window, so nothing is sent blind; a token limit is added when
    /// the provider first advertises one. Configured limits are never
    /// changed by what the provider says. A report applies to its own
    /// dimension only: the `x-ratelimit-*-tokens` headers describe `tokens`
    /// limits, and `input_tokens`/`output_tokens` limits (SPEC Q-12) are
    /// neither learned nor charged from them.
    pub fn learn_limits(mut self, window: Duration) -> Self {
        self.learn = Some(window);
        self
    }

    /// Sets the share of the scope's admitted cost over its
    /// [`share_window`](Self::share_window) that a waiting class below `interactive` is served first until it
    /// has it (SPEC FAIR-2; default 5 % each), in percent. The top class
    /// needs none. The shares of `standard` and `batch` must add up to
    /// less than 100.
    pub fn min_share(mut self, class: crate::flow::Priority, percent: u8) -> Self {
        self.min_share[class.index()] = percent;
        self
    }

    /// The `min_share` of each class, in percent, highest class first.
    pub fn min_shares(&self) -> [u8; 3] {
        self.min_share
    }

    /// The shortest window of any limit.
    pub fn shortest_window(&self) -> Option<Duration> {
        self.windows().min()
    }

    /// The window `min_share` is measured over (SPEC FAIR-2): the longest
    /// of the scope's windows up to [`SHARE_HORIZON`], or the shortest if
    /// every window is longer. A pacing limit (one request per 100 ms)
    /// beside the provider's window holds one grant, too few to tell a
    /// share; a day's window would let a class idle all day be owed a
    /// twentieth of the day's cost at once.
    ///
    /// ```
    /// // proves: FAIR-2 (the window min_share is measured over)
    /// use std::time::Duration;
    /// use tollgate::config::{ScopeConfig, DAY, MINUTE};
    /// let paced = ScopeConfig::new("s")
    ///     .requests(100, Duration::from_secs(10))
    ///     .requests(1, Duration::from_millis(100));
    /// assert_eq!(paced.share_window(), Some(Duration::from_secs(10)));
    /// let account = ScopeConfig::new("s").requests(500, MINUTE).tokens(5_000_000, DAY);
    /// assert_eq!(account.share_window(), Some(MINUTE));
    /// let hourly = ScopeConfig::new("s").requests(1_000, 60 * MINUTE).requests(9_000, DAY);
    /// assert_eq!(hourly.share_window(), Some(60 * MINUTE));
    /// ```
    pub fn share_window(&self) -> Option<Duration> {
        self.windows()
            .filter(|w| *w <= SHARE_HORIZON)
            .max()
            .or_else(|| self.shortest_window())
    }

    fn windows(&self) -> impl Iterator<Item = Duration> + '_ {
        self.limits.iter().map(|l| l.window).chain(self.learn)
    }

    /// The window over which missing limits are learned, if any.
    pub fn learns(&self) -> Option<Duration> {
        self.learn
    }

    /// The scope's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configured limits.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// Whether any limit counts tokens (or may, once learned).
    pub fn has_token_limit(&self) -> bool {
        self.learn.is_some() || self.limits.iter().any(|l| l.dimension.is_tokens())
    }

    /// Whether any limit counts money (SPEC BUD-2).
    pub fn has_cost_limit(&self) -> bool {
        self.limits.iter().any(|l| l.dimension.is_cost())
    }

    /// Whether every call needs a token estimate: a token limit, or a cost
    /// limit (a call's worst case is priced from its estimate).
    pub fn needs_estimate(&self) -> bool {
        self.has_token_limit() || self.has_cost_limit()
    }

    /// Checks every field (SPEC CFG-1, CFG-2).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.trim().is_empty() {
            return Err(ConfigError::new("scopes[].name", "must not be empty"));
        }
        let at = |field: String| format!("scopes.{}.{field}", self.name);
        for (i, limit) in self.limits.iter().enumerate() {
            positive(&at(format!("limits[{i}].amount")), limit.amount)?;
            non_zero(&at(format!("limits[{i}].window")), limit.window)?;
        }
        if let Some(w) = self.learn {
            non_zero(&at("learn_limits".into()), w)?;
        }
        if let Algorithm::TokenBucket { burst: Some(b) } = self.algorithm {
            non_zero(&at("burst".into()), b)?;
        }
        let shares: u32 = self.min_share[1..].iter().map(|&p| u32::from(p)).sum();
        if shares >= 100 {
            return Err(ConfigError::new(
                at("min_share".into()),
                "the min_share of standard and batch must add up to less than 100 %",
            ));
        }
        if self.queue_capacity == Some(0) {
            return Err(ConfigError::new(
                at("queue_capacity".into()),
                "must be at least 1",
            ));
        }
        Ok(())
    }
}
