//! Lanes: one per sink a relay serves (each routing rule, then the default sink), each with its
//! own circuit breaker, destination template and publish deadline. A row takes the first lane
//! whose rule it matches, so it goes to exactly one sink, and a sink that is down holds back only
//! the rows routed to it.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{DestinationTemplate, Message, RouteMatch, Sink};

use crate::breaker::{Breaker, CircuitState, Permit};
use crate::config::RelayConfig;
use crate::telemetry::LaneMetrics;

/// A routing rule with its sink, as `Relay::with_routes` takes it.
pub struct Route {
    /// Name for logs and `outbox status`.
    pub name: String,
    /// Which rows.
    pub when: RouteMatch,
    /// The sink that publishes them.
    pub sink: Arc<dyn Sink>,
    /// Their destination template; the relay's `destination` when `None`.
    pub destination: Option<DestinationTemplate>,
}

/// A route as the workers use it.
pub(crate) struct Lane {
    pub(crate) name: String,
    pub(crate) when: RouteMatch,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) breaker: Arc<Breaker>,
    pub(crate) destination: DestinationTemplate,
    /// Deadline of one `publish` call (see [`RelayConfig::publish_deadline`]).
    pub(crate) publish_deadline: Duration,
    /// Its metrics' handles, labelled with its sink and route.
    pub(crate) metrics: LaneMetrics,
}

impl Lane {
    pub(crate) fn new(route: Route, config: &RelayConfig) -> Self {
        let breaker = Arc::new(Breaker::new(route.sink.name(), config.breaker_threshold));
        Self {
            metrics: LaneMetrics::new(route.sink.name(), &route.name),
            publish_deadline: config.publish_deadline(route.sink.ack_timeout()),
            destination: route
                .destination
                .unwrap_or_else(|| config.destination.clone()),
            name: route.name,
            when: route.when,
            sink: route.sink,
            breaker,
        }
    }
}

/// Every lane of a relay, in rule order (the default sink, when there is one, last).
pub(crate) struct Lanes(pub(crate) Vec<Lane>);

impl Lanes {
    /// The lane serving `m`: the first whose rule matches.
    pub(crate) fn pick(&self, m: &Message) -> Option<usize> {
        self.0.iter().position(|l| l.when.matches(m))
    }

    /// Whether the relay has more than one lane (routing is on).
    pub(crate) fn routed(&self) -> bool {
        self.0.len() > 1
    }

    /// The circuit state `outbox status` shows for a member: the worst lane's, with that lane's
    /// last error, prefixed by its name when the relay routes.
    pub(crate) fn health(&self) -> (CircuitState, Option<String>) {
        let rank = |s: CircuitState| match s {
            CircuitState::Closed => 0,
            CircuitState::HalfOpen => 1,
            CircuitState::Open => 2,
        };
        let mut worst = (CircuitState::Closed, None);
        for lane in &self.0 {
            let (state, error) = lane.breaker.snapshot();
            if rank(state) > rank(worst.0) {
                let error = match (self.routed(), error) {
                    (true, Some(e)) => Some(outbox_core::flow::route_error(&lane.name, &e)),
                    (_, e) => e,
                };
                worst = (state, error);
            }
        }
        worst
    }

    /// Asks each lane's breaker whether to publish now.
    pub(crate) fn permits(&self) -> Vec<Permit> {
        self.0.iter().map(|l| l.breaker.permit()).collect()
    }
}
