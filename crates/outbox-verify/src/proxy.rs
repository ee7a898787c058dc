//! [`TcpProxy`]: a TCP proxy put between clients and a server, to cut their connections, refuse
//! new ones, or go silent (a black-holed network: connections stay open, no RST, nothing flows),
//! without touching the server. `outbox verify`'s `network` fault runs one in front of the
//! database; the tests' fault cases use the same one (`outbox_testkit::proxy`). Its upstream can
//! be moved ([`TcpProxy::set_upstream`]): the `failover` fault on MySQL/MariaDB uses one as the
//! database's virtual IP, moved to the promoted replica.
//!
//! It runs on a thread and runtime of its own, so it keeps forwarding (or holding) whatever the
//! caller's runtime is busy with, and can be used from synchronous code.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Accepts connections and passes bytes both ways.
    Open,
    /// Does not listen: new connections are refused (connections already made still pass
    /// bytes until [`TcpProxy::cut`]).
    Refusing,
    /// Accepts connections and keeps them open, but holds every byte: a network partition, a
    /// frozen machine.
    Silent,
}

/// A TCP proxy on 127.0.0.1 in front of an upstream `host:port`.
///
/// - [`TcpProxy::down`] is a crashed server to its clients: every connection through it is
///   dropped with its requests in flight, and new ones are refused; [`TcpProxy::open`] brings
///   it back on the same port. The server itself keeps whatever it acknowledged.
/// - [`TcpProxy::go_silent`] is a frozen server or a black-holed network: connections stay
///   open, nothing flows either way, until [`TcpProxy::open`].
pub struct TcpProxy {
    port: u16,
    mode: watch::Sender<Mode>,
    upstream: watch::Sender<Arc<str>>,
    cuts: watch::Sender<u64>,
    listening: Arc<AtomicBool>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long a change of listening state may take before it is an error.
const SETTLE: Duration = Duration::from_secs(30);

impl TcpProxy {
    /// A proxy on a free port of 127.0.0.1 in front of `127.0.0.1:upstream`, open.
    pub fn start(upstream: u16) -> std::io::Result<Self> {
        Self::start_to(format!("127.0.0.1:{upstream}"))
    }

    /// A proxy on a free port of 127.0.0.1 in front of `upstream` (`host:port`), open.
    pub fn start_to(upstream: String) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        Self::start_on(listener, upstream)
    }

    /// A proxy on `listener`'s port (one whose address was handed out before the proxy started,
    /// as a broker advertises it) in front of `upstream` (`host:port`), open.
    pub fn start_on(listener: std::net::TcpListener, upstream: String) -> std::io::Result<Self> {
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (mode, mode_rx) = watch::channel(Mode::Open);
        let (upstream, upstream_rx) = watch::channel::<Arc<str>>(upstream.into());
        let (cuts, cuts_rx) = watch::channel(0u64);
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let listening = Arc::new(AtomicBool::new(true));
        let flag = listening.clone();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(first) = TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = serve(first, port, upstream_rx, mode_rx, cuts_rx, flag) => {}
                        _ = shutdown_rx => {}
                    }
                });
                // Dropping the runtime ends every connection task, closing its sockets.
            })?;
        Ok(Self {
            port,
            mode,
            upstream,
            cuts,
            listening,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Where new connections go from now on (`host:port`): a moved virtual IP. Connections
    /// already made stay with the server they reached (and die with it).
    pub fn set_upstream(&self, upstream: &str) {
        self.upstream.send_if_modified(|u| {
            let changed = **u != *upstream;
            if changed {
                *u = upstream.into();
            }
            changed
        });
    }

    /// Where new connections go now (`host:port`).
    pub fn upstream(&self) -> String {
        self.upstream.borrow().to_string()
    }

    /// Drops every connection through the proxy now.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Stops listening: new connections are refused. Returns once the port is closed.
    pub fn refuse(&self) -> std::io::Result<()> {
        self.mode.send_replace(Mode::Refusing);
        self.wait_listening(false)
    }

    /// A crashed server: stops listening, then drops every connection.
    pub fn down(&self) -> std::io::Result<()> {
        self.refuse()?;
        self.cut();
        Ok(())
    }

    /// Holds every byte of every connection, old and new, until [`TcpProxy::open`]: no RST, no
    /// FIN, what a black-holed network or a frozen server looks like to a client.
    pub fn go_silent(&self) {
        self.mode.send_replace(Mode::Silent);
    }

    /// Back to normal: listening on the same port, passing bytes. Returns once it listens.
    pub fn open(&self) -> std::io::Result<()> {
        self.mode.send_replace(Mode::Open);
        self.wait_listening(true)
    }

    fn wait_listening(&self, want: bool) -> std::io::Result<()> {
        let deadline = Instant::now() + SETTLE;
        while self.listening.load(Ordering::SeqCst) != want {
            if Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the proxy on port {} never got to listening = {want}",
                        self.port
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Accepts while open or silent; closes the port while refusing and binds it again after.
async fn serve(
    first: TcpListener,
    port: u16,
    upstream: watch::Receiver<Arc<str>>,
    mut mode: watch::Receiver<Mode>,
    cuts: watch::Receiver<u64>,
    listening: Arc<AtomicBool>,
) {
    let mut listener = Some(first);
    loop {
        let l = match listener.take() {
            Some(l) => l,
            None => match bind_again(port).await {
                Some(l) => l,
                None => return,
            },
        };
        listening.store(true, Ordering::SeqCst);
        loop {
            if *mode.borrow_and_update() == Mode::Refusing {
                break;
            }
            tokio::select! {
                accepted = l.accept() => {
                    let Ok((client, _)) = accepted else { continue };
                    // Read at each connection: the upstream may have moved.
                    let to = upstream.borrow().clone();
                    tokio::spawn(connection(client, to, mode.clone(), cuts.clone()));
                }
                changed = mode.changed() => if changed.is_err() { return },
            }
        }
        drop(l);
        listening.store(false, Ordering::SeqCst);
        while *mode.borrow_and_update() == Mode::Refusing {
            if mode.changed().await.is_err() {
                return;
            }
        }
    }
}

/// The port was ours a moment ago: binding it again may briefly find it busy. `None` after
/// [`SETTLE`] (the caller's `open` then reports it).
async fn bind_again(port: u16) -> Option<TcpListener> {
    let deadline = Instant::now() + SETTLE;
    while Instant::now() < deadline {
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)).await {
            return Some(l);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Forwards one connection until either side closes or the proxy cuts it.
async fn connection(
    client: TcpStream,
    upstream: Arc<str>,
    mode: watch::Receiver<Mode>,
    mut cuts: watch::Receiver<u64>,
) {
    cuts.borrow_and_update();
    // Accepted as the proxy stopped listening: refused after all.
    if *mode.borrow() == Mode::Refusing {
        return;
    }
    let Ok(server) = TcpStream::connect(&*upstream).await else {
        return;
    };
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    tokio::select! {
        _ = async {
            tokio::join!(
                pump(client_r, server_w, mode.clone()),
                pump(server_r, client_w, mode.clone()),
            )
        } => {}
        _ = cuts.changed() => {}
    }
}

/// Copies `from` to `to` until either closes; holds the bytes while the proxy is silent.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !flowing(&mut mode).await {
            break;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !flowing(&mut mode).await || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Waits while the proxy is silent; `false` when the proxy is gone.
async fn flowing(mode: &mut watch::Receiver<Mode>) -> bool {
    while *mode.borrow_and_update() == Mode::Silent {
        if mode.changed().await.is_err() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    use super::*;

    /// A server that answers every connection with its one-byte name, then echoes.
    fn named_server(name: u8) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let _ = s.write_all(&[name]);
                    let mut b = [0u8; 1];
                    while let Ok(1) = s.read(&mut b) {
                        let _ = s.write_all(&[name]);
                    }
                });
            }
        });
        port
    }

    fn ask(s: &mut TcpStream) -> u8 {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        b[0]
    }

    #[test]
    fn a_moved_upstream_takes_new_connections_and_leaves_old_ones_where_they_are() {
        let (a, b) = (named_server(b'a'), named_server(b'b'));
        let proxy = TcpProxy::start(a).unwrap();
        let mut old = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        assert_eq!(ask(&mut old), b'a');
        proxy.set_upstream(&format!("127.0.0.1:{b}"));
        assert_eq!(proxy.upstream(), format!("127.0.0.1:{b}"));
        let mut new = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        assert_eq!(
            ask(&mut new),
            b'b',
            "a new connection goes where the address moved"
        );
        old.write_all(b"?").unwrap();
        assert_eq!(
            ask(&mut old),
            b'a',
            "a connection made before stays with its server"
        );
    }
}
