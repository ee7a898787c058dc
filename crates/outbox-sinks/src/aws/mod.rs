//! The SQS and SNS sink, one for both: [`AwsSink`] over a per-service client
//! ([`service::Service`], implemented in `sqs/` and `sns/`), with what both services share:
//! URL options and the SDK's configuration, headers as message attributes, batches of ten,
//! and the classification of AWS errors.

pub(crate) mod attributes;
pub(crate) mod batch;
pub(crate) mod config;
pub(crate) mod error;
pub(crate) mod service;
mod sink;

pub use config::{AwsConfig, SNS_OPTIONS, SQS_OPTIONS};
pub(crate) use sink::kind;
pub use sink::AwsSink;
