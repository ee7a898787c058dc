//! Text views of the CLI's reports: what `outbox` prints for people (JSON comes from the
//! models' serde).

pub mod status;
