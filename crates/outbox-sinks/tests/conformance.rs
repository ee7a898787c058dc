//! The sink conformance suite (`outbox_testkit::sink_suite`) against every sink and its real
//! broker on this machine (`scripts/services.sh` starts them), one module per sink. Each case
//! gets a fresh SQLite store of its own (server-less: the cases are about the sink, and run in
//! parallel without sharing a database) and a scratch destination with a random suffix.
//!
//! A case is left out (`except`) only where it cannot apply, with the reason beside it.

use std::sync::Arc;

use outbox_core::Store;
use outbox_testkit::conformance::Fixture;
use outbox_testkit::sink_conformance_suite;
use outbox_testkit::sink_fixtures::{Mqtt, Nats, Redis, Stdout};

/// A migrated SQLite store in a directory of its own, removed after the case.
async fn sqlite() -> Fixture {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("sink_suite"));
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    let url = format!("sqlite://{}", dir.join("outbox.db").display());
    let pool = outbox_sqlite::connect_pool(&url)
        .await
        .expect("open the SQLite file");
    outbox_sqlite::migrate(&pool).await.expect("migrate");
    let store: Arc<dyn Store> = Arc::new(outbox_sqlite::SqliteStore::new(pool.clone()));
    Fixture {
        store,
        teardown: Box::pin(async move {
            pool.close().await;
            let _ = std::fs::remove_dir_all(&dir);
        }),
    }
}

// Every sink's suite, as its fixture's line in `outbox_testkit::sink_fixtures` lists it.
outbox_testkit::every_sink_conformance_suite!(sqlite);

/// The TLS listeners scripts/services.sh starts beside the shared brokers, with the test CA and
/// client certificate of scripts/tls-certs.sh (in `OUTBOX_TLS_DIR`, else /var/tmp/outbox-tls),
/// and the brokers' own authentication: the same cases over TLS with credentials.
fn tls_url(url: &str) -> String {
    let d = std::env::var("OUTBOX_TLS_DIR").unwrap_or_else(|_| "/var/tmp/outbox-tls".into());
    url.replace("{d}", &d)
}

/// NATS on 4223: TLS with a client certificate, user `relay` with its password from a file.
fn nats_tls() -> Nats {
    Nats::at(tls_url(
        "nats://relay@localhost:4223?tls_ca={d}/ca.pem&tls_cert={d}/client.pem\
         &tls_key={d}/client.key&password_file={d}/nats.pass",
    ))
}

/// NATS on 4224: TLS, an operator/account/user JWT setup, the user's credentials file.
fn nats_jwt() -> Nats {
    Nats::at(tls_url(
        "tls://localhost:4224?tls_ca={d}/ca.pem&creds_file={d}/nats/user.creds",
    ))
}

/// Redis on 6380: `rediss://`, a client certificate, ACL user `relay` with its password from a
/// file (the default user is off).
fn redis_tls() -> Redis {
    Redis::at(tls_url(
        "rediss://relay@localhost:6380?tls_ca={d}/ca.pem&tls_cert={d}/client.pem\
         &tls_key={d}/client.key&password_file={d}/redis.pass",
    ))
}

/// Mosquitto on 8883: `mqtts://`, a client certificate required (its CN is the user name).
fn mqtt_tls() -> Mqtt {
    Mqtt::at(tls_url(
        "mqtts://localhost:8883?tls_ca={d}/ca.pem&tls_cert={d}/client.pem&tls_key={d}/client.key",
    ))
}

// Over TLS, the cases that exercise the connection: round trip, order, the size limit and (for
// NATS and Redis) a refusal. The outage cases stop a private broker of the case's own; TLS does
// not change what the sink does when its broker goes away, and the plaintext modules above run
// them on the same sink code.
sink_conformance_suite!(nats_tls, nats_tls, sqlite;
    except [broker_down_mid_stream_with_messages_in_flight, deadline]);
sink_conformance_suite!(nats_jwt, nats_jwt, sqlite;
    except [broker_down_mid_stream_with_messages_in_flight, deadline]);
sink_conformance_suite!(redis_tls, redis_tls, sqlite;
    // The refusal (WRONGTYPE) is set up by a plaintext client of the shared Redis.
    except [rejection_does_not_open_the_circuit,
            broker_down_mid_stream_with_messages_in_flight, deadline]);
sink_conformance_suite!(mqtt_tls, mqtt_tls, sqlite;
    // The refusal needs a broker with an ACL: a private plaintext one, as in `mqtt`.
    except [rejection_does_not_open_the_circuit,
            broker_down_mid_stream_with_messages_in_flight, deadline]);

/// The `stdout` module's sink runs in a child process (this test binary, on this test), so
/// its standard output can be read back.
#[test]
#[ignore = "the stdout sink's child process: started by the stdout module's fixture"]
fn stdout_sink_process() {
    outbox_testkit::stdout_process::child_main();
}

fn stdout() -> Stdout {
    Stdout::new("stdout_sink_process")
}

sink_conformance_suite!(stdout, stdout, sqlite;
    // Standard output has no size limit, refuses nothing, and has no broker to stop (a pipe
    // closed for good does not come back); frozen, it is a pipe nobody reads (`deadline`).
    except [oversized_message_fails_at_once, rejection_does_not_open_the_circuit,
            broker_down_mid_stream_with_messages_in_flight]);
