//! [`TcpProxy`]: a TCP proxy put between clients and a server, to cut their connections, refuse
//! new ones, or go silent (a black-holed network: connections stay open, no RST, nothing flows),
//! without touching the server. `outbox verify`'s `network` fault runs one in front of the
//! database; the tests' fault cases use the same one (`outbox_testkit::proxy`).
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
                    let upstream: Arc<str> = upstream.into();
                    tokio::select! {
                        _ = serve(first, port, upstream, mode_rx, cuts_rx, flag) => {}
                        _ = shutdown_rx => {}
                    }
                });
                // Dropping the runtime ends every connection task, closing its sockets.
            })?;
        Ok(Self {
            port,
            mode,
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
    upstream: Arc<str>,
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
                    tokio::spawn(connection(client, upstream.clone(), mode.clone(), cuts.clone()));
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
