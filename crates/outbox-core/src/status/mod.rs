//! `outbox status`: the figures beyond [`Stats`] that a store can give (each partition's owner,
//! epoch, backlog and position; what keeps storage from being dropped; the backlog by route),
//! gathered into one [`Report`]. This is the model; its views are elsewhere (the CLI's text
//! view in `outbox-cli`'s `view/status.rs`, the console's pages, and JSON by serde).
//!
//! Stores answer [`Store::status_detail`] with what applies to them; the default answers
//! nothing, and the report then holds only the [`Stats`]. The parts only one backend gives
//! are in [`postgres`] (positions, segments, CDC slots) and [`binlog`] (the sequencer).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::flow::Flow;
use crate::route::RouteSpec;
use crate::store::{Stats, Store};
use crate::Result;

pub mod binlog;
pub mod postgres;

pub use binlog::SequencerStatus;
pub use postgres::{KeptBecause, Position, RetentionPin, RetentionStatus, Segment, SlotStatus};

/// The route name of rows that no routing rule matches (they go to the relay's `--sink`).
pub const DEFAULT_ROUTE: &str = "default";

/// What [`Store::status_detail`] returns: the figures of `outbox status` that need queries of
/// their own.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StatusDetail {
    /// Every relay partition, in partition order.
    pub partitions: Vec<PartitionStatus>,
    /// What keeps storage (PostgreSQL's segments); `None` for stores without a horizon.
    pub retention: Option<RetentionStatus>,
    /// Pending messages by partition, aggregate type, event type and topic. The report adds
    /// them up per partition, per route and per type: a store leaves each partition's
    /// `pending` and `oldest_pending_age_seconds` at zero and `None`.
    pub pending: Vec<PendingCell>,
    /// The CDC relays' replication slots of this outbox (PostgreSQL, `outbox migrate --cdc`);
    /// empty without CDC mode.
    pub cdc_slots: Vec<SlotStatus>,
    /// The binlog route's sequencer (MySQL/MariaDB, `outbox migrate --binlog`); `None` on
    /// every other route.
    pub binlog_sequencer: Option<SequencerStatus>,
}

/// One relay partition as `outbox status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartitionStatus {
    /// Partition number.
    pub partition: i32,
    /// The member holding it under an unexpired lease; `None` when free or expired.
    pub owner: Option<String>,
    /// Fencing token: bumped at every change of owner.
    pub epoch: i64,
    /// When the current lease ends (`None` when free).
    pub lease_until: Option<DateTime<Utc>>,
    /// The partition's lag: messages not yet published (counted with the store's cap),
    /// parked messages still to deliver included.
    pub pending: i64,
    /// Age in seconds of its oldest pending message; `None` when nothing is pending.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Messages set aside from the partition's flow (retrying or failed heads and the messages
    /// queued behind them).
    pub parked: i64,
    /// Of those, messages that ended `failed`.
    pub failed: i64,
    /// Where the partition's reader stands; `None` for stores that mark rows instead.
    pub position: Option<Position>,
}

/// Pending messages of one partition with one aggregate type, event type and topic.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingCell {
    /// Partition.
    pub partition: i32,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Event type.
    pub event_type: String,
    /// Topic column (`None` when the row has none).
    pub topic: Option<String>,
    /// Messages pending.
    pub pending: i64,
    /// Age in seconds of the oldest of them.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// Pending messages of one route (a routing rule of `outbox.toml`, or [`DEFAULT_ROUTE`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteLag {
    /// Route name.
    pub route: String,
    /// Messages pending.
    pub pending: i64,
    /// Age in seconds of the oldest of them; `None` when none is pending.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// Pending messages of one aggregate type, event type and topic.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TypeLag {
    /// Aggregate type.
    pub aggregate_type: String,
    /// Event type.
    pub event_type: String,
    /// Topic column.
    pub topic: Option<String>,
    /// Messages pending.
    pub pending: i64,
    /// Age in seconds of the oldest of them.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// Everything `outbox status` shows, as one JSON object: the [`Stats`] keys at the top level,
/// and beside them the detail the store could give.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// When the figures were read.
    pub at: DateTime<Utc>,
    /// The counts.
    #[serde(flatten)]
    pub stats: Stats,
    /// Every partition (empty when the store has none to show).
    pub partitions: Vec<PartitionStatus>,
    /// What keeps storage, where that applies.
    pub retention: Option<RetentionStatus>,
    /// Backlog per route: every configured route, then [`DEFAULT_ROUTE`].
    pub routes: Vec<RouteLag>,
    /// Backlog per aggregate type, event type and topic, oldest first.
    pub pending_by_type: Vec<TypeLag>,
    /// The CDC relays' replication slots (empty without CDC mode).
    pub cdc_slots: Vec<SlotStatus>,
    /// The binlog route's sequencer (MySQL/MariaDB); `None` on every other route.
    pub binlog_sequencer: Option<SequencerStatus>,
    /// Whether events flow, and if not, why: the first answer of the report.
    pub flow: Flow,
}

impl Report {
    /// Reads the counts and the detail from `store`; `routes` (the relay's routing rules, first
    /// match wins) group the backlog by route.
    pub async fn collect(store: &dyn Store, routes: &[RouteSpec]) -> Result<Self> {
        let stats = store.stats().await?;
        let detail = store.status_detail().await?;
        Ok(Self::new(Utc::now(), stats, detail, routes))
    }

    /// A report of `stats` and `detail`, read at `at`.
    pub fn new(
        at: DateTime<Utc>,
        stats: Stats,
        detail: StatusDetail,
        routes: &[RouteSpec],
    ) -> Self {
        let mut by_route: Vec<RouteLag> = routes
            .iter()
            .map(|r| r.name.as_str())
            .chain([DEFAULT_ROUTE])
            .map(|name| RouteLag {
                route: name.to_string(),
                pending: 0,
                oldest_pending_age_seconds: None,
            })
            .collect();
        let mut by_type: BTreeMap<TypeKey, TypeLag> = BTreeMap::new();
        let mut partitions = detail.partitions;
        for cell in &detail.pending {
            let route = routes
                .iter()
                .position(|r| {
                    r.when.matches_fields(
                        &cell.aggregate_type,
                        &cell.event_type,
                        cell.topic.as_deref(),
                    )
                })
                .unwrap_or(routes.len());
            let r = &mut by_route[route];
            add(&mut r.pending, &mut r.oldest_pending_age_seconds, cell);
            let key = (
                cell.aggregate_type.clone(),
                cell.event_type.clone(),
                cell.topic.clone(),
            );
            let t = by_type.entry(key).or_insert_with(|| TypeLag {
                aggregate_type: cell.aggregate_type.clone(),
                event_type: cell.event_type.clone(),
                topic: cell.topic.clone(),
                pending: 0,
                oldest_pending_age_seconds: None,
            });
            add(&mut t.pending, &mut t.oldest_pending_age_seconds, cell);
            let p = match partitions
                .iter()
                .position(|p| p.partition == cell.partition)
            {
                Some(i) => i,
                // A store without partition bookkeeping still gets its backlog per partition.
                None => {
                    partitions.push(PartitionStatus {
                        partition: cell.partition,
                        owner: None,
                        epoch: 0,
                        lease_until: None,
                        pending: 0,
                        oldest_pending_age_seconds: None,
                        parked: 0,
                        failed: 0,
                        position: None,
                    });
                    partitions.len() - 1
                }
            };
            let p = &mut partitions[p];
            add(&mut p.pending, &mut p.oldest_pending_age_seconds, cell);
        }
        partitions.sort_by_key(|p| p.partition);
        let mut pending_by_type: Vec<TypeLag> = by_type.into_values().collect();
        pending_by_type.sort_by(|a, b| {
            b.oldest_pending_age_seconds
                .unwrap_or(0.0)
                .total_cmp(&a.oldest_pending_age_seconds.unwrap_or(0.0))
        });
        let flow = Flow::of(at, &stats, &partitions, &by_route);
        Self {
            at,
            stats,
            partitions,
            retention: detail.retention,
            routes: by_route,
            pending_by_type,
            cdc_slots: detail.cdc_slots,
            binlog_sequencer: detail.binlog_sequencer,
            flow,
        }
    }
}

/// Aggregate type, event type, topic.
type TypeKey = (String, String, Option<String>);

fn add(pending: &mut i64, oldest: &mut Option<f64>, cell: &PendingCell) {
    *pending += cell.pending;
    if let Some(a) = cell.oldest_pending_age_seconds {
        *oldest = Some(oldest.map_or(a, |o| o.max(a)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::RouteSpec;

    fn stats() -> Stats {
        Stats {
            pending: 5,
            oldest_pending_age_seconds: Some(9.0),
            failed: 0,
            published: 7,
            retrying: 0,
            blocked_keys: 0,
            parked: 0,
            partitions_at_parking_cap: 0,
            waiting: 0,
            oldest_waiting_age_seconds: None,
            members: Vec::new(),
            blocked: Vec::new(),
        }
    }

    fn cell(partition: i32, ty: &str, ev: &str, n: i64, age: f64) -> PendingCell {
        PendingCell {
            partition,
            aggregate_type: ty.into(),
            event_type: ev.into(),
            topic: None,
            pending: n,
            oldest_pending_age_seconds: Some(age),
        }
    }

    #[test]
    fn the_backlog_is_grouped_by_first_matching_route_and_by_type() {
        let routes = [RouteSpec::parse("name=pay; event_type=payment.*; sink=stdout:", 1).unwrap()];
        let detail = StatusDetail {
            pending: vec![
                cell(3, "payment", "payment.created", 2, 4.0),
                cell(5, "payment", "payment.created", 1, 9.0),
                cell(5, "order", "order.placed", 2, 1.0),
            ],
            ..StatusDetail::default()
        };
        let r = Report::new(Utc::now(), stats(), detail, &routes);
        assert_eq!(r.routes.len(), 2);
        assert_eq!(
            (r.routes[0].route.as_str(), r.routes[0].pending),
            ("pay", 3)
        );
        assert_eq!(r.routes[0].oldest_pending_age_seconds, Some(9.0));
        assert_eq!(
            (r.routes[1].route.as_str(), r.routes[1].pending),
            (DEFAULT_ROUTE, 2)
        );
        assert_eq!(r.pending_by_type.len(), 2);
        assert_eq!(
            r.pending_by_type[0].event_type, "payment.created",
            "oldest first"
        );
        assert_eq!(r.pending_by_type[0].pending, 3);
        // A store without partition bookkeeping still gets its backlog per partition.
        let parts: Vec<(i32, i64)> = r
            .partitions
            .iter()
            .map(|p| (p.partition, p.pending))
            .collect();
        assert_eq!(parts, [(3, 2), (5, 3)]);
    }

    #[test]
    fn json_keeps_the_stats_keys_at_the_top_level() {
        let r = Report::new(Utc::now(), stats(), StatusDetail::default(), &[]);
        let v = serde_json::to_value(&r).unwrap_or_default();
        assert_eq!(v["pending"], 5);
        assert_eq!(v["routes"][0]["route"], DEFAULT_ROUTE);
        assert!(v["retention"].is_null());
    }
}
