//! [`TcpProxy`]: `outbox verify`'s proxy (`outbox_verify::proxy`) for the fault tests, with its
//! failures as panics, as test code wants them: put between a client and a server, it cuts
//! their connections, refuses new ones, or goes silent, without touching the server.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

/// A TCP proxy on 127.0.0.1 in front of `127.0.0.1:<upstream>` (see
/// [`outbox_verify::proxy::TcpProxy`] for what each fault looks like to a client).
pub struct TcpProxy(outbox_verify::proxy::TcpProxy);

impl TcpProxy {
    /// A proxy on a free port in front of `127.0.0.1:upstream`, open.
    pub fn start(upstream: u16) -> Self {
        Self(outbox_verify::proxy::TcpProxy::start(upstream).unwrap())
    }

    /// A proxy on `listener`'s port (one whose address was handed out before the proxy
    /// started, as a broker advertises it) in front of `127.0.0.1:upstream`, open.
    pub fn start_on(listener: std::net::TcpListener, upstream: u16) -> Self {
        Self(
            outbox_verify::proxy::TcpProxy::start_on(listener, format!("127.0.0.1:{upstream}"))
                .unwrap(),
        )
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.0.port()
    }

    /// Drops every connection through the proxy now.
    pub fn cut(&self) {
        self.0.cut()
    }

    /// Stops listening: new connections are refused. Returns once the port is closed.
    pub fn refuse(&self) {
        self.0.refuse().unwrap()
    }

    /// A crashed server: stops listening, then drops every connection.
    pub fn down(&self) {
        self.0.down().unwrap()
    }

    /// Holds every byte of every connection, old and new, until [`TcpProxy::open`].
    pub fn go_silent(&self) {
        self.0.go_silent()
    }

    /// Back to normal: listening on the same port, passing bytes. Returns once it listens.
    pub fn open(&self) {
        self.0.open().unwrap()
    }
}
