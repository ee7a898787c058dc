//! The pages' bodies, from what the store answered: the overview and partitions, the failed
//! messages with the redrive preview and its result, retention, and a message's journey. Each
//! figure that `outbox status --format json` also reports carries a `data-figure` attribute
//! named after its JSON field, so a test can compare the two.

pub mod failed;
pub mod journey;
pub mod overview;
pub mod retention;
