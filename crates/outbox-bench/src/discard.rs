//! The bench's discarding sink: acknowledges every message at once and keeps nothing, so a
//! drain into it measures the engine alone (claim, envelope, record) on this machine.
//!
//! It exists only inside `outbox bench`, never behind a relay URL: a relay that discards would
//! count messages published that no broker holds. Beside a real sink's drain in the same run it
//! says which side sets the pace: a sink that drains as fast as this is limited by the database
//! and the relay, not by its broker or its client.

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{Envelope, Sink, SinkError};

use crate::latency::Latency;

/// Acknowledges every envelope as it is handed over, recording each receipt in the run's
/// latency ledger (so the figures are commit→relay hand-over).
pub struct DiscardSink {
    latency: Arc<Latency>,
    orders_keys: bool,
}

impl DiscardSink {
    /// A sink recording its acknowledgements in `latency`, ordering keys itself as the sink it
    /// stands beside does (so the relay hands it batches shaped the same way: waves of one
    /// message per key, or whole runs of a key).
    pub fn new(latency: Arc<Latency>, orders_keys: bool) -> Self {
        Self {
            latency,
            orders_keys,
        }
    }
}

#[async_trait]
impl Sink for DiscardSink {
    fn name(&self) -> &str {
        "discard"
    }

    fn orders_keys(&self) -> bool {
        self.orders_keys
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        batch
            .iter()
            .map(|e| {
                self.latency.received(e.id);
                Ok(())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use uuid::Uuid;

    #[tokio::test]
    async fn every_message_is_acknowledged_and_its_receipt_recorded() {
        let probe = crate::latency::Probe::recorded_elsewhere();
        let latency = probe.latency();
        let batch: Vec<Envelope> = (0..3)
            .map(|i| Envelope {
                id: Uuid::now_v7(),
                destination: "bench.discarded".into(),
                key: format!("k{i}"),
                headers: Vec::new(),
                payload: Bytes::from_static(b"{}"),
                created_at: chrono::Utc::now(),
            })
            .collect();
        latency.committed(batch.iter().map(|e| e.id), latency.stamp());
        assert_eq!(latency.outstanding(), 3);
        let sink = DiscardSink::new(latency.clone(), false);
        let results = sink.publish(&batch).await;
        assert_eq!(results.len(), 3);
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(latency.outstanding(), 0, "every receipt matched its commit");
        assert_eq!(probe.finish().await.samples, 3);
    }
}
