//! The inbox sources' fixtures for these tests: the testkit's (`outbox_testkit::source_fixtures`,
//! beside its sink fixtures), and the `outbox` binary the inbox tests start.

use std::process::Command;

pub use outbox_testkit::source_fixtures::*;

/// The `outbox` binary, with no configuration from the caller's environment.
pub fn outbox() -> Command {
    crate::common::outbox_command(&std::env::temp_dir())
}
