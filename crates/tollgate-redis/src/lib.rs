//! tollgate's shared quota store on Redis (SPEC §13, DQ-1..DQ-7): a
//! single node or a Redis Cluster, over TCP or TLS.
//!
//! [`RedisBackend`] implements the engine's [`RemoteBackend`] seam: every
//! scope opened on it is a [`RedisQuota`] whose operations (reserve,
//! lease, refund, reconcile, release, recount, snapshot) are one Lua
//! script each, run atomically by Redis with EVALSHA. The scripts carry the
//! same arithmetic as the in-process [`LocalQuota`] (sliding window with
//! the bounded slot log, token bucket, fixed window; every limit of a scope
//! all or nothing), on Redis `TIME` as the one clock of every replica.
//! See `docs/redis.md` for keys, TTLs and failure modes.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tollgate_redis::BuildError> {
//! use tollgate::config::{ScopeConfig, MINUTE};
//! use tollgate::quota::RemoteBackend;
//! use tollgate_redis::{RedisBackend, RedisSettings};
//! let backend = RedisBackend::new(RedisSettings::new("redis://127.0.0.1:6379"))?;
//! let scope = ScopeConfig::new("openai").requests(500, MINUTE).tokens(200_000, MINUTE);
//! let store = backend.open(&scope);
//! # let _ = store; Ok(()) }
//! ```
//!
//! [`RemoteBackend`]: tollgate::quota::RemoteBackend
//! [`LocalQuota`]: tollgate::quota::LocalQuota
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod carry;
mod changes;
mod connect;
mod error;
mod feedback;
mod keys;
mod limits;
mod quota;
mod reply;
mod scripts;
mod settings;
#[cfg(feature = "testing")]
mod testing;

pub use backend::RedisBackend;
pub use error::BuildError;
pub use quota::RedisQuota;
#[doc(hidden)]
pub use reply::RawReserve;
pub use settings::{DEFAULT_PREFIX, DEFAULT_TIMEOUT, RedisSettings};
#[cfg(feature = "testing")]
pub use testing::{RedisCluster, RedisServer, require_redis};
