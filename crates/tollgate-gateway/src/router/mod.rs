//! Quota-aware routing between the deployments of a model (SPEC GW-11).
//!
//! Each attempt goes to the deployment that can start it soonest by the
//! engine's own projection ([`tollgate::AdmissionController::forecast`]:
//! refill arithmetic plus the reservations queued ahead), skipping
//! deployments whose circuit is open or whose scope is cooling down after a
//! 429; ties go to the fewest calls in flight per unit of weight, then the
//! higher weight, then the order of the configuration. A failed attempt may
//! be retried on another deployment at once; the model's retry policy
//! (attempt budget, backoff, honest wait) applies across deployments, all
//! under the call's one deadline (and the tenant's one permit, held by the
//! caller).
//!
//! A model with one deployment does not go through the router's loop: its
//! supervisor retries as it always did.

mod attempts;
mod in_flight;
mod pick;

pub use attempts::{Routed, route};
pub use in_flight::{InFlight, InFlightGuard};
pub use pick::{Candidate, pick};
