//! SIGINT / SIGTERM handling: the first signal asks for a graceful stop, a second one exits.

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// A token cancelled on the first SIGINT or SIGTERM. A second signal exits at once with 130
/// (leases then expire on their own; nothing is lost, some messages may be published again).
pub fn on_signal() -> CancellationToken {
    on_signal_saying("shutdown requested: finishing the batch in hand, then releasing partitions")
}

/// [`on_signal`] that logs `said` at the first signal (what this command does as it stops).
pub fn on_signal_saying(said: &'static str) -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        wait_signal().await;
        info!("{said}");
        t.cancel();
        wait_signal().await;
        warn!("second signal: exiting now");
        std::process::exit(130);
    });
    token
}

async fn wait_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
