//! A message's journey: "where is my event?" answered from the store alone. [`Store::journey`]
//! finds messages by id or by key and lays out what the store knows of each, oldest first: the
//! write (transaction, time), parking with its attempts and error, every redrive with its
//! reason, and whether a position has passed it (the broker acknowledged it) or it still waits.
//!
//! [`Store::journey`]: crate::Store::journey

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Which messages [`crate::Store::journey`] looks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JourneyQuery {
    /// The message with this id.
    Id(uuid::Uuid),
    /// The latest messages of this ordering key (`aggregate_id`), newest first, and the key's
    /// head that holds the others back (retrying or failed) wherever it lies, so a long queue
    /// of waiting messages cannot hide it.
    Key(String),
}

/// Where a message is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JourneyState {
    /// Written and not yet handed out: no position has passed it.
    Pending,
    /// Parked after a failed attempt, waiting for its next one.
    Retrying,
    /// Parked behind an earlier message of its key that is retrying or failed.
    Waiting,
    /// Its budget is spent (or it is invalid): it waits for a redrive.
    Failed,
    /// The broker acknowledged it.
    Published,
}

impl JourneyState {
    /// The state's name as shown to people (`pending`, `retrying`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            JourneyState::Pending => "pending",
            JourneyState::Retrying => "retrying",
            JourneyState::Waiting => "waiting",
            JourneyState::Failed => "failed",
            JourneyState::Published => "published",
        }
    }
}

/// One message and what happened to it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Journey {
    /// Message id.
    pub id: uuid::Uuid,
    /// Store sequence.
    pub seq: i64,
    /// Relay partition (`None` for stores without partitions).
    pub partition: Option<i32>,
    /// Kind of aggregate.
    pub aggregate_type: String,
    /// Ordering key.
    pub aggregate_id: String,
    /// Event type.
    pub event_type: String,
    /// The row's topic column, if set.
    pub topic: Option<String>,
    /// Headers as stored (JSON object of strings).
    pub headers: serde_json::Value,
    /// Payload as stored.
    pub payload: serde_json::Value,
    /// Where it is now.
    pub state: JourneyState,
    /// What happened, oldest first.
    pub steps: Vec<JourneyStep>,
    /// For a message that waits behind an earlier one of its key: that key's head (retrying or
    /// failed), the message to fix or redrive.
    pub held_by: Option<uuid::Uuid>,
}

/// One step of a [`Journey`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JourneyStep {
    /// When it happened; `None` when the store cannot tell.
    pub at: Option<DateTime<Utc>>,
    /// What happened: `written`, `parked`, `failed`, `redriven`, `published` or `pending`.
    pub what: String,
    /// Its particulars, in a sentence (transaction id, attempts, error, reason, …).
    pub detail: String,
}

impl JourneyStep {
    /// A step at `at`.
    pub fn new(at: Option<DateTime<Utc>>, what: &str, detail: impl Into<String>) -> Self {
        Self {
            at,
            what: what.to_string(),
            detail: detail.into(),
        }
    }
}
