//! What the SQS and SNS sinks share: URL options and the SDK's configuration, headers as
//! message attributes, batches of ten, and the classification of AWS errors.

pub(crate) mod attributes;
pub(crate) mod batch;
pub(crate) mod config;
pub(crate) mod error;

pub use config::{AwsConfig, SNS_OPTIONS, SQS_OPTIONS};
