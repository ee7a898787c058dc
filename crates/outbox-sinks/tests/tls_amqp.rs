//! `amqps://` with a client certificate and the EXTERNAL mechanism, against a RabbitMQ node of
//! the test's own (the shared node has no TLS listener, and adding one would restart it): TLS
//! only, `fail_if_no_peer_cert`, and the certificate's common name (`outbox_cert`, from
//! scripts/tls-certs.sh) as the user, as production runs RabbitMQ with
//! `rabbitmq_auth_mechanism_ssl`.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

use outbox_sinks::read::{read_until, scratch, ScratchOptions};
use outbox_testkit::process::{PrivateServer, StopWith};

fn tls_dir() -> String {
    std::env::var("OUTBOX_TLS_DIR").unwrap_or_else(|_| "/var/tmp/outbox-tls".into())
}

/// A RabbitMQ node listening with TLS only, on the port the server is reached at.
fn rabbitmq_tls() -> PrivateServer {
    let d = tls_dir();
    PrivateServer::new(
        "rabbitmq-server-tls",
        "amqps://localhost:{port}/%2f",
        move |port, dir| {
            std::fs::write(
                dir.join("rabbitmq.conf"),
                format!(
                    "listeners.tcp = none\n\
                     listeners.ssl.default = {port}\n\
                     ssl_options.cacertfile = {d}/ca.pem\n\
                     ssl_options.certfile = {d}/server.pem\n\
                     ssl_options.keyfile = {d}/server.key\n\
                     ssl_options.verify = verify_peer\n\
                     ssl_options.fail_if_no_peer_cert = true\n\
                     auth_mechanisms.1 = EXTERNAL\n\
                     ssl_cert_login_from = common_name\n\
                     load_definitions = {}\n",
                    dir.join("definitions.json").display()
                ),
            )
            .unwrap();
            std::fs::write(
                dir.join("definitions.json"),
                r#"{"users":[{"name":"outbox_cert","password_hash":"","tags":""}],
                    "vhosts":[{"name":"/"}],
                    "permissions":[{"user":"outbox_cert","vhost":"/","configure":".*","write":".*","read":".*"}]}"#,
            )
            .unwrap();
            std::fs::write(
                dir.join("enabled_plugins"),
                "[rabbitmq_auth_mechanism_ssl].\n",
            )
            .unwrap();
            let mut c = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server");
            c.current_dir(dir)
                .env("HOME", dir)
                .env("RABBITMQ_NODENAME", format!("outbox_tls_{port}@localhost"))
                .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
                .env(
                    "RABBITMQ_DIST_PORT",
                    outbox_testkit::process::free_port().to_string(),
                )
                .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
                .env("RABBITMQ_LOG_BASE", dir.join("log"))
                .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
                .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq"))
                .env("RABBITMQ_PID_FILE", dir.join("pid"));
            c
        },
    )
    .stop_with(StopWith::Term)
    .pid_file("pid")
    .start_limit(Duration::from_secs(90))
    .started()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_client_certificate_and_external() {
    let server = tokio::task::block_in_place(rabbitmq_tls);
    let d = tls_dir();
    let url = format!(
        "{}?tls_ca={d}/ca.pem&tls_cert={d}/client.pem&tls_key={d}/client.key\
         &auth_mechanism=external",
        server.url()
    );
    let mut s = scratch(&url, &ScratchOptions::new("amqps"))
        .await
        .unwrap_or_else(|e| panic!("a queue on {url}: {e}"));
    let sink = outbox_sinks::connect(&s.sink_url).await.unwrap();
    let id = uuid::Uuid::now_v7();
    let e = outbox_core::Envelope {
        id,
        destination: s.destination.replace("{event_type}", "placed"),
        key: "k".into(),
        headers: vec![("outbox-message-id".into(), id.to_string())],
        payload: bytes::Bytes::from_static(b"{\"n\":1}"),
        created_at: chrono::Utc::now(),
    };
    let got = outbox_core::Sink::publish(&sink, std::slice::from_ref(&e)).await;
    assert!(got[0].is_ok(), "{got:?}");
    let read = read_until(s.reader.as_mut(), Duration::from_secs(10), |d| {
        !d.is_empty()
    })
    .await;
    assert_eq!(read.delivered.first().map(|d| d.id), Some(id));
    // Without the client certificate the broker refuses the handshake: one error naming the
    // server and the cause.
    let e =
        outbox_sinks::amqp::AmqpConfig::from_url(&format!("{}?tls_ca={d}/ca.pem", server.url()))
            .unwrap();
    let refused = outbox_sinks::amqp::connect(&e, "outbox test", Duration::from_secs(10))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(refused.contains("localhost"), "{refused}");
}
