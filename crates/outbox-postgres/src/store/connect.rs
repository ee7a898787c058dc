//! Connecting: the relay's session settings, the pool, and errors that say which server and why.

use super::*;

/// The store deadline [`connect_pool`] assumes: the relay's default (15 s).
pub const DEFAULT_STORE_DEADLINE: Duration = Duration::from_secs(15);

/// The server-side `statement_timeout` of the relay's sessions when the relay abandons a store
/// call after `store_deadline`: two thirds of it (at least 100 ms). Below the deadline on
/// purpose: dropping a call does not stop its statement on the server, and a record that kept
/// running past its caller's deadline could land after the record that retried it. The store
/// cancels the statements it abandons too; this bounds them even when the cancel is lost.
pub fn statement_timeout_for(store_deadline: Duration) -> Duration {
    (store_deadline * 2 / 3).max(Duration::from_millis(100))
}

/// Connection options for `url` set up for the relay (JIT off, lock timeout, and the
/// `statement_timeout` of the default store deadline). Errors never echo the password.
pub fn connect_options(url: &str) -> Result<PgConnectOptions> {
    connect_options_with(url, DEFAULT_STORE_DEADLINE)
}

/// [`connect_options`] for a relay that abandons store calls after `store_deadline`.
///
/// A URL naming several servers gives the first one's options: a pool follows the primary
/// among them ([`connect_pool_with`]), and anything else connects to the first.
pub fn connect_options_with(url: &str, store_deadline: Duration) -> Result<PgConnectOptions> {
    let servers = crate::servers::Servers::parse(url)?;
    let url = servers.first();
    let options: PgConnectOptions = url.parse().map_err(|e| {
        map_sqlx_error(
            &format!("parsing database URL {}", outbox_core::redact::url(url)),
            e,
        )
    })?;
    let timeout = format!("{}ms", statement_timeout_for(store_deadline).as_millis());
    Ok(options
        .options(SESSION_SETTINGS)
        .options([("statement_timeout", timeout.as_str())]))
}

/// Opens a pool to `url` with at most `max_connections`, every connection set up for the relay
/// (see [`connect_options`]). Errors never echo the password.
pub async fn connect_pool(url: &str, max_connections: u32) -> Result<PgPool> {
    connect_pool_with(url, max_connections, DEFAULT_STORE_DEADLINE).await
}

/// [`connect_pool`] for a relay that abandons store calls after `store_deadline`.
///
/// One connection is made first, on its own, so that a server that cannot be reached, a
/// database that does not exist or a refused login is reported at once, each with its cause
/// (see [`connect_error`]), rather than as the pool's "timed out" after ten seconds of retries.
pub async fn connect_pool_with(
    url: &str,
    max_connections: u32,
    store_deadline: Duration,
) -> Result<PgPool> {
    let servers = crate::servers::Servers::parse(url)?;
    if !servers.is_single() {
        return connect_followed(servers, max_connections, store_deadline).await;
    }
    let options = connect_options_with(url, store_deadline)?;
    match tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::ConnectOptions::connect(&options),
    )
    .await
    {
        Ok(Ok(conn)) => drop(sqlx::Connection::close(conn).await),
        Ok(Err(e)) => return Err(connect_error(&options, e)),
        Err(_) => {
            return Err(outbox_core::Error::new(
                outbox_core::ErrorKind::Timeout,
                format!(
                    "cannot reach PostgreSQL at {}: no answer within 10s (is the host right, \
                     and the port open?)",
                    server_of(&options)
                ),
            ))
        }
    }
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| {
            map_sqlx_error(
                &format!("connecting to {}", outbox_core::redact::url(url)),
                e,
            )
        })
}

/// A pool on a URL naming several servers or asking for a primary
/// (`target_session_attrs=read-write`): on the first server that will do, followed afterwards
/// (see [`crate::servers`]). With `read-write` every new connection is checked too, so none is
/// ever made to a standby.
pub(super) async fn connect_followed(
    servers: crate::servers::Servers,
    max_connections: u32,
    store_deadline: Duration,
) -> Result<PgPool> {
    let options = move |u: &str| connect_options_with(u, store_deadline);
    let (chosen, conn) = crate::servers::find(&servers, &options).await?;
    let read_write = servers.read_write();
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if read_write
                    && sqlx::query_scalar::<_, bool>(include_str!("../../queries/in_recovery.sql"))
                        .fetch_one(&mut *conn)
                        .await?
                {
                    return Err(sqlx::Error::Protocol(
                        "this server is a standby; the primary is being looked for".into(),
                    ));
                }
                Ok(())
            })
        })
        .connect_lazy_with(chosen);
    crate::servers::follow(pool.clone(), servers, Some(conn), options);
    Ok(pool)
}

/// `host:port` (or the socket directory) of `options`, for error texts.
pub(super) fn server_of(options: &PgConnectOptions) -> String {
    format!("{}:{}", options.get_host(), options.get_port())
}

/// The error of a first connection to PostgreSQL, its cause said once with what to do:
/// `cannot reach PostgreSQL at 127.0.0.1:1: connection refused (is the server running?)`,
/// `database "x" does not exist`, or PostgreSQL's own word on a refused login. Never the
/// password.
pub fn connect_error(options: &PgConnectOptions, e: sqlx::Error) -> outbox_core::Error {
    use outbox_core::{Error, ErrorKind};
    let server = server_of(options);
    match &e {
        sqlx::Error::Io(io) => {
            let why = match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    "connection refused (is the server running?)".to_string()
                }
                std::io::ErrorKind::TimedOut => {
                    "the connection timed out (is the host right, and the port open?)".to_string()
                }
                _ => io.to_string(),
            };
            Error::new(
                ErrorKind::Connection,
                format!("cannot reach PostgreSQL at {server}: {why}"),
            )
        }
        sqlx::Error::Database(db) if db.code().as_deref() == Some("3D000") => Error::new(
            ErrorKind::Config,
            format!(
                "database \"{}\" does not exist",
                options.get_database().unwrap_or_default()
            ),
        ),
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("28P01" | "28000")) => {
            Error::new(
                ErrorKind::Config,
                format!(
                    "PostgreSQL at {server} refused the login of user \"{}\": {}",
                    options.get_username(),
                    outbox_core::redact::sanitize(db.message())
                ),
            )
        }
        sqlx::Error::Tls(t) => Error::new(
            ErrorKind::Connection,
            format!("cannot reach PostgreSQL at {server}: TLS failed: {t}"),
        ),
        _ => map_sqlx_error(&format!("connecting to PostgreSQL at {server}"), e),
    }
}
